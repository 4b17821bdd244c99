"""`aiayn average`: average the parameters of the last N checkpoints into one model directory
(§6.1: the base models average the last 5 checkpoints, written at 10-minute intervals; big the
last 20).

"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.commands.common import set_examples
from aiayn.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn average --run runs/m30k --out runs/m30k/model    # last n_average checkpoints",
                 "aiayn average --run runs/m30k --last 3 --out avg3",
                 "aiayn average --inputs runs/a/checkpoints/step_009000 "
                 "runs/a/checkpoints/step_010000 --out avg")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", nargs="+", metavar="CKPT_DIR", help="model directories to average")
    src.add_argument("--run", metavar="RUN_DIR", help="a training run: average its newest checkpoints")
    p.add_argument("--last", type=int, metavar="N",
                   help="with --run: how many of the newest checkpoints (default: the config's n_average)")
    p.add_argument("--out", required=True, metavar="OUT_DIR", help="model directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR model directory")


def main(args: argparse.Namespace) -> int:
    # these load torch (a second here): imported here so that --help and a mistyped option answer at once
    from aiayn.tasks import read_model_config
    from aiayn.training.average import average_checkpoints
    from aiayn.training.checkpoint import list_checkpoints

    if args.last is not None and args.last < 1:
        raise UserError(f"--last must be >= 1, got {args.last}")
    if args.inputs:
        if args.last is not None:
            raise UserError("--last goes with --run, not --inputs")
        inputs = [Path(p) for p in args.inputs]
    else:
        ckpts = [d for _, d in list_checkpoints(args.run)]
        if not ckpts:
            raise UserError(f"{args.run}: no checkpoints (expected {args.run}/checkpoints/step_*)")
        n = args.last or read_model_config(ckpts[-1]).n_average
        if n > len(ckpts):
            raise UserError(f"{args.run} has {len(ckpts)} checkpoint(s), fewer than the {n} to average; "
                            f"pass --last {len(ckpts)} or fewer")
        inputs = ckpts[-n:]
    out = average_checkpoints(inputs, args.out, overwrite=args.overwrite, read_config=read_model_config)
    print(f"averaged {len(inputs)} checkpoint(s) into {out}: " + ", ".join(p.name for p in inputs))
    return 0
