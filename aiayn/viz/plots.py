"""The paper's other pictures: sinusoidal positional encodings (§3.5), the learning-rate schedule
(§5.3, Eq. 3), a run's training curves, and the Table 3 study. Each function returns a
`matplotlib.figure.Figure` (no pyplot: headless); `aiayn.viz.figures.save_figure` writes it.

The model's sinusoids and the schedule's formula are imported (with torch) only by the figures
that draw them: `aiayn plot curves` and `aiayn plot study` start without torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from aiayn.viz.records import RunCurves, StudyRow


def positions_figure(d_model: int = 512, n_positions: int = 100,
                     dims: Sequence[int] = (20, 100, 200, 300)) -> Figure:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...). Left, the
    table (positions by dimensions); right, a few dimensions as curves over positions."""
    from aiayn.model.embedding import sinusoidal_table

    pe = sinusoidal_table(n_positions, d_model).numpy()  # (P, d_model)
    fig = Figure(figsize=(12, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1.25, 1])
    image = left.imshow(pe, cmap="RdBu", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    left.set_xlabel("dimension")
    left.set_ylabel("position")
    left.set_title(f"PE table, {n_positions} positions x {d_model} dimensions")
    fig.colorbar(image, ax=left, label="value")
    for d in dims:
        kind = "sin" if d % 2 == 0 else "cos"
        right.plot(np.arange(n_positions), pe[:, d], label=f"dim {d} ({kind}, wavelength "
                   f"{2 * np.pi * 10000 ** ((d - d % 2) / d_model):.3g})")
    right.set_xlabel("position")
    right.set_ylabel("PE(pos, dim)")
    right.set_title("single dimensions: one sinusoid each")
    right.legend(fontsize=8, loc="lower left")
    right.grid(alpha=0.3)
    fig.suptitle("Sinusoidal positional encodings (§3.5)")
    return fig


def schedule_figure(settings: Sequence[tuple[int, int]], steps: int = 40000,
                    scale: float = 1.0) -> Figure:
    """Eq. 3, lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for each (d_model,
    warmup_steps) pair, over `steps` updates; each peak (at step = warmup) marked."""
    from aiayn.training.schedule import learning_rate

    x = np.unique(np.linspace(1, steps, 2000).astype(int))
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.subplots()
    for d_model, warmup in settings:
        y = [learning_rate(int(s), d_model, warmup, scale) for s in x]
        line, = ax.plot(x, y, label=f"d_model={d_model}, warmup={warmup}")
        if warmup <= steps:
            peak = learning_rate(warmup, d_model, warmup, scale)
            ax.plot([warmup], [peak], "o", color=line.get_color(), ms=4)
    ax.set_xlabel("update (step)")
    ax.set_ylabel("learning rate")
    title = "Learning-rate schedule (§5.3, Eq. 3)" + (f", x{scale:g}" if scale != 1 else "")
    ax.set_title(title)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, -3))
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _time_axis(seconds: np.ndarray) -> tuple[np.ndarray, str]:
    finite = seconds[np.isfinite(seconds)]
    if finite.size and finite.max() >= 3 * 3600:
        return seconds / 3600, "wall time (hours)"
    return seconds / 60, "wall time (minutes)"


def curves_figure(c: RunCurves, title: str = "Training curves") -> Figure:
    """Training loss, dev perplexity and dev BLEU (columns) against updates (top row) and
    against wall time (bottom row); each row shares its x axis, so dev points sit where they
    fell in the run."""
    fig = Figure(figsize=(13, 7), layout="constrained")
    axes = fig.subplots(2, 3, sharex="row")
    train_t, t_label = _time_axis(c.train_seconds)
    dev_t, _ = _time_axis(c.dev_seconds)
    panels = [("training loss (label-smoothed)", c.train_loss, c.train_step, train_t, "-"),
              ("dev perplexity", c.dev_ppl, c.dev_step, dev_t, "o-"),
              ("dev BLEU", c.dev_bleu, c.dev_step, dev_t, "o-")]
    for col, (name, y, steps, times, style) in enumerate(panels):
        for row, (x, x_label) in enumerate([(steps, "update (step)"), (times, t_label)]):
            ax = axes[row, col]
            ok = np.isfinite(y) & np.isfinite(x)
            if ok.any():
                ax.plot(x[ok], y[ok], style, ms=3)
            else:
                ax.text(0.5, 0.5, f"no {name} recorded", ha="center", va="center",
                        transform=ax.transAxes, color="grey")
            if name == "dev perplexity" and ok.any() and y[ok].max() / max(y[ok].min(), 1e-9) > 20:
                ax.set_yscale("log")
            ax.set_xlabel(x_label)
            ax.set_ylabel(name)
            ax.set_title(f"{name} against {x_label.split(' (')[0]}", fontsize=10)
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


def study_figure(rows: Sequence[StudyRow], title: str = "Model variations (Table 3)") -> Figure:
    """Dev perplexity and dev BLEU of each variant as horizontal bars, in file order, each
    labelled with its parameter count."""
    n = len(rows)
    fig = Figure(figsize=(11, max(3.0, 0.32 * n + 1.6)), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    y = np.arange(n)
    labels = [f"{r.name}  ({r.params / 1e6:.1f}M)" if np.isfinite(r.params) else r.name
              for r in rows]
    for ax, (field, name) in zip(axes, [("ppl", "dev perplexity (lower is better)"),
                                         ("bleu", "dev BLEU (higher is better)")]):
        values = np.array([getattr(r, field) for r in rows], dtype=np.float64)
        ok = np.isfinite(values)
        ax.barh(y[ok], values[ok], color="tab:blue" if field == "ppl" else "tab:green")
        for yi, v in zip(y[ok], values[ok]):
            ax.text(v, yi, f" {v:.2f}", va="center", fontsize=8)
        if ok.any():
            ax.set_xlim(0, values[ok].max() * 1.15)
        ax.set_xlabel(name)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels, fontsize=9)
    axes[0].invert_yaxis()
    axes[0].set_ylabel("variant (parameters)")
    fig.suptitle(title)
    return fig
