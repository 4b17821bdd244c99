"""aiayn against the peers a user would pick instead: one command, one table per config.

Every measurement is its own process, pinned with `taskset` to the same cores and given the same
thread count, so one system's allocator, thread pools or JIT caches never touch another's:
  - the machine's matmul peak (benchmarks/workload.py --peak), for MFU;
  - training tokens/s per (system, config, precision) (benchmarks/train_systems.py);
  - decoding sentences/s, greedy and beam 4 (benchmarks/decode_systems.py).
All rows use one interpreter, .venv-peers/bin/python (aiayn is installed there editable, on the
same torch build as .venv), so no row differs by its environment. scripts/setup_peers.sh is run
first (it returns at once when the environment is already there).

    bash scripts/setup_peers.sh                           # once: the peers' environment
    .venv/bin/python benchmarks/bench_peers.py            # everything (~20 minutes on 2 cores)
    .venv/bin/python benchmarks/bench_peers.py --quick --configs tiny --systems aiayn torch
    .venv/bin/python benchmarks/bench_peers.py --out runs/peers --write-results
    .venv/bin/python benchmarks/bench_peers.py --render runs/peers/results.json   # re-print

Ratios are aiayn/peer at the same precision (a precision aiayn was not measured in: against aiayn
bf16, or fp32 where bf16 was not measured): above 1 means aiayn is faster, or for memory that aiayn
uses more. Each table ends with aiayn's training against the fastest peer and each of its decoding
precisions against CTranslate2 int8 and fp32 (speed and decoding peak RSS).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from aiayn.files import atomic_write  # noqa: E402

from provenance import commit, cpu_name, tree  # noqa: E402

PEERS_PY = REPO / ".venv-peers" / "bin" / "python"
SYSTEMS = ("aiayn", "torch", "marian", "fairseq", "opennmt", "ctranslate2")
TRAIN_PRECISIONS = {s: ("fp32", "bf16") for s in ("aiayn", "torch", "marian", "fairseq", "opennmt")}
PRECISION_ORDER = ("fp32", "bf16", "int8")
NAMES = {"aiayn": "aiayn", "torch": "torch.nn.Transformer", "marian": "HF Marian",
         "fairseq": "fairseq", "opennmt": "OpenNMT-py", "ctranslate2": "CTranslate2"}
# (warm-up steps, timed windows, steps per window) per config; --quick: one step, one window.
# The warm-up is at least one pass over the timed batches (train_systems.measure). BASE steps are
# ~6x dearer; its windows are shorter so that the whole run stays near 25 minutes.
TRAIN_STEPS = {"tiny": (3, 3, 4), "base": (1, 2, 2)}
DECODE_REPS = {"tiny": 3, "base": 1}  # timed passes over the 200 sentences (median reported)
QUICK_STEPS = (1, 1, 1)


def decode_precisions() -> dict[str, tuple[str, ...]]:
    """What decode_systems.py measures per system (its own table), or {} if it is not there."""
    try:
        sys.path.insert(0, str(HERE))
        import decode_systems

        return dict(decode_systems.PRECISIONS)
    except Exception as e:  # a missing or broken decoder script must not stop the training table
        print(f"note: no decoding measurements: benchmarks/decode_systems.py: {e}", file=sys.stderr)
        return {}
    finally:
        sys.path.remove(str(HERE))


def worker(cmd: list[str], cpus: str, threads: int, timeout: float, log: Path | None
           ) -> tuple[dict | None, str]:
    """Run one measurement pinned to `cpus`; (its JSON line, "") or (None, why it failed)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    full = ["taskset", "-c", cpus, *cmd]
    try:
        p = subprocess.run(full, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {shlex.join(full)}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode == 0 and lines:
        return json.loads(lines[-1]), ""
    tail = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()]
    return None, f"exit {p.returncode}: {tail[-1] if tail else 'no output'}"[:200]


def versions(python: Path) -> dict[str, str]:
    code = ("import json, importlib, subprocess\nv = {}\n"
            "for m in ('torch', 'aiayn', 'transformers', 'fairseq', 'onmt', 'ctranslate2'):\n"
            "    try: v[m] = importlib.import_module(m).__version__\n"
            "    except Exception as e: v[m] = 'missing'\n"
            "print(json.dumps(v))")
    p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONWARNINGS="ignore"))
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {}
    out["aiayn_commit"] = commit()
    return out


def cpu_isa() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8") if f in flags]
    return ", ".join(have) or "none of avx2/avx512/amx"


# --- the table ----------------------------------------------------------------------------------


def _fmt(v: float | None, digits: int) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if digits else f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def _with_ratio(value: float | None, ref: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    if ref is None or value == 0:
        return _fmt(value, digits)
    return f"{_fmt(value, digits)} ({ref / value:.2f})"


def table(rows: list[dict], config: str, peak: dict) -> str:
    """Markdown table of one config's rows, each cell `value (aiayn/peer)`."""
    mine = [r for r in rows if r["config"] == config]
    aiayn = {r["precision"]: r for r in mine if r["system"] == "aiayn"}

    def col(r: dict | None, key: str) -> float | None:
        if r is None:
            return None
        part, field = key.split(".")
        d = r.get(part) or {}
        if field == "mfu":
            if "tok_per_s" not in d:
                return None
            p = d.get("precision_resolved", r["precision"])
            g = peak.get(f"{p}_gflops")
            return d["tok_per_s"] * d["flops_per_tok"] / (g * 1e9) if g else None
        if field == "rss_gb":
            return d["peak_rss_mb"] / 1024 if "peak_rss_mb" in d else None
        return d.get(field)

    cols = [("train tok/s", "train.tok_per_s", 0), ("MFU", "train.mfu", 2),
            ("greedy sent/s", "decode.greedy_sent_per_s", 0),
            ("beam-4 sent/s", "decode.beam4_sent_per_s", 0),
            ("train RSS GB", "train.rss_gb", 2), ("decode RSS GB", "decode.rss_gb", 2)]
    head = "| system | precision | " + " | ".join(c[0] for c in cols) + " |"
    lines = [head, "|" + "---|" * (len(cols) + 2)]
    for r in mine:
        ref = aiayn.get(r["precision"]) or aiayn.get("bf16") or aiayn.get("fp32")
        is_ref = r["system"] == "aiayn"
        cells = [_fmt(col(r, k), d) if is_ref else _with_ratio(col(r, k), col(ref, k), d)
                 for _, k, d in cols]
        name = NAMES.get(r["system"], r["system"]) + (" (compiled)" if (r.get("train") or {}).get("compiled") else "")
        lines.append(f"| {name} | {r['precision']} | " + " | ".join(cells) + " |")
    tok = {(r["system"], r["precision"]): (r.get("train") or {}).get("tok_per_s") for r in mine}
    peers = {k: v for k, v in tok.items() if k[0] != "aiayn" and v}
    if peers:
        fastest = max(peers, key=peers.get)
        lines.append("")
        lines.append("Training against the fastest peer row, " + f"{NAMES[fastest[0]]} {fastest[1]} "
                     f"({peers[fastest]:,.0f} tok/s): " + ", ".join(
                         f"aiayn {p} {tok[('aiayn', p)] / peers[fastest]:.2f}x"
                         for p in TRAIN_PRECISIONS["aiayn"] if tok.get(("aiayn", p))) + ".")
    lines += decoding_summary(mine)
    failed = [f"{r['system']} {r['precision']} {part}: {r[part + '_error']}"
              for r in mine for part in ("train", "decode") if r.get(part + "_error")]
    if failed:
        lines += ["", "Failed: " + "; ".join(failed) + "."]
    return "\n".join(lines)


def decoding_summary(rows: list[dict]) -> list[str]:
    """One line: each aiayn precision's beam-4 speed and decoding peak RSS against CTranslate2's
    int8 and fp32 rows of the same table (the targets are stated in those terms)."""
    def get(system: str, precision: str, key: str) -> float | None:
        r = next((r for r in rows if (r["system"], r["precision"]) == (system, precision)), None)
        return ((r or {}).get("decode") or {}).get(key)

    peers = [p for p in ("int8", "fp32") if get("ctranslate2", p, "beam4_sent_per_s")]
    parts = []
    for prec in PRECISION_ORDER:
        mine = get("aiayn", prec, "beam4_sent_per_s")
        if mine is None or not peers:
            continue
        speed = " / ".join(f"{mine / get('ctranslate2', p, 'beam4_sent_per_s'):.2f}x" for p in peers)
        rss = get("aiayn", prec, "peak_rss_mb")
        ct2_rss = get("ctranslate2", "int8", "peak_rss_mb")
        parts.append(f"aiayn {prec} {speed}" + (
            f" (decoding RSS {rss / ct2_rss:.2f}x CTranslate2 int8's)" if rss and ct2_rss else ""))
    if not parts:
        return []
    return ["", "Beam-4 decoding against CTranslate2 " + " / ".join(peers) + ": "
            + ", ".join(parts) + "."]


def peak_text(peak: dict) -> str:
    bf16 = peak.get("bf16_gflops")
    return f"fp32 {peak['fp32_gflops']:.0f} GFLOP/s, " + (
        f"bf16 {bf16:.0f} GFLOP/s" if bf16 else "bf16 not measured (no native bf16 on this CPU)")


def render(res: dict) -> str:
    peak = res["peak"]
    parts = [f"Matmul peak ({peak['threads']} threads, best torch.mm over the models' shapes): "
             f"{peak_text(peak)}. "
             "MFU = train tok/s x model FLOPs per target token / the peak of the row's precision. "
             "Cells: value (aiayn/peer, same precision; a precision aiayn was not measured in "
             "against aiayn bf16, else fp32): above 1, aiayn is faster, or for RSS uses more. "
             "aiayn's default precision \"auto\" is bf16 on a CPU with native bf16 (its bf16 "
             "rows), else fp32, in training and decoding; its decoding rows are `aiayn translate "
             "--precision` fp32, bf16 or int8 (weights and activations). Each table ends with aiayn's "
             "training speed against the fastest peer row and its decoding against CTranslate2."]
    for c in res["configs"]:
        fpt = next((r["train"]["flops_per_tok"] for r in res["rows"]
                    if r["config"] == c and r.get("train")), None)
        title = f"### {c.upper()}" + (f" ({fpt / 1e6:.1f}M model FLOPs per target token)" if fpt else "")
        parts += ["", title, "", table(res["rows"], c, peak)]
    return "\n".join(parts) + "\n"


def results_md(res: dict) -> str:
    v = res["versions"]
    peers = ", ".join(f"{k} {v.get(m, '?')}" for k, m in (
        ("transformers", "transformers"), ("fairseq-fixed", "fairseq"), ("OpenNMT-py", "onmt"),
        ("ctranslate2", "ctranslate2")))
    return (
        "# aiayn against its peers: latest run\n\n"
        "Written by `benchmarks/bench_peers.py --write-results`; do not edit by hand.\n\n"
        f"- Date: {res['date']}\n"
        f"- Machine: {res['machine']['cpu']} ({res['machine']['isa']}), "
        f"{res['machine']['nproc']} CPUs, measured on cores {res['cpus']} with {res['threads']} threads\n"
        f"- Versions: torch {v.get('torch')}, aiayn {v.get('aiayn')} ({v.get('aiayn_commit')}), {peers}\n"
        f"- Python: {res['python']}\n"
        f"- Command: `{res['command']}`\n\n"
        "Workload (benchmarks/workload.py): vocabulary 8000, shared and tied; TINY = d_model 256, "
        "3+3 layers, 4 heads, d_ff 1024; BASE = the paper's base. Training: the same random batches "
        "for every system (budget 4000 tokens a side, padding counted), forward + label-smoothed "
        "(0.1) loss + backward + Adam(0.9, 0.98, 1e-9), median over timed windows after an untimed "
        "pass over the same batches (the steady state of training: every epoch after the first "
        "repeats its batch shapes, for which oneDNN has then built its kernels). "
        "Decoding (benchmarks/decode_systems.py): 200 sources, 4 batches of 50, output forced to 30 "
        "tokens. How each peer was matched to the paper's model: the docstrings of "
        "benchmarks/train_systems.py and benchmarks/decode_systems.py.\n\n"
        + render(res))


def record(res: dict, root: Path = HERE) -> None:
    """root/RESULTS.md is the latest run; each run also stays in results/<date>-<cpu>.md, so a run
    on another machine (AVX2 fp32 against AMX bf16 changes every figure) never erases the last."""
    name = f"{res['date'][:10]}-" + "-".join(res["machine"]["isa"].replace("_", "-").split(", "))
    text = results_md(res)
    with atomic_write(root / "results" / f"{name}.md") as f:
        f.write(text)
    tables = sorted(p.name for p in (root / "results").glob("*.md") if p.stem != name)
    earlier = [n for n in tables if not n.startswith("train-gpu-")]
    if earlier:
        text += "\nEarlier runs (other days or machines): " + ", ".join(
            f"[{n}](results/{n})" for n in earlier) + ".\n"
    gpu = [n for n in tables if n.startswith("train-gpu-")]  # benchmarks/train_gpu.sh's tables
    if gpu:
        text += "\nTraining on one GPU, aiayn against torch.nn.Transformer (benchmarks/train_gpu.sh): " + \
            ", ".join(f"[{n}](results/{n})" for n in gpu) + ".\n"
    with atomic_write(root / "RESULTS.md") as f:
        f.write(text)


# --- the run ------------------------------------------------------------------------------------


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["tiny", "base"], choices=["tiny", "base"])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    p.add_argument("--precisions", nargs="+", choices=PRECISION_ORDER,
                   help="keep only these precisions (default all; fp32 and int8 on a CPU without "
                        "native bf16, where bf16 products are emulated ~100x slower than fp32)")
    p.add_argument("--no-train", action="store_true", help="skip the training measurements")
    p.add_argument("--no-decode", action="store_true", help="skip the decoding measurements")
    p.add_argument("--quick", action="store_true",
                   help="one timed step, few sentences: a smoke test, not a measurement")
    p.add_argument("--aiayn-compile", action="store_true",
                   help="train aiayn with torch.compile (`aiayn train --compile`); the compile "
                        "happens in the warm-up steps, which are not timed")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpus", default="0,1", help="taskset core list (default 0,1)")
    p.add_argument("--python", type=Path, default=PEERS_PY, help="interpreter of every row")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    p.add_argument("--out", type=Path, help="write results.json, table.md and logs/ here")
    p.add_argument("--write-results", action="store_true", help="rewrite benchmarks/RESULTS.md")
    p.add_argument("--results-dir", type=Path, default=HERE, metavar="DIR",
                   help="where --write-results records (RESULTS.md, results/; default benchmarks/)")
    p.add_argument("--no-setup", action="store_true", help="do not run scripts/setup_peers.sh")
    p.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                   help="measure nothing: print (and with --write-results record) a saved run")
    a = p.parse_args()
    if a.render:
        res = json.loads(a.render.read_text())
        print(render(res), end="")
        if a.write_results:
            if res.get("quick"):
                p.error(f"{a.render} is a --quick run; RESULTS.md records real runs only")
            record(res, a.results_dir)
        return 0
    if a.quick and a.write_results:
        p.error("--write-results records a real run; drop --quick")
    if a.precisions is None:
        from aiayn.precision import cpu_has_native_bf16
        a.precisions = list(PRECISION_ORDER)
        if not cpu_has_native_bf16():
            a.precisions = ["fp32", "int8"]
            say("this CPU has no native bf16 (AVX512-BF16 or AMX): measuring fp32 and int8 only")

    if not a.no_setup and a.python == PEERS_PY:
        subprocess.run(["bash", str(REPO / "scripts" / "setup_peers.sh")], check=True)
    py = str(a.python)
    logs = a.out / "logs" if a.out else None

    say(f"matmul peak on cores {a.cpus}, {a.threads} threads ...")
    peak_cmd = [py, str(HERE / "workload.py"), "--peak", "--json", "--threads", str(a.threads)]
    if a.quick:
        peak_cmd += ["--seconds", "0.05"]
    got, err = worker(peak_cmd, a.cpus, a.threads, a.timeout, logs and logs / "peak.log")
    if got is None:
        raise SystemExit(f"bench_peers: the matmul peak failed: {err}")
    peak = got["peak"]
    say(f"  {peak_text(peak)}")

    dec = {} if a.no_decode else decode_precisions()
    jobs: list[tuple[str, str, str, str]] = []  # (kind, system, config, precision)
    rows: dict[tuple[str, str, str], dict] = {}
    for c in a.configs:
        for s in a.systems:
            for kind, table_ in (("train", {} if a.no_train else TRAIN_PRECISIONS), ("decode", dec)):
                for prec in table_.get(s, ()):
                    if prec in a.precisions:
                        jobs.append((kind, s, c, prec))
                        rows.setdefault((c, s, prec), {"config": c, "system": s, "precision": prec})

    for i, (kind, s, c, prec) in enumerate(jobs, 1):
        common = ["--system", s, "--config", c, "--precision", prec, "--threads", str(a.threads), "--json"]
        if kind == "train":
            cmd = [py, str(HERE / "train_systems.py"), *common]
            w, n, k = QUICK_STEPS if a.quick else TRAIN_STEPS[c]
            if s == "aiayn" and a.aiayn_compile:
                cmd += ["--compile"]
                w += 2  # compiling, and a possible recompile once shapes vary, stay untimed
            cmd += ["--warmup", str(w), "--windows", str(n), "--steps", str(k)]
        else:
            cmd = [py, str(HERE / "decode_systems.py"), *common]
            if a.quick:
                cmd += ["--sentences", "10", "--reps", "1", "--warmup", "2"]
            else:
                cmd += ["--reps", str(DECODE_REPS[c])]
        t0 = time.monotonic()
        say(f"[{i}/{len(jobs)}] {kind} {s} {c} {prec} ...")
        got, err = worker(cmd, a.cpus, a.threads, a.timeout, logs and logs / f"{kind}-{s}-{c}-{prec}.log")
        row = rows[(c, s, prec)]
        row[kind], row[kind + "_error"] = got, err or None
        if got is None:
            say(f"  failed ({time.monotonic() - t0:.0f} s): {err}")
        elif kind == "train":
            say(f"  {got['tok_per_s']:.0f} target tok/s ({time.monotonic() - t0:.0f} s)")
        else:
            say(f"  greedy {got.get('greedy_sent_per_s')}, beam-4 {got.get('beam4_sent_per_s')} "
                f"sent/s ({time.monotonic() - t0:.0f} s)")

    order = {s: i for i, s in enumerate(SYSTEMS)}
    ordered = sorted(rows.values(), key=lambda r: (a.configs.index(r["config"]), order[r["system"]],
                                                   PRECISION_ORDER.index(r["precision"])))
    res = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
           "machine": {"cpu": cpu_name(), "isa": cpu_isa(), "nproc": os.cpu_count()},
           "cpus": a.cpus, "threads": a.threads, "quick": a.quick,
           "python": os.path.relpath(py, REPO) if py.startswith(str(REPO)) else py,
           "versions": versions(a.python), **dict(zip(("commit", "clean"), tree())),
           "command": shlex.join(["python", "benchmarks/bench_peers.py", *sys.argv[1:]]),
           "configs": a.configs, "peak": peak, "rows": ordered}
    text = render(res)
    print(text)
    if a.out:
        with atomic_write(a.out / "results.json") as f:
            json.dump(res, f, indent=2)
        with atomic_write(a.out / "table.md") as f:
            f.write(text)
    if a.write_results:
        record(res, a.results_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
