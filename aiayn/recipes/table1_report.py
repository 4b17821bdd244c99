"""The Table 1 report, complexity.md and its .png (docs/experiments/complexity.md is one), from
table1.py's measurements: log-log slopes, crossovers, tables and the plot. Pure functions of the
saved JSON."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from aiayn.files import atomic_write

RESULT_NAME = "complexity.json"  # table1.RESULT_FILE, which writes it
PATH_FIT_FROM = 256  # path-length slopes over n >= this (r = 128 needs n >> r to be in its regime)


def slope(ns: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y against log n."""
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])


def crossovers(ns: list[float], a: list[float], b: list[float]) -> list[tuple[float, str]]:
    """Where curve a crosses curve b: (n, "a<b" or "a>b" after the crossing), interpolated
    linearly in log n and log(a/b) between the measured points around each sign change."""
    out = []
    r = [math.log(x / y) for x, y in zip(a, b)]
    for i in range(1, len(ns)):
        if (r[i - 1] < 0) != (r[i] < 0):
            f = r[i - 1] / (r[i - 1] - r[i])
            n = math.exp(math.log(ns[i - 1]) + f * (math.log(ns[i]) - math.log(ns[i - 1])))
            out.append((n, "a<b" if r[i] < 0 else "a>b"))
    return out


def fitted(row: dict, key: str, n_from: int) -> float:
    pts = [p for p in row["points"] if p["n"] >= n_from]
    if key == "time":
        return slope([p["n"] for p in pts], [p["fwd_s"] + p["bwd_s"] for p in pts])
    return slope([p["n"] for p in pts], [p[key] for p in pts])


def series(row: dict, key: str) -> list[float]:
    if key == "time":
        return [p["fwd_s"] + p["bwd_s"] for p in row["points"]]
    return [p[key] for p in row["points"]]


def _crossing_text(result: dict, a: str, b: str, key: str) -> str:
    """Where `a` becomes cheaper or dearer than `b` for good: the last crossing of the measured
    curves, and any earlier ones (at small n, where a layer takes a few milliseconds and per-call
    overheads, not the orders of Table 1, decide)."""
    rows = result["rows"]
    ns = [p["n"] for p in rows[a]["points"]]
    va, vb = series(rows[a], key), series(rows[b], key)
    xs = crossovers(ns, va, vb)
    what = "time (forward + backward)" if key == "time" else "FLOPs"
    if not xs:
        side = "less" if va[0] < vb[0] else "more"
        return f"- {what}: {a} costs {side} than {b} at every n from {ns[0]} to {ns[-1]}."
    n_last, direction = xs[-1]
    first_after = next(n for n in ns if n > n_last)
    text = (f"- {what}: {a} is {'cheaper' if direction == 'a<b' else 'dearer'} than {b} at every "
            f"measured n >= {first_after:,} (the curves cross at n ≈ {n_last:,.0f})")
    if len(xs) > 1:
        text += "; they also crossed at n ≈ " + ", ".join(f"{n:,.0f}" for n, _ in xs[:-1])
    return text + "."


def _fmt(x: float) -> str:
    return f"{x:,.3g}" if x < 1000 else f"{x:,.0f}"


def markdown(result: dict, png_name: str) -> str:
    s, rows, st = result["settings"], result["rows"], result["structure"]
    ns = [p["n"] for p in next(iter(rows.values()))["points"]]
    fit = s["fit_from"]
    r_small, r_large = s["r"]
    sa, gru = "self-attention", "recurrent (GRU)"
    out = [
        "# Table 1, measured: why self-attention",
        "",
        "The paper's Table 1 gives each layer kind's cost per layer, the operations that must run one "
        "after another, and the longest path a signal travels between two positions. Here each is "
        f"measured on this machine at d = {s['d']} ({s['heads']} heads), batch {s['batch']}, fp32, "
        f"for n = {ns[0]} to {ns[-1]}; slopes are least-squares fits of log cost against log n "
        f"over n >= {fit}. Restricted self-attention is aiayn's banded kernel "
        "(`aiayn.model.banded`: only each query's window of 2r + 1 keys is computed); "
        f"\"restricted r={r_small}, dense masked\" is the same result computed by masking the "
        "dense n x n scores, as aiayn did before. \"(core)\" rows are the attention operation alone "
        "(Table 1's count); the others are whole layers with their projections.",
        "",
        f"Machine: {result['machine']}. Measured {result['date']}"
        + (f" at commit {result['commit']}." if result.get("commit") else "."),
        "",
        "Reproduce (about five minutes; run it alone, nothing else on the machine):",
        "",
        "    aiayn study table1 --out runs/table1",
        "",
        f"The figures are in [{RESULT_NAME}]({RESULT_NAME}) beside this page; `aiayn study table1 "
        "--out DIR --report-only` redraws the page and its picture from them.",
        "",
        f"![time, FLOPs and path length against n]({png_name})",
        "",
        "## Table 1 beside the measurement",
        "",
        "| layer | Table 1 | FLOPs slope | time slope | forward slope | saved-memory slope | "
        f"sequential ops (n = {st[sa]['n'][-1]}) | max path length, n = {st[sa]['n'][0]} → "
        f"{st[sa]['n'][-1]} (slope) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        path = "n/a (as its layer)"
        seq = ""
        if name in st:
            mp = st[name]["max_path"]
            tail = [(n, m) for n, m in zip(st[name]["n"], mp) if n >= PATH_FIT_FROM]
            tail = tail if len(tail) > 1 else list(zip(st[name]["n"], mp))  # short of 256
            sl = slope([t[0] for t in tail], [t[1] for t in tail]) if mp[-1] > mp[0] else 0.0
            path = f"{mp[0]:.0f} → {mp[-1]:.0f} ({sl:.2f})"
            seq = str(st[name]["sequential_ops"][-1])
        out.append(f"| {name} | {row['order']} | {fitted(row, 'flops', fit):.2f} | "
                   f"{fitted(row, 'time', fit):.2f} | {fitted(row, 'fwd_s', fit):.2f} | "
                   f"{fitted(row, 'saved_mb', fit):.2f} | {seq} | {path} |")
    name = f"dilated convolution k={s['k']}"
    if name in st:
        mp = st[name]["max_path"]
        out.append(f"| {name} (paths only) | O(k n d^2) | | | | | {st[name]['sequential_ops'][-1]} | "
                   f"{mp[0]:.0f} → {mp[-1]:.0f} (O(log_k n)) |")
    out += ["", "Table 1's orders in n: quadratic for self-attention, linear for the rest; its path "
            "lengths: O(1), O(n/r), O(n), O(n/k) (contiguous kernels) or O(log_k n) (dilated).", ""]
    out += _targets(result)
    out += ["", "## Where the curves cross on this machine", ""]
    pairs = [(sa, gru), (sa, f"convolution k={s['k']}"), (sa, f"separable convolution k={s['k']}"),
             (f"restricted r={r_small}", sa), (f"restricted r={r_large}", sa),
             (f"restricted r={r_small}", f"restricted r={r_small}, dense masked")]
    for a, b in pairs:
        out.append(f"**{a} vs {b}**")
        out.append("")
        out.append(_crossing_text(result, a, b, "flops"))
        out.append(_crossing_text(result, a, b, "time"))
        out.append("")
    out.append(f"The paper: self-attention is cheaper than recurrence while n < d (here d = {s['d']}).")
    out += ["", "## Forward + backward time per layer (ms)", ""] + _grid(rows, ns, lambda p: (p["fwd_s"] + p["bwd_s"]) * 1e3)
    out += ["", "## Forward time per layer (ms)", ""] + _grid(rows, ns, lambda p: p["fwd_s"] * 1e3)
    out += ["", "## FLOPs per layer, forward + backward (GFLOP)", ""] + _grid(rows, ns, lambda p: p["flops"] / 1e9)
    out += ["", "## Activation memory saved for the backward pass (MB)", ""] + _grid(rows, ns, lambda p: p["saved_mb"])
    out += ["", "## Paths: longest shortest path, layers needed, pairs connected", "",
            "Computed from each kind's connectivity (`aiayn/recipes/table1_paths.py`): the stack "
            "grows until no pair of (input position, output position) gets a shorter path; the "
            "path counts one edge per layer crossed and one per recurrent step. A unidirectional "
            "recurrent layer connects only pairs with j <= i (half of them).", "",
            "| layer | " + " | ".join(f"n = {n}" for n in st[sa]["n"]) + " |",
            "|---|" + "---|" * len(st[sa]["n"])]
    for name, v in st.items():
        cells = [f"{m:.0f} ({la} layers, {c:.0%})" for m, la, c in
                 zip(v["max_path"], v["layers"], v["connected"])]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "## How it is measured", "", "Timing, FLOP counting and memory: see the docstring of "
            "`aiayn/recipes/table1.py`. FLOPs are exact counts of the operations run (so the banded "
            "kernel's count includes the masked corners of its 3r-key windows), times the minimum of "
            "several runs; at the largest n a point has fewer runs (the JSON keeps the count)."]
    return "\n".join(out) + "\n"


def _targets(result: dict) -> list[str]:
    s, rows = result["settings"], result["rows"]
    out = ["## Targets", ""]
    for r in s["r"]:
        row = rows[f"restricted r={r}"]
        sl = fitted(row, "time", s["fit_from"])
        full = series(rows["self-attention"], "time")
        mine = series(row, "time")
        ns = [p["n"] for p in row["points"]]
        faster = next((n for i, n in enumerate(ns) if all(m < f for m, f in zip(mine[i:], full[i:]))), None)
        ok = "met" if abs(sl - 1) <= 0.15 else "missed"
        out.append(f"- restricted r={r}: time slope {sl:.2f} (target within 0.15 of 1: {ok}); "
                   + (f"faster than full self-attention at every measured n >= {faster}."
                      if faster else "never faster than full self-attention in this range."))
    return out


def _grid(rows: dict, ns: list[int], value) -> list[str]:
    out = ["| layer | " + " | ".join(str(n) for n in ns) + " |", "|---|" + "---:|" * len(ns)]
    for name, row in rows.items():
        out.append(f"| {name} | " + " | ".join(_fmt(value(p)) for p in row["points"]) + " |")
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows, st = result["rows"], result["structure"]
    names = [n for n in rows if "(core)" not in n] + [n for n in st if n not in rows]
    colour = {n: f"C{i}" for i, n in enumerate(names)}
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.4))
    for name in [n for n in names if n in rows]:
        row = rows[name]
        ns = [p["n"] for p in row["points"]]
        style = "--" if "dense masked" in name else "-"
        for ax, ys in ((axes[0], series(row, "time")), (axes[1], [f / 1e9 for f in series(row, "flops")])):
            ax.loglog(ns, ys, style, marker="o", ms=3, label=name, color=colour[name])
    for name, v in st.items():
        if name.startswith("separable"):  # the same connectivity as the convolution
            continue
        axes[2].loglog(v["n"], v["max_path"], marker="o", ms=3, label=name, color=colour[name])
    d = result["settings"]["d"]
    for ax in axes[:2]:
        ax.axvline(d, color="grey", lw=0.8, ls=":")
        ax.text(d * 1.05, ax.get_ylim()[0] * 1.5, f"n = d = {d}", color="grey", fontsize=8)
    titles = ["forward + backward time per layer (s)", "FLOPs per layer, fwd + bwd (GFLOP)",
              "maximum path length (edges)"]
    for ax, title in zip(axes, titles):
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title)
        ax.set_xlabel("sequence length n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Table 1 measured, d = {d}: {result['machine']}", fontsize=9)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def write_report(result: dict, docs: Path) -> None:
    docs = Path(docs)
    docs.mkdir(parents=True, exist_ok=True)
    plot(result, docs / "complexity.png")
    with atomic_write(docs / "complexity.md") as f:
        f.write(markdown(result, "complexity.png"))
