"""`aiayn plot`: the paper's pictures and a run's curves, as PNG, SVG or PDF (by --output's
suffix).

`schedule` draws Eq. 3 for every combination of the given d_model and warmup values. `curves`
reads RUN_DIR/metrics.jsonl: training loss, dev perplexity and dev BLEU against updates and
against wall time. `study` reads a Table 3 results file: rows of name, params, ppl, bleu, as CSV,
TSV or JSON lines (format: aiayn/viz/records.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.commands.common import retire, set_examples
from aiayn.errors import UserError
from aiayn.files import check_writable


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--{what}: expected comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise UserError(f"--{what}: no values given")
    return values


# One example per picture, for `aiayn plot --help` and each `aiayn plot WHAT --help`.
EXAMPLES = {
    "positions": "aiayn plot positions --output pe.png --d-model 512 --positions 100",
    "schedule": "aiayn plot schedule --output lr.png --d-model 512,256 --warmup 4000,8000",
    "curves": "aiayn plot curves --run runs/m30k --output curves.png",
    "study": "aiayn plot study --results runs/table3/report/results.csv --output table3.png",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, *EXAMPLES.values(), about=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="what", metavar="WHAT", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--output", "-o", required=True, metavar="FILE",
                       help="image file: .png, .svg or .pdf")
        q.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
        retire(q, "--out", new="--output FILE")
        set_examples(q, EXAMPLES[q.prog.split()[-1]])

    q = sub.add_parser("positions", help="sinusoidal positional encodings (§3.5)")
    q.add_argument("--d-model", type=int, default=512, help="model width (default 512)")
    q.add_argument("--positions", type=int, default=100, help="positions shown (default 100)")
    q.add_argument("--dims",
                   help="dimensions drawn as curves (default: 20,100,200,300 scaled to --d-model, "
                        "wavelengths from 9 to about 1400 positions at d_model 512)")
    common(q)
    q = sub.add_parser("schedule", help="the learning-rate schedule (§5.3, Eq. 3)")
    q.add_argument("--d-model", default="512,256", help="comma-separated (default 512,256)")
    q.add_argument("--warmup", default="4000,8000", help="comma-separated (default 4000,8000)")
    q.add_argument("--steps", type=int, default=40000, help="updates shown (default 40000)")
    common(q)
    q = sub.add_parser("curves", help="a run's training curves from its metrics.jsonl")
    q.add_argument("--run", required=True, metavar="DIR",
                   help="run directory (or its metrics.jsonl)")
    q.add_argument("--title", help="figure title (default: the run directory's name)")
    common(q)
    q = sub.add_parser("study", help="the Table 3 study's results")
    q.add_argument("--results", required=True, metavar="FILE",
                   help="CSV/TSV with a header, or JSON lines: name, params, ppl, bleu per row")
    q.add_argument("--title", default="Model variations (Table 3)", help="figure title")
    common(q)


def build_figure(args: argparse.Namespace):
    """The figure `args` asks for (validated: UserError on bad values)."""
    # these load matplotlib and numpy: imported here so that --help and a mistyped option answer at once
    from aiayn.viz import plots
    from aiayn.viz.records import read_metrics, read_study

    if args.what == "positions":
        if args.dims is None:  # the same fractions of the width as 20,100,200,300 of 512
            dims = sorted({min(args.d_model - 1, round(d * args.d_model / 512))
                           for d in (20, 100, 200, 300)})
        else:
            dims = _ints(args.dims, "dims")
        if args.d_model < 2 or args.positions < 1:
            raise UserError("--d-model must be >= 2 and --positions >= 1")
        if any(not 0 <= d < args.d_model for d in dims):
            raise UserError(f"--dims must lie in 0..{args.d_model - 1}")
        return plots.positions_figure(args.d_model, args.positions, dims)
    if args.what == "schedule":
        warmups = _ints(args.warmup, "warmup")
        pairs = [(d, w) for d in _ints(args.d_model, "d-model") for w in warmups]
        if args.steps < 2 or any(d < 1 or w < 1 for d, w in pairs):
            raise UserError("--steps must be >= 2, --d-model and --warmup >= 1")
        return plots.schedule_figure(pairs, args.steps)
    if args.what == "curves":
        run = Path(args.run)
        run_dir = (run.parent if run.is_file() else run).resolve()
        title = args.title or f"Training curves: {run_dir.parent.name}/{run_dir.name}"
        return plots.curves_figure(read_metrics(run), title)
    return plots.study_figure(read_study(args.results), args.title)


def main(args: argparse.Namespace) -> int:
    from aiayn.viz.figures import save_figure  # loads matplotlib, as build_figure says

    check_writable(args.output, args.overwrite)
    if not args.output.lower().endswith((".png", ".svg", ".pdf")):
        raise UserError(f"--output {args.output}: name a .png, .svg or .pdf file")
    print(save_figure(build_figure(args), args.output))
    return 0
