"""`aiayn train-chart`: train the span-based chart parser (not in the paper; aiayn/parsing/chart.py)
on a corpus made by `aiayn treebank`, for a number of minutes, and save the averaged model.

    aiayn treebank --treebank treebank.zip --out corpus --signatures 3 --augment 2
    aiayn train-chart --corpus corpus --out chart --minutes 30
    aiayn parse --model chart --input corpus/test.words --output test.trees
    aiayn evalb --gold corpus/test.gold --test test.trees --tags-from-gold

It reads SPLIT.src (the words, rare ones as their signatures; SPLIT.words without signatures)
and SPLIT.gold of the train and valid splits; the dev split gives the final span loss only.
`--set NAME=VALUE` changes the config (aiayn/parsing/chart.py, ChartConfig), e.g.
`--set d_model=256 d_ff=1024 p_drop=0.3`.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--corpus", required=True, metavar="DIR", help="a directory made by aiayn treebank")
    p.add_argument("--out", required=True, metavar="DIR", help="where to save the model")
    p.add_argument("--minutes", type=float, default=30.0, help="training time (default 30)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="stop after N updates if that comes before --minutes")
    p.add_argument("--seed", type=int, default=1, help="seed of weights, dropout and batch order")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="config changes")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from aiayn.errors import UserError
    from aiayn.parsing.chart import ChartConfig, parse_sets, train_chart

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise UserError(f"{corpus}: no such directory (make it with `aiayn treebank --out {corpus}`)")
    cfg = parse_sets(args.set, ChartConfig())
    train_chart(corpus, out, cfg, args.minutes, seed=args.seed, threads=args.threads, max_steps=args.max_steps,
                device=args.device,
                progress=not args.no_progress and sys.stderr.isatty(),
                log=lambda m: print(m, file=sys.stderr, flush=True))
    return 0
