"""`aiayn demo`: grapheme-to-phoneme on CMUdict, trained and evaluated on this machine, offline."""

from __future__ import annotations

import argparse

from aiayn.training import PRECISIONS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/g2p-demo", help="work directory (default runs/g2p-demo)")
    p.add_argument("--preset", default="g2p-small", help="model preset (default g2p-small)")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="config overrides")
    p.add_argument("--minutes", type=float, default=7.5,
                   help="training time budget in minutes (default 7.5: the whole demo stays "
                        "under 10 minutes on 2 cores)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", default="auto", choices=list(PRECISIONS),
                   help="training arithmetic (default auto: bf16 where the CPU has native bf16)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--retrain", action="store_true",
                   help="train from scratch even if OUT already holds a model or a run")
    p.add_argument("--max-train-words", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--n-valid", type=int, default=2000, help=argparse.SUPPRESS)
    p.add_argument("--n-test", type=int, default=6000,
                   help="held-out test words (default 6000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def main(args: argparse.Namespace) -> int:
    import json
    import sys

    from aiayn.errors import UserError
    from aiayn.presets import load_config
    from aiayn.recipes.g2p import format_results, run_g2p

    if args.minutes <= 0:
        raise UserError(f"--minutes must be > 0, got {args.minutes}")
    cfg = load_config(args.preset, overrides=args.set)
    results = run_g2p(args.out, cfg, args.preset, args.set, minutes=args.minutes,
                      seed=args.seed, threads=args.threads, precision=args.precision, retrain=args.retrain,
                      max_train_words=args.max_train_words, n_valid=args.n_valid,
                      n_test=args.n_test, progress=not args.no_progress,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(results, indent=2) if args.json else format_results(results))
    return 0
