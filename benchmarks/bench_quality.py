"""Training quality of aiayn against a peer ("no loss of quality: after the same number
of steps on Multi30k, aiayn's dev loss is no worse").

Every system trains the TINY model (benchmarks/workload.py: d_model 256, 3+3 layers, 4 heads,
d_ff 1024, shared and tied 8000-piece vocabulary, dropout 0.1, label smoothing 0.1) on a dataset
prepared by `aiayn prepare`, with Adam(0.9, 0.98, 1e-9) and Eq. 3's schedule
(aiayn.training.schedule, warmup --warmup), on the same batches in the same order:
aiayn's TokenBatchSampler at 4096 tokens a side with --seed, epoch after epoch, as `aiayn train`
draws them. Then each system computes, with its own forward pass in eval mode (no dropout) and in
fp32, the label-smoothed loss and the plain NLL per target token over the whole valid split.

Rows, each in its own process pinned with `taskset` (benchmarks/bench_peers.py's `worker`), all
with the same --seed:
  aiayn bf16 (auto)  `aiayn train`'s own step: Updater, Precision("auto"), which is bf16 autocast
                     on a CPU with native bf16 (fast dropout mask, fused label-smoothed loss);
  aiayn fp32         the same at precision fp32: same initial weights and dropout masks;
  PEER p             the builders of benchmarks/train_systems.py, for every --precisions p.
Model builders and update steps are train_systems.py's, fed real batches and a rate per step.

    .venv/bin/python benchmarks/bench_quality.py --data runs/multi30k-en-de/data --out runs/quality
    .venv/bin/python benchmarks/bench_quality.py --data D --systems torch fairseq --warmup 1000
    .venv-peers/bin/python benchmarks/bench_quality.py --worker fairseq --precision fp32 \\
        --data D --steps 2 --dev-pairs 50 --threads 1       # one row, printed as JSON (smoke test)

Comparability: the peers are the closest each gets to the paper's model (train_systems.py's
docstring), not aiayn's model: Q/K/V/O biases (torch, Marian, fairseq), pre-norm (OpenNMT-py),
fairseq's smoothing over V - 1 ids in its training loss, and each its own initialisation. The dev
figures are computed for every row by the same code from its logits (same smoothing, same
tokens); aiayn's rows are also scored by aiayn.training.evaluate.dev_loss as a check. One seed
says nothing about seed-to-seed spread: rerun with another --seed before reading much into a
difference of a few hundredths of a nat. With the paper's warmup of 4000, step 300 is still early
in the warmup (the rate is 7.5% of its peak), so 300 steps compare early training only; a warmup
near the step count (the `tiny` preset has 1000) gets further.

Duration (estimated from Multi30k TINY rates on 2 cores, not timed end to end): a step is about
3900 target tokens, so 300 steps are about 1.2M tokens per row; at roughly 4500-5500 tok/s for
aiayn bf16 and 2500-4000 for the fp32 rows and a peer's bf16, the default four rows take about
20-25 minutes, plus ~10 s per row to start and score the dev set. About 12 minutes: --steps 150.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import itertools
import json
import os
import resource
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from bench_peers import NAMES, PEERS_PY, cpu_isa, versions, worker  # noqa: E402

from aiayn.files import atomic_write  # noqa: E402

from provenance import cpu_name, stamp, stamp_line  # noqa: E402

PEERS = ("torch", "fairseq", "marian", "opennmt")  # the peers train_systems.py can train
PRECISIONS = ("fp32", "bf16")
AIAYN_PRECISIONS = ("bf16", "fp32")
MAX_TOKENS = 4096  # tokens per side in one update, padding counted: the `tiny` preset's
LOSS_EVERY = 50  # steps per point of the recorded training-loss curve


# --- one row (runs in the worker process, under .venv-peers) ------------------------------------


def tiny_config(vocab_size: int, warmup: int):
    """workload's TINY at the dataset's vocabulary, with `warmup` steps in Eq. 3."""
    import train_systems

    import workload

    cfg = replace(workload.model_config("tiny"), vocab_size=vocab_size, warmup_steps=warmup)
    # the peers' losses are built with train_systems.EPS_LS; aiayn's Updater reads cfg.eps_ls
    assert cfg.eps_ls == train_systems.EPS_LS and cfg.lr_scale == 1.0
    return cfg


def batch_indices(dataset, steps: int, seed: int) -> Iterator:
    """The pair indices of the first `steps` updates of `aiayn train --seed seed` with one
    micro-batch of MAX_TOKENS per update: its sampler's epochs 0, 1, ... in order."""
    from aiayn.data.batching import TokenBatchSampler

    sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, MAX_TOKENS, seed=seed)
    epochs = (sampler.epoch_batches(e) for e in itertools.count())
    return itertools.islice(itertools.chain.from_iterable(epochs), steps)


def train(system, dataset, cfg, steps: int, seed: int) -> dict:
    """`steps` updates at Eq. 3's rate; only the update itself is timed (batching is not)."""
    from aiayn.data.batching import collate
    from aiayn.training.schedule import lr_at

    digest = hashlib.sha256()  # of every batch's pair indices: proves all rows saw the same data
    losses, seconds, tokens = [], 0.0, 0
    for i, idx in enumerate(batch_indices(dataset, steps, seed), 1):
        digest.update(idx.astype("int64").tobytes())
        b = collate(dataset, idx)
        system.set_lr(lr_at(cfg, i))
        t0 = time.perf_counter()
        losses.append(system.step(b))
        seconds += time.perf_counter() - t0
        tokens += b.n_tgt_tokens
    return {"steps": len(losses), "train_s": round(seconds, 2), "tgt_tokens": tokens,
            "train_tok_per_s": round(tokens / seconds, 1), "lr_last": lr_at(cfg, len(losses)),
            "train_loss": loss_curve(losses), "batches_sha256": digest.hexdigest()[:16]}


def loss_curve(losses: list[float]) -> list[list[float]]:
    """[last step, mean training loss] per LOSS_EVERY steps."""
    chunks = [losses[a : a + LOSS_EVERY] for a in range(0, len(losses), LOSS_EVERY)]
    ends = itertools.accumulate(len(c) for c in chunks)
    return [[end, round(sum(c) / len(c), 4)] for end, c in zip(ends, chunks)]


def dev_batches(dataset, limit: int | None) -> list:
    """The split (or its first `limit` pairs) in batches of MAX_TOKENS, as aiayn evaluates it."""
    from aiayn.data.batching import collate, length_batches

    n = len(dataset) if limit is None else min(limit, len(dataset))
    return [collate(dataset, idx) for idx in length_batches(dataset.src_lengths[:n], MAX_TOKENS,
                                                            dataset.tgt_lengths[:n])]


def dev_figures(system, batches: list, precision: str) -> dict:
    """Label-smoothed loss (eps 0.1), NLL and perplexity per target token from the system's own
    logits, through aiayn's one dev-loss computation for every system alike (fairseq's training
    criterion spreads eps over V - 1 ids; here every row is scored the same way)."""
    from train_systems import autocast

    from aiayn.evaluation.perplexity import reference_perplexity

    r = reference_perplexity(system.model, batches, eps_ls=0.1, autocast=lambda: autocast(precision),
                             forward=system.logits)
    return {"loss": r["smoothed_per_token"], "nll": r["nll_per_token"], "ppl": r["ppl"],
            "tokens": r["n_tokens"]}


def run_row(a: argparse.Namespace) -> dict:
    import torch
    import train_systems

    from aiayn.data.dataset import ParallelDataset

    torch.set_num_threads(a.threads)
    train_set = ParallelDataset(a.data, "train")
    dev_set = ParallelDataset(a.data, "valid", info=train_set.info)
    cfg = tiny_config(train_set.src_tokenizer.vocab_size, a.warmup)
    t0 = time.perf_counter()
    system = train_systems.BUILDERS[a.worker](cfg, a.precision, seed=a.seed)
    build_s = time.perf_counter() - t0
    row = {"system": a.worker, "precision": a.precision,
           "precision_resolved": system.extra.get("precision_resolved", a.precision),
           "warmup": a.warmup, "seed": a.seed, "threads": torch.get_num_threads(),
           "max_tokens": MAX_TOKENS, **train(system, train_set, cfg, a.steps, a.seed)}
    t0 = time.perf_counter()
    batches = dev_batches(dev_set, a.dev_pairs)
    # fp32 scores the trained weights alone; the training precision is what a user would see
    row["dev"] = {p: dev_figures(system, batches, p) for p in dict.fromkeys(("fp32", a.precision))}
    params = {id(q): q.numel() for q in system.model.parameters() if q.requires_grad}
    row.update(eval_s=round(time.perf_counter() - t0, 2), build_s=round(build_s, 2),
               params=sum(params.values()), notes=system.notes,
               peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
               versions=train_systems.versions(a.worker))
    return row


# --- the run (parent process) -------------------------------------------------------------------


def fastest_peer(results_md: Path) -> str:
    """The peer with the highest TINY training tokens/s (any precision) in bench_peers.py's
    RESULTS.md, among those this script can train; fairseq when there is no such file."""
    if not results_md.exists():
        return "fairseq"
    by_name = {v: k for k, v in NAMES.items()}
    best, best_rate, section = "fairseq", -1.0, ""
    for line in results_md.read_text().splitlines():
        if line.startswith("### "):
            section = line[4:].split()[0]
        elif section == "TINY" and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            system = by_name.get(cells[0])
            try:
                rate = float(cells[2].split()[0])  # "1982 (1.01)": tok/s, then aiayn/peer
            except (IndexError, ValueError):
                continue
            if system in PEERS and rate > best_rate:
                best, best_rate = system, rate
    return best


def jobs_of(systems: list[str], precisions: list[str],
            aiayn: tuple[str, ...] = AIAYN_PRECISIONS) -> list[tuple[str, str]]:
    """(system, precision) rows: aiayn's default (bf16 autocast via "auto") and fp32, then each
    peer at each precision."""
    return [("aiayn", p) for p in aiayn] + [(s, p) for s in systems for p in precisions]


def _label(r: dict) -> tuple[str, str]:
    name = NAMES.get(r["system"], r["system"])
    prec = r["precision_resolved"]
    if r["system"] == "aiayn" and r["precision"] == "bf16":
        prec += " (auto)"  # what `aiayn train` runs by default
    return name, prec


def _aiayn_ref(rows: list[dict], precision: str) -> dict | None:
    return next((r for r in rows if r["system"] == "aiayn" and r["precision"] == precision), None)


def table(rows: list[dict]) -> str:
    """One markdown table; dev figures are the fp32 evaluation of the trained weights."""
    head = ("| system | precision | steps | train tok/s | dev loss | dev NLL | dev ppl "
            "| NLL - aiayn's |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        name, prec = _label(r)
        if r.get("error"):
            lines.append(f"| {name} | {prec} | failed: {r['error']} |" + " |" * 5)
            continue
        d = r["dev"]["fp32"]
        ref = _aiayn_ref(rows, r["precision"]) if r["system"] != "aiayn" else None
        diff = f"{d['nll'] - ref['dev']['fp32']['nll']:+.4f}" if ref and not ref.get("error") else "-"
        lines.append(f"| {name} | {prec} | {r['steps']} | {r['train_tok_per_s']:.0f} | "
                     f"{d['loss']:.4f} | {d['nll']:.4f} | {d['ppl']:.2f} | {diff} |")
    return "\n".join(lines)


def verdict(rows: list[dict]) -> tuple[bool | None, list[str]]:
    """Whether aiayn's dev NLL is no worse than every peer row's at the same precision, and one
    line per comparison. None when there was nothing to compare."""
    lines, ok = [], []
    mine = [r for r in rows if r["system"] == "aiayn" and not r.get("error")]
    for ref in mine:
        for r in rows:
            if (r["system"] == "aiayn" or r.get("error")
                    or r["precision"] != ref["precision"]):
                continue
            delta = ref["dev"]["fp32"]["nll"] - r["dev"]["fp32"]["nll"]
            ok.append(delta <= 0)
            word = "no worse than" if delta <= 0 else "WORSE than"
            lines.append(f"aiayn {_label(ref)[1]} is {word} {_label(r)[0]} {r['precision']}: "
                         f"dev NLL {delta:+.4f} nats/token (negative: aiayn lower)")
    return (all(ok) if ok else None), lines


def checks(rows: list[dict]) -> list[str]:
    """Warnings when rows are not comparable: different batches or different dev tokens."""
    good = [r for r in rows if not r.get("error")]
    out = []
    if len({r["batches_sha256"] for r in good}) > 1:
        out.append("rows trained on different batches: " +
                   ", ".join(f"{r['system']} {r['precision']} {r['batches_sha256']}" for r in good))
    if len({r["dev"]["fp32"]["tokens"] for r in good}) > 1:
        out.append("rows were scored on different numbers of dev tokens")
    return out


def render(res: dict) -> str:
    ok, lines = verdict(res["rows"])
    fp32_b16 = [_aiayn_ref(res["rows"], p) for p in PRECISIONS]
    m = res.get("machine", {})
    parts = [stamp_line({"commit": res.get("commit"), "clean": res.get("clean"),
                         "machine": f"{m.get('cpu')} ({m.get('isa')}), {m.get('nproc')} CPUs"}), "",
             f"Dev figures on the {res['dev_split']} split ({res['dev_tokens']} target tokens) after "
             f"{res['steps']} steps of TINY, {MAX_TOKENS} tokens a side per step, Eq. 3 with warmup "
             f"{res['warmup']}, seed {res['seed']}; each row's own forward pass in eval mode, fp32. "
             f"train tok/s: over the whole run's updates, {res['threads']} thread(s) (a rough "
             "figure; bench_peers.py measures throughput). Last column: the row's dev NLL minus "
             "aiayn's at the same precision (positive: aiayn lower).", "",
             table(res["rows"]), ""]
    if all(r and not r.get("error") for r in fp32_b16) and fp32_b16[1]["precision_resolved"] == "bf16":
        gap = fp32_b16[1]["dev"]["fp32"]["nll"] - fp32_b16[0]["dev"]["fp32"]["nll"]
        parts.append(f"aiayn bf16 - aiayn fp32 dev NLL: {gap:+.4f} (same seed: the cost of bf16).")
    parts += lines
    if ok is not None:
        parts.append(f"Verdict: aiayn's dev NLL is {'no worse than' if ok else 'WORSE than'} "
                     f"{'every' if ok else 'some'} peer row at the same precision (one seed).")
    parts += [f"WARNING: {w}" for w in checks(res["rows"])]
    return "\n".join(parts) + "\n"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fail(msg: str) -> None:
    """One line on stderr and exit status 2, as the aiayn CLI treats user errors."""
    print(f"bench_quality: {msg}", file=sys.stderr)
    raise SystemExit(2)


def check_data(data: Path) -> dict:
    """Fail in one line, before any worker starts, if `data` is not a usable prepared dataset."""
    from aiayn.data.dataset import load_dataset_dir
    from aiayn.errors import UserError

    try:
        info = load_dataset_dir(data)
    except UserError as e:
        fail(str(e))
    if not {"train", "valid"} <= set(info.splits):
        fail(f"{data} needs a train and a valid split, has {', '.join(info.splits)}")
    if not info.shared_vocab:
        fail(f"{data} has separate vocabularies; every system here shares and ties one "
             "(prepare it without --separate-vocab)")
    return info.manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a dataset prepared by `aiayn prepare`")
    p.add_argument("--systems", nargs="+", choices=PEERS,
                   help="peers (default: the fastest TINY trainer in benchmarks/RESULTS.md, "
                        "else fairseq)")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS,
                   help="the peers' precisions (default both)")
    p.add_argument("--steps", type=int, default=300, help="updates per system (default 300)")
    p.add_argument("--warmup", type=int, default=4000, help="Eq. 3 warmup steps (default 4000)")
    p.add_argument("--seed", type=int, default=1, help="batch order and weights (default 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpus", default="0,1", help="taskset core list (default 0,1)")
    p.add_argument("--python", type=Path, default=PEERS_PY, help="interpreter of every row")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per row (default 1800)")
    p.add_argument("--out", type=Path, help="write results.json, table.md and logs/ here")
    p.add_argument("--dev-pairs", type=int, help="score only the first N dev pairs (smoke tests)")
    p.add_argument("--worker", choices=("aiayn", *PEERS),
                   help="train and score this one system here and print its row as JSON")
    p.add_argument("--aiayn-precisions", nargs="+", default=list(AIAYN_PRECISIONS),
                   choices=AIAYN_PRECISIONS, help="aiayn's rows (default both)")
    p.add_argument("--precision", default="fp32", choices=AIAYN_PRECISIONS, help="--worker's precision")
    a = p.parse_args(argv)
    for name in ("steps", "warmup", "threads", "dev_pairs"):
        v = getattr(a, name)
        if v is not None and v < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        print(json.dumps(run_row(a)))
        return 0
    manifest = check_data(a.data)
    if not a.python.exists():
        fail(f"no {a.python}; run `bash scripts/setup_peers.sh` or give --python")
    systems = a.systems or [fastest_peer(HERE / "RESULTS.md")]
    py = str(a.python)
    logs = a.out / "logs" if a.out else None
    common = ["--data", str(a.data.resolve()), "--steps", str(a.steps), "--warmup", str(a.warmup),
              "--seed", str(a.seed), "--threads", str(a.threads)]
    if a.dev_pairs:
        common += ["--dev-pairs", str(a.dev_pairs)]
    rows = []
    jobs = jobs_of(systems, a.precisions, tuple(a.aiayn_precisions))
    for i, (s, prec) in enumerate(jobs, 1):
        say(f"[{i}/{len(jobs)}] {s} {prec}: {a.steps} steps ...")
        t0 = time.monotonic()
        cmd = [py, str(Path(__file__).resolve()), "--worker", s, "--precision", prec, *common]
        got, err = worker(cmd, a.cpus, a.threads, a.timeout, logs and logs / f"{s}-{prec}.log")
        if got is None:
            say(f"  failed ({time.monotonic() - t0:.0f} s): {err}")
            rows.append({"system": s, "precision": prec, "precision_resolved": prec, "error": err})
            continue
        d = got["dev"]["fp32"]
        say(f"  dev NLL {d['nll']:.4f} (ppl {d['ppl']:.2f}), {got['train_tok_per_s']:.0f} tok/s "
            f"({time.monotonic() - t0:.0f} s)")
        rows.append(got)
    dev_tokens = next((r["dev"]["fp32"]["tokens"] for r in rows if not r.get("error")), 0)
    res = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
           "machine": {"cpu": cpu_name(), "isa": cpu_isa(), "nproc": os.cpu_count()},
           **{k: v for k, v in stamp().items() if k != "machine"},
           "cpus": a.cpus, "threads": a.threads, "python": py, "versions": versions(a.python),
           "command": shlex.join(["python", "benchmarks/bench_quality.py", *sys.argv[1:]]),
           "data": str(a.data), "dataset_fingerprint": manifest.get("fingerprint"),
           "dev_split": "valid", "dev_tokens": dev_tokens, "steps": a.steps, "warmup": a.warmup,
           "seed": a.seed, "max_tokens": MAX_TOKENS, "rows": rows}
    res["no_worse"] = verdict(rows)[0]
    text = render(res)
    print(text, end="")
    if a.out:
        with atomic_write(a.out / "results.json") as f:
            json.dump(res, f, indent=2)
        with atomic_write(a.out / "table.md") as f:
            f.write(text)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
