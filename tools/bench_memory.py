"""What aiayn/memory.py's process-wide settings buy: `aiayn train` as it runs by default (mimalloc
preloaded, memory settings on), on glibc's malloc with the settings (AIAYN_ALLOCATOR=system), and
on glibc with its defaults (AIAYN_TUNE_MEMORY=0 too); the same preset, data, seed and time budget,
runs alternating (A B C A B C ...) so drift of the machine's speed hits all alike. Prints, per
variant, training target tokens/s, minor page faults per update and peak RSS, and the ratios to
glibc's defaults.

    .venv/bin/python tools/bench_memory.py --data runs/multi30k-en-de/data --minutes 1.5
    .venv/bin/python tools/bench_memory.py --data DIR --preset translation-small-v2 --repeats 3

Each run is a fresh process (the settings must precede torch's first allocation), with no dev
evaluation and no checkpoint until the end. Over a whole run, compare the tokens/s of two runs'
metrics.jsonl instead (docs/experiments/multi30k.md: EN→DE runs 3 and 4).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# variant -> the environment it runs with
VARIANTS = {
    "glibc": {"AIAYN_ALLOCATOR": "system", "AIAYN_TUNE_MEMORY": "0"},
    "glibc+set": {"AIAYN_ALLOCATOR": "system", "AIAYN_TUNE_MEMORY": "1"},
    "mimalloc": {"AIAYN_ALLOCATOR": "mimalloc", "AIAYN_TUNE_MEMORY": "1"},
}


def one_run(data: str, preset: str, minutes: float, variant: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "aiayn", "train", "--data", data, "--out", str(out), "--preset", preset,
           "--time-budget", str(minutes), "--eval-every", "0", "--eval-bleu-sentences", "0",
           "--save-minutes", "100000", "--no-tensorboard", "--no-progress", "--overwrite"]
    env = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "LD_PRELOAD")}
    env.update(VARIANTS[variant])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own page faults and peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench_memory: `{' '.join(cmd)}` failed:\n{err[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"tok_s": summary["tgt_tokens_per_s"], "steps": summary["steps"], "usage": usage}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="a dataset made by aiayn prepare")
    p.add_argument("--preset", default="translation-tiny-v2")
    p.add_argument("--minutes", type=float, default=1.5, help="training time per run (default 1.5)")
    p.add_argument("--repeats", type=int, default=2, help="runs per variant (default 2)")
    args = p.parse_args()
    if not (Path(args.data) / "manifest.json").exists():
        sys.exit(f"bench_memory: {args.data}: not a dataset made by aiayn prepare (no manifest.json)")
    rows: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name in VARIANTS:
                r = one_run(args.data, args.preset, args.minutes, name, Path(tmp) / f"{name}{i}")
                rows[name].append(r)
                print(f"run {i + 1}/{args.repeats} {name:>9}: {r['tok_s']:,.0f} tok/s, {r['steps']} updates",
                      file=sys.stderr)
    print(f"\n{args.preset} on {args.data}, {args.minutes} min per run, {args.repeats} runs per variant, "
          f"{os.cpu_count()} CPUs\n")
    print(f"{'':10}{'tok/s':>10}{'faults/update':>15}{'peak RSS GB':>13}")
    summary = {}
    for name, runs in rows.items():
        tok_s = statistics.mean(r["tok_s"] for r in runs)
        faults = statistics.mean(r["usage"].ru_minflt / max(r["steps"], 1) for r in runs)
        rss = max(r["usage"].ru_maxrss for r in runs) / 2**20  # ru_maxrss is in KiB on Linux
        summary[name] = (tok_s, faults, rss)
        print(f"{name:10}{tok_s:>10,.0f}{faults:>15,.0f}{rss:>13.2f}")
    t0, f0, m0 = summary["glibc"]
    for name in list(VARIANTS)[1:]:
        t, f, m = summary[name]
        print(f"{name} / glibc: tokens/s {t / t0:.2f}x, page faults {f / max(f0, 1e-9):.3f}x, "
              f"peak RSS {m / m0:.2f}x")


if __name__ == "__main__":
    main()
