"""`aiayn study table3`: the paper's Table 3 (model variations) rerun at CPU scale, every row as
the same change the paper made applied to a scaled study base, all rows with the same updates
and batches; then the report (table, JSON, CSV, plots) in OUT/report/. docs/guides/table3.md says
how each row is scaled, docs/experiments/table3.md has the results.

`aiayn study table1`: Table 1 measured on this CPU, per layer kind (self-attention, restricted
self-attention, recurrent, convolutional) against the sequence length n: time, FLOPs, activation
memory, sequential operations and path lengths, into OUT/complexity.json and its report
OUT/complexity.md and .png (aiayn/recipes/table1.py; docs/experiments/complexity.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from aiayn.commands.args import options_from_args
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
from aiayn.recipes.table3_report import report
from aiayn.recipes.table3_study import RunOptions, StudySettings, plan, run_study


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(
        p, "aiayn study table3 --data data/m30k-en-de --out runs/table3          # the whole study",
        "aiayn study table3 --data data/m30k-en-de --out runs/table3          # again: resumes it",
        "aiayn study table3 --data data/m30k-en-de --out runs/t3 --rows A1 B16  # some rows only",
        "aiayn study table3 --data data/m30k-en-de --out runs/t3 --rows base --seeds 2  # one seed",
        "aiayn study table3 --out runs/table3 --report-only                   # gather, no training",
        "aiayn study table3 --data DIR --out DIR --device cuda --set n_layers=6 d_model=512 d_ff=2048",
        "aiayn study table1 --out runs/table1 --set n_max=1024      # Table 1, n = 16 to 1024",
        "aiayn study table1 --out runs/table1                       # Table 1 (about 5 minutes)",
        about=__doc__)
    p.add_argument("study", choices=["table3", "table1"], help="the study to run")
    p.add_argument("--data", metavar="DATASET_DIR", help="a dataset made by aiayn prepare")
    p.add_argument("--out", required=True, metavar="STUDY_DIR",
                   help="study directory (table3: study.json, runs/<row>/, report/; table1: "
                        "complexity.json, .md, .png)")
    p.add_argument("--rows", nargs="+", metavar="ROW",
                   help="Table 3 rows to run (default: all): base A1 A4 A16 A32 B16 B32 C-N2 ...")
    p.add_argument("--seeds", nargs="+", type=int, metavar="S",
                   help="seeds of the base row (default: 1 2 3); other rows use seed 1")
    p.add_argument("--max-steps", type=int, metavar="N",
                   help="updates of every row (default: the table3 preset's max_steps)")
    retire(p, "--updates", new="--max-steps N")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="table3: overrides of the study base (preset table3), every row scales "
                        "with it; table1: its settings (d, heads, r=R1,R2, k, batch, n_min, n_max, "
                        "fit_from, path_n_max, min_seconds)")
    p.add_argument("--eval-every", type=int, default=200, metavar="K",
                   help="updates between dev evaluations, the learning curves (default 200)")
    p.add_argument("--eval-bleu-sentences", type=int, default=0, metavar="N",
                   help="greedy dev BLEU on N sentences at each evaluation (default 0: none)")
    p.add_argument("--save-every", type=int, default=100, metavar="M",
                   help="updates between checkpoints, what a kill can lose (default 100)")
    add_device_argument(p)
    add_precision_argument(p)  # of training; the dev figures are measured in fp32
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: gather the finished rows in --out and write the report")
    add_no_progress_argument(p)
    p.add_argument("--json", action="store_true", help="print results.json on stdout")


def main(args: argparse.Namespace) -> int:
    if args.study == "table1":
        return table1(args)
    if not args.report_only:
        if args.data is None:
            raise UserError("--data is required (or --report-only to gather a study)")
        check_train_precision(args, "study")
        if args.device is not None:
            torch_device(args.device)  # one line for a device this machine lacks
        for name in ("max_steps", "eval_every", "save_every", "threads"):
            v = getattr(args, name)
            if v is not None and v < (0 if name == "eval_every" else 1):
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        base = load_config("table3", overrides=args.set)
        if args.max_steps is not None:
            base = replace(base, max_steps=args.max_steps)
        settings = options_from_args(StudySettings, args, base=base, defaults=("beam_size", "dev_split"))
        options = options_from_args(RunOptions, args, progress=not args.no_progress, defaults=("say",))
        run_study(args.data, args.out, plan(args.rows, args.seeds), settings, options)
    doc = report(args.out)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print(f"{len(doc['rows'])} run(s) gathered; report in {args.out}/report/ "
              f"(table3.md, results.json, results.csv, table3.png, curves.png)")
    return 0


def table1(args: argparse.Namespace) -> int:
    """Table 1 measured (aiayn/recipes/table1.py), or with --report-only its report redrawn."""
    from aiayn.recipes.table1 import RESULT_FILE, Settings, run  # loads torch: see cli.py

    for name in ("data", "rows", "seeds", "max_steps"):
        if getattr(args, name) is not None:
            raise UserError(f"--{name.replace('_', '-')} is Table 3's; Table 1 takes "
                            f"--set NAME=VALUE of its settings")
    if args.device not in (None, "cpu"):
        raise UserError(f"--device {args.device}: Table 1 is measured on the CPU")
    if args.precision not in ("auto", "fp32"):
        raise UserError(f"--precision {args.precision}: Table 1 is measured in fp32")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    result = run(args.out, Settings.from_overrides(args.set), args.report_only, args.threads,
                 progress=not args.no_progress)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(f"Table 1 {'redrawn' if args.report_only else 'measured'}: {args.out}/complexity.md "
              f"and .png, the figures in {args.out}/{RESULT_FILE}")
    return 0
