"""Attention drawn with matplotlib: heatmaps with the subword pieces as tick labels, and the
paper's appendix style (Figures 3-5: the tokens in two columns, a line from each query to each
key weighted by attention, one colour per head).

Figures are built with `matplotlib.figure.Figure` directly, never pyplot, so nothing needs a
display or a global backend (the image is rendered by Agg, or the SVG/PDF writer, on save).
Sizes grow with the number of pieces so that every tick label stays readable, a 50-piece
sentence included.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from aiayn.decoding.alignment import SentenceAlignment
from aiayn.errors import UserError
from aiayn.files import atomic_write

LABEL_PT = 8  # tick-label font size
INCH_PER_PIECE = 0.15  # 8-point labels need about 0.13 inch each
FORMATS = ("png", "svg", "pdf")


def head_colours(n: int) -> list[tuple[float, float, float, float]]:
    """One distinct colour per head (matplotlib's qualitative tables, then evenly spaced hues)."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [colormaps["tab20"](i) for i in range(n)]
    return [colormaps["hsv"](i / n) for i in range(n)]


def heatmap_figure(weights: np.ndarray, rows: Sequence[str], cols: Sequence[str], title: str,
                   panel_titles: Sequence[str], row_axis: str, col_axis: str) -> Figure:
    """One heatmap per panel. weights: (P, Q, K), P panels (heads) of Q queries by K keys;
    rows (Q) and cols (K) label every cell. One colour scale for all panels, 0 to the largest
    weight shown, with a colour bar."""
    p, q, k = weights.shape
    ncol = min(p, 4)
    nrow = math.ceil(p / ncol)
    panel_w = max(2.6, INCH_PER_PIECE * k + 0.9)  # + room for the y tick labels
    panel_h = max(2.4, INCH_PER_PIECE * q + 0.9)  # + room for the x tick labels
    fig = Figure(figsize=(ncol * panel_w + 1.0, nrow * panel_h + 0.7), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False)).ravel()
    vmax = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
    image = None
    for i, ax in enumerate(axes):
        if i >= p:
            ax.set_visible(False)
            continue
        image = ax.imshow(weights[i], cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(k), list(cols), rotation=90, fontsize=LABEL_PT)
        ax.set_yticks(range(q), list(rows), fontsize=LABEL_PT)
        ax.set_title(panel_titles[i], fontsize=10)
        ax.set_xlabel(col_axis, fontsize=9)
        ax.set_ylabel(row_axis, fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=list(axes[:p]), shrink=0.6, label="attention weight")
    fig.suptitle(title, fontsize=11)
    return fig


def lines_figure(weights: np.ndarray, left: Sequence[str], right: Sequence[str], title: str,
                 head_labels: Sequence[str], left_axis: str, right_axis: str,
                 threshold: float = 0.02) -> Figure:
    """The appendix style: queries `left`, keys `right`; for every head (weights (H, Q, K)) a
    line from query i to key j with opacity and width growing with weight[i, j], one colour per
    head. Weights under `threshold` are left out (they would only grey the picture)."""
    h, q, k = weights.shape
    n = max(q, k, 1)
    fig = Figure(figsize=(6.5, max(3.0, 0.22 * n + 1.5)), layout="constrained")
    ax = fig.subplots()
    y_left = -np.arange(q) * (n - 1) / max(q - 1, 1)
    y_right = -np.arange(k) * (n - 1) / max(k - 1, 1)
    colours = head_colours(h)
    spread = 0.5 / max(h, 1)  # heads fan out a little, so that equal lines do not hide
    for head in range(h):
        i, j = np.nonzero(weights[head] >= threshold)
        w = weights[head][i, j]
        dy = (head - (h - 1) / 2) * spread
        segments = np.stack([np.stack([np.zeros_like(w), y_left[i] + dy], 1),
                             np.stack([np.ones_like(w), y_right[j] + dy], 1)], 1)  # (n, 2, 2)
        rgba = np.array([to_rgba(colours[head], alpha=float(a)) for a in np.clip(w, 0, 1)])
        ax.add_collection(LineCollection(segments, colors=rgba.reshape(-1, 4),
                                         linewidths=0.5 + 2.5 * w))
    for y, s in zip(y_left, left):
        ax.text(-0.03, y, s, ha="right", va="center", fontsize=LABEL_PT + 1)
    for y, s in zip(y_right, right):
        ax.text(1.03, y, s, ha="left", va="center", fontsize=LABEL_PT + 1)
    ax.set_xlim(-0.45, 1.45)
    ax.set_ylim(-(n - 1) - 0.8, 0.8)
    ax.set_xticks([0, 1], [left_axis, right_axis], fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks([])
    for side in ("left", "right", "bottom", "top"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("line opacity and width: attention weight", fontsize=9)
    ax.set_title(title, fontsize=11)
    if h > 1:
        ax.legend(handles=[Patch(color=c, label=s) for c, s in zip(colours, head_labels)],
                  loc="upper center", bbox_to_anchor=(0.5, -0.04), ncol=min(h, 8), fontsize=8,
                  frameon=False)
    return fig


def alignment_figure(a: SentenceAlignment) -> Figure:
    """The encoder-decoder attention behind one `Translator.align` result as a heatmap (output
    pieces by source pieces), hard-alignment links outlined at the piece level."""
    head = "mean of heads" if a.head is None else f"head {a.head + 1}"
    fig = heatmap_figure(a.attention[None], a.tgt_pieces, a.src_pieces,
                         f"encoder-decoder attention, layer {a.layer + 1}, {head}", [a.translation],
                         "output piece (query)", "source piece (key)")
    ax = fig.axes[0]
    for i, j in a.piece_links():
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.2))
    return fig


def figure_bytes(fig: Figure, fmt: str = "png", dpi: int = 110) -> bytes:
    """The figure encoded in memory (png, svg or pdf), e.g. for an HTTP response."""
    if fmt not in FORMATS:
        raise UserError(f"cannot encode a figure as {fmt!r}; use one of {', '.join(FORMATS)}")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    return buf.getvalue()


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Write `fig` atomically in the format its suffix names (png, svg or pdf)."""
    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UserError(f"{p}: cannot write a figure as {fmt or 'a file without a suffix'}; "
                        f"use one of .{', .'.join(FORMATS)}")
    with atomic_write(p, "wb", encoding=None) as f:
        fig.savefig(f, format=fmt, dpi=dpi)
    return p


def save_all(fig: Figure, paths: Sequence[str | os.PathLike], dpi: int = 110) -> list[Path]:
    """`save_figure` to each path; the layout is computed once, for the first (laying out a
    figure of many labelled panels costs more than drawing it)."""
    out = []
    for i, path in enumerate(paths):
        out.append(save_figure(fig, path, dpi))
        if i == 0:
            fig.set_layout_engine("none")  # keep the positions the first save computed
    return out

