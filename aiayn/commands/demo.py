"""`aiayn demo`: grapheme-to-phoneme on CMUdict, trained and evaluated on this machine, offline.

Writes into --out: corpus/ (the split dictionary), data/ (aiayn prepare's dataset), run/ (the
training run), model/ (its averaged checkpoints) and results.json; run again, it reuses them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aiayn.commands.common import (
    add_device_argument,
    add_no_progress_argument,
    add_precision_argument,
    check_train_precision,
    retire,
    set_examples,
    torch_device,
)
from aiayn.errors import UserError
from aiayn.presets import load_config
from aiayn.recipes.g2p import format_results, run_g2p


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn demo",
                 "aiayn translate --model runs/g2p-demo/model     # then spell words to it",
                 "aiayn demo --out runs/g2p-demo --time-budget 30 --retrain",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", default="runs/g2p-demo", metavar="DIR",
                   help="work directory (default runs/g2p-demo)")
    p.add_argument("--preset", default="g2p-small-v2", help="model preset (default g2p-small-v2)")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="config overrides")
    p.add_argument("--time-budget", type=float, default=7.5, metavar="MINUTES",
                   help="training time budget in minutes (default 7.5: the whole demo stays "
                        "under 10 minutes on 2 cores)")
    retire(p, "--minutes", new="--time-budget MINUTES")
    p.add_argument("--seed", type=int, default=1,
                   help="training's seed (weights, dropout, batch order); the split of the words "
                        "into train, valid and test is the same for every seed")
    add_precision_argument(p)  # of training; the test words are decoded in fp32
    add_device_argument(p)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--retrain", action="store_true",
                   help="train from scratch even if OUT already holds a model or a run")
    p.add_argument("--keep", type=int, metavar="K",
                   help="newest checkpoints kept (default: n_average); keep all 30 for a "
                        "learning curve (benchmarks/bleu_vs_time.py --g2p)")
    p.add_argument("--max-train-words", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--n-valid", type=int, default=2000, help=argparse.SUPPRESS)
    p.add_argument("--n-test", type=int, default=6000,
                   help="held-out test words (default 6000)")
    add_no_progress_argument(p)
    p.add_argument("--json", action="store_true", help="print the results as JSON")


# What the demo writes in --out, and in its corpus/ (aiayn/recipes/cmudict_data.py).
DEMO_NAMES = ("corpus", "data", "run", "model", "results.json")
CORPUS_NAMES = tuple(f"{split}.{kind}" for split in ("train", "valid", "test")
                     for kind in ("src", "tgt", "refs") if (split, kind) != ("train", "refs"))


def check_out(out) -> None:
    """Refuse an --out holding anything the demo does not write (it rewrites its corpus on every
    run, and --retrain replaces its run and model): a user's own directory stays untouched.
    Hidden siblings of the demo's names (locks, temporary and partial files) are its own."""
    def foreign(directory, names):
        return sorted(p.name for p in directory.iterdir() if p.name not in names
                      and not any(p.name.startswith(f".{n}.") for n in names))

    if not out.is_dir():
        return
    found = foreign(out, DEMO_NAMES)
    if not found and (out / "corpus").is_dir():
        found = [f"corpus/{n}" for n in foreign(out / "corpus", CORPUS_NAMES)]
    if found:
        raise UserError(f"{out} holds {found[0]}, which aiayn demo did not write; --out must be a "
                        f"new directory or an earlier demo's")


def main(args: argparse.Namespace) -> int:
    if args.time_budget <= 0:
        raise UserError(f"--time-budget must be > 0, got {args.time_budget}")
    if args.keep is not None and args.keep < 1:
        raise UserError(f"--keep must be >= 1, got {args.keep}")
    check_train_precision(args, "demo")
    device = str(torch_device(args.device))  # training and the test words' decoding
    cfg = load_config(args.preset, overrides=args.set)
    check_out(Path(args.out))
    results = run_g2p(args.out, cfg, args.preset, args.set, minutes=args.time_budget,
                      seed=args.seed, threads=args.threads, precision=args.precision,
                      device=device, retrain=args.retrain, keep=args.keep,
                      max_train_words=args.max_train_words, n_valid=args.n_valid,
                      n_test=args.n_test, progress=not args.no_progress,
                      log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(results, indent=2) if args.json else format_results(results))
    return 0
