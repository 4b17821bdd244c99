"""How many distinct tensor shapes a training run's batches have, and what padding costs, for each
`pad_multiple` (Config field; batch widths rounded up to a multiple).

Fewer distinct shapes let the allocator and oneDNN reuse what they made for earlier batches; the
price is padding, which takes a share of every update's token budget. This counts both on a
prepared dataset, with the sampler training uses (no training, a few seconds):

    .venv/bin/python benchmarks/batch_shapes.py --data runs/multi30k-en-de/data --max-tokens 4096
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiayn.data.batching import TokenBatchSampler, round_up  # noqa: E402
from aiayn.data.dataset import ParallelDataset  # noqa: E402


def shape_counts(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, multiple: int,
                 epochs: int, seed: int = 1) -> dict:
    """Batches per epoch, distinct (B, S) and (B, T) shapes over `epochs` epochs, the padded share
    of the token slots, and the real target tokens per batch."""
    sampler = TokenBatchSampler(src_len, tgt_len, max_tokens, seed=seed, pad_multiple=multiple)
    shapes, slots, real, tgt_real, n = set(), 0, 0, 0, 0
    for epoch in range(epochs):
        for b in sampler.epoch_batches(epoch):
            s = int(round_up(int(src_len[b].max()), multiple))
            t = int(round_up(int(tgt_len[b].max()) + 1, multiple))  # + BOS / EOS
            shapes.add((len(b), s, t))
            slots += len(b) * (s + t)
            real += int(src_len[b].sum() + tgt_len[b].sum() + len(b))
            tgt_real += int(tgt_len[b].sum() + len(b))
            n += 1
    return {"pad_multiple": multiple, "batches_per_epoch": n // epochs, "distinct_shapes": len(shapes),
            "padding": 1 - real / slots, "real_tgt_tokens_per_batch": tgt_real / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="a dataset directory of aiayn prepare")
    ap.add_argument("--max-tokens", type=int, default=4096, help="tokens per side per batch")
    ap.add_argument("--multiples", default="1,8,16", help="pad_multiple values (default 1,8,16)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs counted (default 3)")
    args = ap.parse_args()
    ds = ParallelDataset(args.data, "train")
    print(f"{args.data}: {len(ds.src_lengths):,} training pairs, max_tokens {args.max_tokens}, "
          f"{args.epochs} epochs")
    print("| pad_multiple | batches per epoch | distinct shapes | padding | real target tokens per batch |")
    print("|---|---|---|---|---|")
    for m in (int(x) for x in args.multiples.split(",")):
        r = shape_counts(ds.src_lengths, ds.tgt_lengths, args.max_tokens, m, args.epochs)
        print(f"| {m} | {r['batches_per_epoch']} | {r['distinct_shapes']} | {r['padding']:.1%} | "
              f"{r['real_tgt_tokens_per_batch']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
