"""Throughput over a whole training run: does it hold from the first minutes to the last?

Reads the `metrics.jsonl` of finished `aiayn train` runs (each "train" record has the run's
elapsed seconds and the target tokens/s of its last `--log-every` updates) and prints, per run,
the median tokens/s over the first and the last `--window` minutes, their ratio, the whole run's
mean, peak resident memory, and the run's dev and test scores when the recipe wrote them. With
`--plot`, tokens/s against training minutes for every run on one figure.

Used to decide the allocator and batch-shape settings on a run a user would make, the Multi30k
recipe of scripts/multi30k.sh (docs/experiments/performance.md), e.g. one run per setting:

    OUT=runs/m30k-sys AIAYN_ALLOCATOR=system bash scripts/multi30k.sh
    OUT=runs/m30k-sys-pad8 AIAYN_ALLOCATOR=system TRAIN_ARGS="--set pad_multiple=8" bash scripts/multi30k.sh
    .venv/bin/python tools/long_run.py runs/m30k-sys runs/m30k-sys-pad8 --plot docs/img/x.png

A RUN is a recipe directory (with run/ inside) or a run directory itself. Medians, so that a
minute of other load on the machine does not move the figure much; the machine must still be
otherwise idle for the figures to mean anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def train_records(run: Path) -> list[dict]:
    """The "train" records of a run directory's metrics.jsonl, in order."""
    out = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train" and "elapsed" in rec:
            out.append(rec)
    return out


def window_median(records: list[dict], start_s: float, end_s: float) -> float | None:
    """Median tokens/s of the records whose elapsed time falls in [start_s, end_s)."""
    vals = [r["tgt_tokens_per_s"] for r in records if start_s <= r["elapsed"] < end_s]
    return statistics.median(vals) if vals else None


def summarize(path: Path, window_min: float) -> dict:
    run = path / "run" if (path / "run" / "metrics.jsonl").exists() else path
    recs = train_records(run)
    if not recs:
        sys.exit(f"long_run: {run}: no train records with elapsed time in metrics.jsonl")
    end = recs[-1]["elapsed"]
    w = window_min * 60
    first, last = window_median(recs, 0, w), window_median(recs, end - w, end + 1)
    out = {"run": str(path), "updates": recs[-1]["step"], "minutes": end / 60,
           "first": first, "last": last, "last_over_first": last / first if first and last else None,
           "peak_rss_gb": max((r.get("rss_gb", 0.0) for r in recs), default=None)}
    summary = run / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        out["mean_tok_s"] = s["tgt_tokens_per_s"]
        out["dev_nll"] = (s.get("final_dev") or {}).get("dev_nll")
    if (run / "run.json").exists():
        meta = json.loads((run / "run.json").read_text())
        out["pad_multiple"] = meta["config"].get("pad_multiple", 1)
        out["allocator"] = meta.get("allocator", "-")
    for split in ("valid", "test"):
        f = path / f"{split}.scores.json"
        if f.exists():
            out[f"{split}_sacrebleu"] = json.loads(f.read_text())["sacrebleu"]["score"]
    out["records"] = [(r["elapsed"] / 60, r["tgt_tokens_per_s"]) for r in recs]
    return out


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def plot(rows: list[dict], out: Path, window_min: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in rows:
        xs, ys = zip(*r["records"])
        k = 15  # a running median over 15 records (150 updates) to see the trend through the noise
        smooth = [statistics.median(ys[max(0, i - k + 1): i + 1]) for i in range(len(ys))]
        ax.plot(xs, smooth, label=Path(r["run"]).name, linewidth=1.5)
    ax.set_xlabel("training time (minutes)")
    ax.set_ylabel("target tokens/s (running median of 150 updates)")
    ax.set_title("Training throughput over the run")
    ax.axvspan(0, window_min, color="0.9", zorder=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="recipe or run directories")
    p.add_argument("--window", type=float, default=10.0, help="minutes at each end (default 10)")
    p.add_argument("--plot", type=Path, help="write tokens/s against minutes to this PNG")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = p.parse_args()
    rows = [summarize(r, a.window) for r in a.runs]
    if a.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "records"} for r in rows], indent=2))
    else:
        w = f"{a.window:g} min"
        print(f"| run | allocator | pad | updates | minutes | tok/s first {w} | last {w} | last/first | mean tok/s "
              f"| peak RSS GB | dev NLL | val / test sacreBLEU |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {Path(r['run']).name} | {r.get('allocator', '-')} | {r.get('pad_multiple', '-')} | {r['updates']} | "
                  f"{r['minutes']:.1f} | {fmt(r['first'], ',.0f')} | {fmt(r['last'], ',.0f')} | "
                  f"{fmt(r['last_over_first'], '.3f')} | {fmt(r.get('mean_tok_s'), ',.0f')} | "
                  f"{fmt(r['peak_rss_gb'], '.2f')} | {fmt(r.get('dev_nll'), '.3f')} | "
                  f"{fmt(r.get('valid_sacrebleu'), '.2f')} / {fmt(r.get('test_sacrebleu'), '.2f')} |")
    if a.plot:
        plot(rows, a.plot, a.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
