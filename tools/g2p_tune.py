"""Checkpoint averaging of a finished G2P run, scored on the validation words only (docs/experiments/g2p.md, the
30-minute recipe): for each N, average the run's newest N checkpoints and print valid WER and PER;
with --best, the checkpoint of the lowest dev loss (run/best) too; with --search, each model under
every listed beam size and length penalty instead of its config's. The test words are never read.

    .venv/bin/python tools/g2p_tune.py runs/g2p-30 1 2 3 5      # OUT as made by scripts/demo.sh
    .venv/bin/python tools/g2p_tune.py runs/g2p-30 5 --best --search 1,0.6 4,0 4,0.6 4,1 8,0.6
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from aiayn.errors import UserError
from aiayn.memory import tune_memory


def _search(text: str) -> tuple[int, float]:
    """'BEAM,ALPHA' -> (beam size, length penalty alpha)."""
    try:
        beam, alpha = text.split(",")
        return int(beam), float(alpha)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BEAM,ALPHA such as 4,0.6, got {text!r}") from None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the demo's work directory (holds run/ and corpus/)")
    p.add_argument("n", type=int, nargs="+", help="numbers of newest checkpoints to average")
    p.add_argument("--best", action="store_true", help="also score run/best (lowest dev loss)")
    p.add_argument("--search", nargs="+", default=[None], metavar="BEAM,ALPHA", type=_search,
                   help="decoding settings to score each model with (default: its config's)")
    a = p.parse_args()
    tune_memory()
    from aiayn.recipes.cmudict_data import read_refs
    from aiayn.recipes.g2p import evaluate_g2p
    from aiayn.training.average import average_checkpoints
    from aiayn.training.checkpoint import list_checkpoints

    try:
        corpus = a.out / "corpus"
        if not (corpus / "valid.src").is_file():
            raise UserError(f"{a.out}: no corpus/valid.src; give a directory made by scripts/demo.sh")
        words = (corpus / "valid.src").read_text(encoding="utf-8").splitlines()
        refs = read_refs(corpus / "valid.refs")
        ckpts = [d for _, d in list_checkpoints(a.out / "run")]
        if max(a.n) > len(ckpts) or min(a.n) < 1:
            raise UserError(f"{a.out / 'run'} holds {len(ckpts)} checkpoints; N must be 1 to {len(ckpts)}")
        with tempfile.TemporaryDirectory() as tmp:
            models = []
            for n in a.n:
                models.append((f"average of the last {n}", Path(tmp) / f"avg{n}"))
                average_checkpoints(ckpts[-n:], models[-1][1], overwrite=True)
            if a.best:
                if not (a.out / "run" / "best").is_dir():
                    raise UserError(f"{a.out / 'run'} has no best/ checkpoint")
                models.append(("lowest dev loss (run/best)", a.out / "run" / "best"))
            for label, model in models:
                for search in a.search:
                    beam, alpha = search or (None, None)
                    r = evaluate_g2p(model, words, refs, progress=False, beam_size=beam, alpha=alpha)
                    how = "" if search is None else f", beam {beam}, alpha {alpha:g}"
                    print(f"{label}{how}: valid WER {100 * r['wer']:.2f}%, PER {100 * r['per']:.2f}%")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
