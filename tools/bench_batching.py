"""Cost of the input pipeline: building an epoch of token-budget batches and collating them.

Default: a synthetic dataset of Multi30k's size (29,000 pairs, 10-40 subword tokens a side) in the
same memory layout as a prepared dataset (concatenated uint16 ids + int64 offsets), so the numbers
are those of the fast collate path. `--data DIR` uses a dataset made by `aiayn prepare` instead.
Prints, per max_tokens budget, the batch count, padding fraction and milliseconds per batch for
planning and for collating, and, with `--step-preset`, that cost as a share of one training step
(forward, label-smoothed loss, backward, Adam) of that preset on the same batches (target: < 2%).

    .venv/bin/python tools/bench_batching.py --step-preset translation-tiny-v2 --max-tokens 4096
    .venv/bin/python tools/bench_batching.py --max-tokens 4096 25000 --epochs 3
    .venv/bin/python tools/bench_batching.py --plan-only --pairs 10000000   # start-up at scale

`--plan-only` times the sampler alone (no ids), this tree's against a peer revision's
(`--peer-ref`, default the last one that planned a whole epoch before its first batch): building
it, its first batch (what training start-up waits for), and a whole epoch, with the peak memory
tracemalloc traces; it checks that both cut the same batches (the same boundaries, the same
number per epoch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.data.batching import TokenBatchSampler, collate  # noqa: E402

# the last revision whose sampler sorted every pair for an epoch's plan before its first batch
PEER_REF = "3f363f4"


class SyntheticDataset:
    """Random ids in ParallelDataset's layout: `{side}_ids` concatenated, `{side}_offsets`."""

    def __init__(self, n: int, lo: int, hi: int, vocab: int, seed: int, ids: bool = True):
        rng = np.random.default_rng(seed)
        self.src_lengths = rng.integers(lo, hi + 1, n)
        # Target lengths track the source, as in translation (German ~ English + 10%).
        ratio = rng.normal(1.1, 0.15, n)
        self.tgt_lengths = np.clip(np.round(self.src_lengths * ratio), 1, None).astype(np.int64)
        for side in ("src", "tgt") if ids else ():
            lengths = getattr(self, f"{side}_lengths")
            setattr(self, f"{side}_ids", rng.integers(4, vocab, int(lengths.sum())).astype(np.uint16))
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            setattr(self, f"{side}_offsets", offsets)

    def __len__(self) -> int:
        return len(self.src_lengths)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=29_000, help="synthetic pairs (default 29000, Multi30k)")
    p.add_argument("--min-len", type=int, default=10, help="shortest synthetic source (default 10)")
    p.add_argument("--max-len", type=int, default=40, help="longest synthetic source (default 40)")
    p.add_argument("--data", help="a prepared dataset directory to use instead of synthetic data")
    p.add_argument("--split", default="train", help="split of --data (default train)")
    p.add_argument("--max-tokens", type=int, nargs="+", default=[1024, 4096, 25_000],
                   help="token budgets to try (default 1024 4096 25000)")
    p.add_argument("--epochs", type=int, default=3, help="epochs to time, best one reported (default 3)")
    p.add_argument("--world-size", type=int, default=1, help="ranks to split among (rank 0 timed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-preset", help="also time training steps of this preset (e.g. translation-tiny-v2) "
                   "and print batching's share of a step")
    p.add_argument("--steps", type=int, default=5, help="training steps timed (default 5)")
    p.add_argument("--plan-only", action="store_true",
                   help="time only the sampler (start-up, first batch, epoch), against --peer-ref")
    p.add_argument("--peer-ref", default=PEER_REF, help=f"git revision of the peer sampler (default {PEER_REF})")
    args = p.parse_args()

    if args.data:
        from aiayn.data.dataset import ParallelDataset

        ds = ParallelDataset(args.data, args.split)
        print(f"dataset: {args.data} [{args.split}], {len(ds)} pairs")
    else:
        ds = SyntheticDataset(args.pairs, args.min_len, args.max_len, 8000, args.seed,
                              ids=not args.plan_only)
        print(f"dataset: synthetic, {len(ds)} pairs, source lengths {args.min_len}-{args.max_len}")
    if args.plan_only:
        return time_plans(ds.src_lengths.astype(np.int32), ds.tgt_lengths.astype(np.int32),
                          args.max_tokens, args.peer_ref, args.seed)
    src_tokens, tgt_tokens = int(ds.src_lengths.sum()), int(ds.tgt_lengths.sum())
    print(f"tokens: {src_tokens} source, {tgt_tokens} target (without EOS/BOS)")
    print(f"{'max_tokens':>10} {'batches':>8} {'pairs/b':>8} {'padding':>8} {'init ms':>8} "
          f"{'plan ms/b':>10} {'collate ms/b':>13} {'total ms/b':>11} {'epoch ms':>9}")
    for max_tokens in args.max_tokens:
        t0 = time.perf_counter()
        sampler = TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, max_tokens, seed=args.seed,
                                    world_size=args.world_size)
        init = time.perf_counter() - t0
        best_plan = best_collate = float("inf")
        for _ in range(args.epochs):
            t0 = time.perf_counter()
            batches = list(sampler)  # a fresh epoch: new tie-breaking sort and batch order
            t1 = time.perf_counter()
            for idx in batches:
                collate(ds, idx)
            t2 = time.perf_counter()
            best_plan, best_collate = min(best_plan, t1 - t0), min(best_collate, t2 - t1)
        n = len(batches)
        plan_ms, coll_ms = best_plan * 1e3 / n, best_collate * 1e3 / n
        pairs_per_batch = len(ds) / args.world_size / n
        print(f"{max_tokens:>10} {n:>8} {pairs_per_batch:>8.1f} {sampler.padding_fraction:>8.3f} "
              f"{init * 1e3:>8.1f} {plan_ms:>10.4f} {coll_ms:>13.4f} {plan_ms + coll_ms:>11.4f} "
              f"{(best_plan + best_collate) * 1e3:>9.1f}")
        if args.step_preset:
            step_ms = time_training_step(args.step_preset, ds, batches, args.steps)
            print(f"{'':>10} training step of {args.step_preset}: {step_ms:.1f} ms; batching is "
                  f"{100 * (plan_ms + coll_ms) / step_ms:.3f}% of a step")
    return 0


def peer_module(ref: str):
    """aiayn/data/batching.py as it was at git revision `ref`, imported under its own name."""
    import importlib.util
    import subprocess
    import tempfile

    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:aiayn/data/batching.py"],
                           capture_output=True, text=True)
    if shown.returncode:
        raise SystemExit(f"--peer-ref {ref}: git cannot show its aiayn/data/batching.py here "
                         f"({shown.stderr.strip().splitlines()[-1] if shown.stderr.strip() else 'no git'})")
    source = shown.stdout
    path = Path(tempfile.mkdtemp()) / "batching_peer.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("batching_peer", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def time_plans(src: np.ndarray, tgt: np.ndarray, budgets: list[int], peer_ref: str, seed: int) -> int:
    """Sampler start-up (build + first batch), and a whole epoch, this tree's against the peer's."""
    import tracemalloc

    peer = peer_module(peer_ref)
    print(f"{'max_tokens':>10} {'sampler':>13} {'batches':>8} {'build s':>8} {'1st batch s':>12} "
          f"{'start-up s':>11} {'peak MB':>8} {'epoch s':>8}")
    same = True
    for max_tokens in budgets:
        row = {}
        for name, cls in (("this", TokenBatchSampler), (f"peer {peer_ref}", peer.TokenBatchSampler)):
            tracemalloc.start()  # a pass for memory alone: tracing slows Python-level work
            next(iter(cls(src, tgt, max_tokens, seed=seed)))
            peak = tracemalloc.get_traced_memory()[1] / 1e6
            tracemalloc.stop()
            t0 = time.perf_counter()
            sampler = cls(src, tgt, max_tokens, seed=seed)
            t1 = time.perf_counter()
            next(iter(sampler))
            t2 = time.perf_counter()
            sampler.set_epoch(1)
            t3 = time.perf_counter()
            n = sum(1 for _ in sampler)
            epoch = time.perf_counter() - t3
            row[name] = (t2 - t0, sampler.bounds)
            print(f"{max_tokens:>10} {name:>13} {n:>8} {t1 - t0:>8.2f} {t2 - t1:>12.3f} {t2 - t0:>11.2f} "
                  f"{peak:>8.0f} {epoch:>8.2f}")
            del sampler
        (a, (ta, ba)), (b, (tb, bb)) = row.items()
        same &= bool(np.array_equal(ba, bb))
        print(f"{'':>10} start-up: {b} / {a} = {tb / ta:.1f}x; same batch boundaries: {np.array_equal(ba, bb)}")
    return 0 if same else 1


def time_training_step(preset: str, ds, batches, steps: int) -> float:
    """Median milliseconds of one update (bf16 autocast where the CPU has native bf16, as
    `aiayn train` does by default) on the first batches."""
    from dataclasses import replace

    import torch

    from aiayn.model import Transformer
    from aiayn.presets import get_preset
    from aiayn.training.loss import label_smoothed_loss
    from aiayn.training.precision import resolve

    cfg = replace(get_preset(preset), vocab_size=8000)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    bf16 = resolve("auto", torch.device("cpu")) == "bf16"
    times = []
    for idx in batches[: steps + 2]:
        b = collate(ds, idx)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(b.src, b.tgt_in)
        loss = label_smoothed_loss(logits, b.tgt_out, cfg.eps_ls)[0] / b.n_tgt_tokens
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return float(np.median(times[2:])) * 1e3  # the first two warm up


if __name__ == "__main__":
    sys.exit(main())
