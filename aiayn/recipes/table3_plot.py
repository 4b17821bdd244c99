"""The Table 3 study's plots (matplotlib, headless), drawn from what results.json holds
(table3_report): each row's difference from the base beside the paper's, and the dev curves.

matplotlib is imported when a plot is drawn (`_pyplot`): importing it takes about a second, which
whoever imports the study's report without drawing (its tests, a report of no rows) need not pay."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aiayn.files import atomic_write

# One colour per group of Table 3 rows (the letter before the row's variant).
GROUP_COLOURS = {"b": "black", "A": "tab:blue", "B": "tab:orange", "C": "tab:green",
                 "D": "tab:red", "E": "tab:purple"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(r: dict[str, Any]) -> str:
    return r["row"] if r["seed"] == 1 else f"{r['row']} (seed {r['seed']})"


def plot_differences(doc: dict[str, Any], path: Path) -> None:
    """Two panels, one line per run (paper order, top to bottom): dev perplexity change relative
    to the base row (%, ours filled, the paper's hollow) and dev BLEU difference (points), with the
    base row's noise band shaded."""
    plt = _pyplot()
    rows = doc["rows"]
    base = next((r for r in rows if r["row"] == "base" and r["seed"] == 1), None)
    if base is None:
        return
    others = [r for r in rows if r is not base]
    ys = list(range(len(others)))[::-1]
    fig, (ax_p, ax_b) = plt.subplots(1, 2, figsize=(11, 0.36 * len(others) + 1.8), sharey=True)
    nz = doc["noise"]
    for ax, key, threshold, scale in (
            (ax_p, "ppl", nz["ppl_threshold"], 100 / base["dev_ppl"]),
            (ax_b, "bleu", nz["bleu_threshold"], 1.0)):
        if threshold is not None:
            ax.axvspan(-threshold * scale, threshold * scale, color="0.88", zorder=0,
                       label="noise (2·√2·σ of the base seeds)")
        ax.axvline(0, color="0.5", lw=0.8)
        for y, r in zip(ys, others):
            colour = GROUP_COLOURS.get(r["row"][0], "black")
            if key == "ppl":
                ours = 100 * (r["dev_ppl"] / base["dev_ppl"] - 1)
                paper = 100 * (r["paper_ppl"] / base["paper_ppl"] - 1)
            else:
                ours, paper = r["dev_bleu"] - base["dev_bleu"], r["paper_bleu"] - base["paper_bleu"]
            ax.plot([ours], [y], "o", color=colour, ms=7)
            if r["seed"] == 1:
                ax.plot([paper], [y], "o", mfc="none", mec=colour, ms=9, mew=1.5)
        ax.grid(axis="x", alpha=0.3)
    ax_p.set_xlabel("dev perplexity vs base (%; lower is better)")
    ax_b.set_xlabel("dev BLEU vs base (higher is better)")
    ax_p.set_yticks(ys, [_label(r) for r in others])
    ax_p.plot([], [], "o", color="0.3", label="this study")
    ax_p.plot([], [], "o", mfc="none", mec="0.3", label="paper (Table 3)")
    ax_p.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Table 3 at CPU scale: {doc['updates']} updates per row "
                 f"(base: dev PPL {base['dev_ppl']:.2f}, BLEU {base['dev_bleu']:.2f}; "
                 f"paper: {base['paper_ppl']:.2f}, {base['paper_bleu']:.1f})", fontsize=10)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def spread(values: list[float], gap: float) -> list[float]:
    """Label positions for `values`: in the same order, at least `gap` apart, each cluster of
    labels centred on the values it stands for (so that 21 line ends stay readable)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    groups: list[list[int]] = []  # runs of labels that touch, each [first index in order, count]
    for k, i in enumerate(order):
        groups.append([k, 1])
        while len(groups) > 1:  # merge while the last cluster overlaps the one below
            (a, na), (b, nb) = groups[-2], groups[-1]
            lo_a = _centre(values, order, a, na) - gap * (na - 1) / 2
            lo_b = _centre(values, order, b, nb) - gap * (nb - 1) / 2
            if lo_b - (lo_a + gap * (na - 1)) >= gap:
                break
            groups[-2:] = [[a, na + nb]]
    out = [0.0] * len(values)
    for a, n in groups:
        lo = _centre(values, order, a, n) - gap * (n - 1) / 2
        for j in range(n):
            out[order[a + j]] = lo + gap * j
    return out


def _centre(values: list[float], order: list[int], a: int, n: int) -> float:
    return sum(values[order[a + j]] for j in range(n)) / n


def plot_curves(doc: dict[str, Any], path: Path) -> None:
    """Dev perplexity by update, one line per run, coloured by Table 3 group."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.set_yscale("log")  # before the labels: their spacing is measured on this axis
    ends = []  # (last step, last perplexity, label, colour) per run
    for r in doc["rows"]:
        pts = [(c["step"], c["dev_ppl"]) for c in r["curve"]]
        if not pts:
            continue
        xs, ys = zip(*pts)
        colour = GROUP_COLOURS.get(r["row"][0], "black")
        ax.plot(xs, ys, "-", color=colour, lw=2 if r["row"] == "base" else 0.9,
                alpha=1.0 if r["row"] == "base" else 0.7)
        ends.append((xs[-1], ys[-1], _label(r), colour))
    if ends:
        # labels spread apart on the log axis (one line of text each), joined to their ends
        y0, y1 = (math.log10(v) for v in ax.get_ylim())
        axes_inches = ax.get_position().height * fig.get_figheight()
        line = (y1 - y0) * (7.5 / 72) / axes_inches  # one 7.5-point line, in decades
        places = spread([math.log10(e[1]) for e in ends], gap=line)
        x_end = max(e[0] for e in ends)
        for (x, y, label, colour), place in zip(ends, places):
            ax.annotate(label, (x, y), xytext=(x_end * 1.06, 10 ** place), textcoords="data",
                        fontsize=6, color=colour, va="center",
                        arrowprops={"arrowstyle": "-", "color": colour, "lw": 0.4, "alpha": 0.6})
        ax.set_xlim(right=x_end * 1.22)
    for group, colour in GROUP_COLOURS.items():
        ax.plot([], [], color=colour, label="base" if group == "b" else f"({group})")
    ax.set_xlabel("update")
    ax.set_ylabel("dev perplexity per subword token")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Table 3 study: dev perplexity by update", fontsize=10)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
