"""End to end, as a user runs it: `aiayn translate` of a test file against CTranslate2 from Python
on the same model, imports and model loading included; wall time, peak RSS and sacreBLEU.

    .venv/bin/python benchmarks/translate_e2e.py \\
        --model runs/m30k/model --src data/test.src.txt --ref data/test.tgt.txt --out runs/e2e

Every row is a fresh process pinned with `taskset` to the same cores with the same thread count
(`--cpus`, `--threads`), timed from its start to its exit, its peak RSS from the kernel's rusage
of the child (ru_maxrss):
- `aiayn translate --model M --input SRC --output HYP --precision P` for each `--precisions`
  (beam and length penalty from the model's config, as a user gets them);
- CTranslate2: the model exported once (untimed) by `aiayn export --format ctranslate2`
  (`--precision int8`, or fp32), then a Python script importing only ctranslate2 and
  sentencepiece: tokenize, `Translator.translate_batch` (beam 4 and max_batch_size 64 as
  `--ct2-batch` says, its own length normalisation: `length_penalty` 1, PAD and BOS suppressed as
  `aiayn export` documents, outputs capped at the model's a * source + b as aiayn caps them),
  detokenize, write.
- ONNX (`--onnx`): the model exported once (untimed) by `aiayn export --format onnx`, then a
  Python script that tokenizes with sentencepiece and searches with `OnnxGreedy`
  (aiayn/export/onnx.py; its module imports torch, counted) on onnxruntime: greedy only,
  so use it with `--greedy`, which makes every row greedy (`aiayn translate --greedy`, CTranslate2
  beam 1).
`--variants` adds aiayn rows with other options or environment settings (batch size, stopping
rule, allocator). `--baseline DIR` runs every aiayn row again with the aiayn of another checkout
(a `git worktree` of an earlier commit), right after its own: a change's before and after, on
the same machine in one run. Each row runs `--reps` times, in rounds (every row once, then every
row again, so a slow phase of a shared host falls on all rows alike); the fastest time, every
time (`all_seconds`) and the largest RSS are reported; the translations are scored with
sacreBLEU (aiayn.evaluation.sacre); results.json records the commit, whether the tree was
clean and the machine (benchmarks/provenance.py). The quality bound of int8 decoding is checked
here: aiayn int8's sacreBLEU within 0.3 of aiayn fp32's on the same model.
"""

from __future__ import annotations

import argparse
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

QUALITY_BOUND = 0.3  # sacreBLEU points: int8 against fp32 on the same model


def timed(cmd: list[str], cpus: str, threads: int, extra_env: dict[str, str] | None = None,
          repo: Path = REPO) -> tuple[float, float, str]:
    """Run `cmd` pinned to `cpus` (with `extra_env` set) with the aiayn of checkout `repo`:
    (seconds from start to exit, peak RSS in MB, stderr); raises RuntimeError with its last
    stderr line when it fails."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONWARNINGS="ignore", PYTHONPATH=str(repo), **(extra_env or {}))
    start = time.perf_counter()
    p = subprocess.Popen(["taskset", "-c", cpus, *cmd], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=repo)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - start
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        tail = [ln for ln in err.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"{shlex.join(cmd)}: exit {p.returncode}: {tail[-1] if tail else ''}")
    return seconds, usage.ru_maxrss / 1024, err


def ct2_child(model: str, src: str, out: str, compute_type: str, threads: int, beam: int,
              batch: int, cap: tuple[float, int]) -> int:
    """The CTranslate2 row's process: what a user's script does (imports counted). A model with
    one shared sentencepiece model (spm.model, which `aiayn export` copies beside the weights).

    Outputs are capped as aiayn caps them, a * (source pieces + EOS) + b (`cap`, the model's
    max_len_a and max_len_b), so both search the same lengths: CTranslate2 takes one
    `max_decoding_length` per call, so the sources go longest first in calls of `batch`
    sentences (the sub-batches its `max_batch_size` would make), each capped at its longest
    source's length. Its own default, 256 tokens, let a weak model's unfinished beams run 5x
    further than aiayn's (docs/experiments/decoding.md)."""
    import ctranslate2
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(Path(model) / "spm.model"))
    lines = Path(src).read_text(encoding="utf-8").splitlines()
    tr = ctranslate2.Translator(model, device="cpu", compute_type=compute_type,
                                intra_threads=threads, inter_threads=1)
    pieces = sp.encode(lines, out_type=str)
    text = [""] * len(pieces)
    for group, limit in capped_groups([len(p) for p in pieces], batch, cap):
        res = tr.translate_batch([pieces[i] for i in group], beam_size=beam, max_batch_size=batch,
                                 max_decoding_length=limit, suppress_sequences=[["<pad>"], ["<s>"]])
        for i, r in zip(group, res):
            text[i] = sp.decode(r.hypotheses[0])
    Path(out).write_text("".join(t + "\n" for t in text), encoding="utf-8")
    return 0


def onnx_child(model: str, src: str, out: str, threads: int) -> int:
    """The ONNX row's process: sentencepiece, then OnnxGreedy over the exported graphs."""
    import sentencepiece as spm

    from aiayn.export.onnx import OnnxGreedy

    sp = spm.SentencePieceProcessor(model_file=str(Path(model) / "spm.model"))
    lines = Path(src).read_text(encoding="utf-8").splitlines()
    search = OnnxGreedy(model, threads=threads)
    pieces = sp.encode(lines)
    out_pieces: list[list[int]] = []
    for start in range(0, len(pieces), 64):  # batches of 64 sentences, as CTranslate2's row
        out_pieces += search.search(pieces[start:start + 64])
    Path(out).write_text("".join(sp.decode(o) + "\n" for o in out_pieces), encoding="utf-8")
    return 0


def capped_groups(lengths: list[int], batch: int, cap: tuple[float, int]) -> list[tuple[list[int], int]]:
    """The CTranslate2 row's calls: source indices longest first in groups of `batch`, each with
    the output cap of its longest source, floor(a * (pieces + EOS) + b) as aiayn's
    `max_output_lengths` gives it (written out here: the CTranslate2 row imports no torch, and
    tests/test_bench_translate_e2e.py checks the two agree)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups = [order[i:i + batch] for i in range(0, len(order), batch)]
    return [(g, int(cap[0] * (lengths[g[0]] + 1) + cap[1] + 1e-9)) for g in groups]


def output_cap(model: Path) -> tuple[float, int]:
    """The model's output length cap, a * source + b (config.json's max_len_a, max_len_b)."""
    cfg = json.loads((model / "config.json").read_text(encoding="utf-8"))
    return float(cfg.get("max_len_a", 1.0)), int(cfg.get("max_len_b", 50))


def bleu(hyp: Path, refs: list[str]) -> float:
    from aiayn.evaluation.sacre import sacre_bleu

    return sacre_bleu(hyp.read_text(encoding="utf-8").splitlines(), refs).score


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="an aiayn model directory")
    p.add_argument("--src", help="source sentences, one a line")
    p.add_argument("--ref", help="their references, for sacreBLEU")
    p.add_argument("--out", type=Path, help="work directory (exports, translations, results.json)")
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8"],
                   help="aiayn translate --precision values to run (default fp32 int8)")
    p.add_argument("--variants", nargs="+", default=[""], metavar="ARGS",
                   help="aiayn rows for each precision: one per string of extra `translate` "
                        "options and NAME=VALUE environment settings, e.g. '--batch-tokens 1000' "
                        "'AIAYN_ALLOCATOR=system' (default: one row, the defaults)")
    p.add_argument("--ct2", nargs="*", default=["int8", "float32"],
                   help="CTranslate2 compute types to run (default int8 float32)")
    p.add_argument("--greedy", action="store_true",
                   help="greedy search in every row (aiayn --greedy, CTranslate2 beam 1)")
    p.add_argument("--onnx", action="store_true",
                   help="add a row for the ONNX export with onnxruntime (greedy; needs --greedy)")
    p.add_argument("--ct2-batch", type=int, default=64, help="CTranslate2 max_batch_size")
    p.add_argument("--beam", type=int, default=4, help="CTranslate2's beam (aiayn: the config's)")
    p.add_argument("--reps", type=int, default=1, help="runs per row (fastest reported)")
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="another checkout of aiayn (e.g. `git worktree add DIR COMMIT`) whose "
                        "`aiayn translate` runs the same aiayn rows, each right after its own, "
                        "named 'baseline: ...': before and after a change, in one run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpus", default="0,1")
    p.add_argument("--ct2-child", nargs=3, metavar=("MODEL", "SRC", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--compute-type", help=argparse.SUPPRESS)
    p.add_argument("--ct2-cap", nargs=2, type=float, default=(1.0, 50), help=argparse.SUPPRESS)
    p.add_argument("--onnx-child", nargs=3, metavar=("MODEL", "SRC", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.onnx_child:
        return onnx_child(*a.onnx_child, a.threads)
    if a.onnx and not a.greedy:
        p.error("--onnx decodes greedily: add --greedy so every row searches alike")
    if a.greedy:
        a.beam = 1
    if a.ct2_child:
        return ct2_child(*a.ct2_child, a.compute_type, a.threads, a.beam, a.ct2_batch,
                         (a.ct2_cap[0], int(a.ct2_cap[1])))
    if not (a.model and a.src and a.ref and a.out):
        p.error("--model, --src, --ref and --out are required")
    a.out.mkdir(parents=True, exist_ok=True)
    refs = Path(a.ref).read_text(encoding="utf-8").splitlines()
    py = sys.executable
    plan: list[tuple[str, list[str], Path, dict[str, str] | None, Path]] = []

    def add_row(name: str, cmd: list[str], hyp: Path, env: dict[str, str] | None = None,
                repo: Path = REPO) -> None:
        plan.append((name, cmd, hyp, env, repo))

    for prec in a.precisions:
        for variant in a.variants:
            words = shlex.split(variant)
            env = dict(w.split("=", 1) for w in words if not w.startswith("-") and "=" in w)
            opts = [w for w in words if w.startswith("-") or "=" not in w]
            tag = "".join(c if c.isalnum() else "-" for c in variant).strip("-")
            name = " ".join([*(f"{k}={v}" for k, v in env.items()),
                             f"aiayn translate --precision {prec}", *opts])
            for repo, prefix in [(REPO, "")] + ([(a.baseline.resolve(), "baseline: ")]
                                                if a.baseline else []):
                hyp = a.out / f"{prefix[:8]}aiayn-{prec}{'-' + tag if tag else ''}.hyp"
                add_row(prefix + name,
                        [py, "-m", "aiayn", "translate", "--model", str(Path(a.model).resolve()),
                         "--input", str(Path(a.src).resolve()), "--output", str(hyp.resolve()),
                         "--overwrite", "--precision", prec, *(["--greedy"] if a.greedy else []),
                         *opts], hyp, env, repo)
    for ct in a.ct2:
        export = a.out / f"ct2-{ct}"
        if not export.exists():
            stored = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(ct, ct)
            subprocess.run([py, "-m", "aiayn", "export", "--format", "ctranslate2", "--precision",
                            stored, "--model", a.model, "--out", str(export)], check=True, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        hyp = a.out / f"ct2-{ct}.hyp"
        add_row(f"CTranslate2 {ct} (Python)",
                [py, __file__, "--ct2-child", str(export), a.src, str(hyp), "--compute-type", ct,
                 "--threads", str(a.threads), "--beam", str(a.beam), "--ct2-batch", str(a.ct2_batch),
                 "--ct2-cap", *map(str, output_cap(Path(a.model)))],
                hyp)
    if a.onnx:
        export = a.out / "onnx"
        if not export.exists():
            subprocess.run([py, "-m", "aiayn", "export", "--format", "onnx", "--model", a.model,
                            "--out", str(export)], check=True, cwd=REPO,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        hyp = a.out / "onnx.hyp"
        add_row("ONNX fp32, onnxruntime (Python)",
                [py, __file__, "--onnx-child", str(export), a.src, str(hyp), "--threads", str(a.threads)],
                hyp)

    # Rounds, not a row's reps back to back: every row is timed once per round, so a slow phase
    # of a shared host falls on all rows alike rather than on the rows that ran during it.
    times: list[list[float]] = [[] for _ in plan]
    rss: list[float] = [0.0] * len(plan)
    for r in range(a.reps):
        for i, (name, cmd, _, env, repo) in enumerate(plan):
            seconds, peak, _ = timed(cmd, a.cpus, a.threads, env, repo)
            times[i].append(round(seconds, 2))
            rss[i] = max(rss[i], peak)
            print(f"round {r + 1}/{a.reps}: {name}: {seconds:.2f} s, {peak:.0f} MB",
                  file=sys.stderr, flush=True)
    rows = [{"system": name, "seconds": min(t), "peak_rss_mb": round(m),
             "sacrebleu": round(bleu(hyp, refs), 2), "all_seconds": t, "command": shlex.join(cmd)}
            for (name, cmd, hyp, _, _), t, m in zip(plan, times, rss)]
    by = {r["system"]: r for r in rows}
    lines = ["| system | seconds | peak RSS MB | sacreBLEU |", "|---|---|---|---|"]
    lines += [f"| {r['system']} | {r['seconds']:.2f} | {r['peak_rss_mb']} | {r['sacrebleu']:.2f} |"
              for r in rows]
    fp32, int8 = by.get("aiayn translate --precision fp32"), by.get("aiayn translate --precision int8")
    if fp32 and int8:
        gap = int8["sacrebleu"] - fp32["sacrebleu"]
        ok = abs(gap) <= QUALITY_BOUND
        lines.append(f"\naiayn int8 - fp32 sacreBLEU: {gap:+.2f} "
                     f"({'within' if ok else 'OUTSIDE'} the bound of {QUALITY_BOUND})")
    ct2 = by.get("CTranslate2 int8 (Python)")
    for r in rows:
        if ct2 and not r["system"].startswith("CTranslate2"):
            lines.append(f"{r['system']}: {ct2['seconds'] / r['seconds']:.2f}x CTranslate2 int8's "
                         f"speed, {r['peak_rss_mb'] / ct2['peak_rss_mb']:.2f}x its peak RSS")
    text = "\n".join(lines)
    print(text)
    from aiayn.files import atomic_write

    from provenance import stamp, tree

    with atomic_write(a.out / "results.json") as f:
        json.dump({**stamp(), "rows": rows, "model": a.model,
                   "baseline": str(a.baseline) if a.baseline else None,
                   "baseline_commit": tree(a.baseline.resolve())[0] if a.baseline else None,
                   "search": "greedy" if a.greedy else f"beam {a.beam}", "src": a.src,
                   "threads": a.threads, "cpus": a.cpus,
                   "command": shlex.join(["python", *sys.argv])}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
