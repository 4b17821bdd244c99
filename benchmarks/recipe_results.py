"""A finished recipe run as a results file: what the README's results table cites.

`scripts/multi30k.sh` leaves its scores in OUT (`{valid,test}.scores.json`, the `-lc` files
lowercased, from `aiayn evaluate --json`) and its run in OUT/run (run.json, summary.json). This
gathers them, with the run's preset, precision, minutes and updates, into one JSON file stamped
with the commit, whether the tree was clean and the machine (`provenance.stamp`), and prints
the row as markdown.

    .venv/bin/python benchmarks/recipe_results.py --out-dir runs/multi30k-en-de \\
        --results benchmarks/results/m30k-2026-12-07-zen4.json

`--code DIR`: the checkout the run was made from, when that is not this one (a run started from
a clean worktree while this tree moved on); its commit and state are what the file records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from provenance import REPO, stamp, stamp_line  # noqa: E402

SPLITS = ("valid", "test")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"error: {path}: not found (is the recipe run finished?)") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"error: {path}: not JSON ({e.msg}, line {e.lineno})") from None


def gather(out_dir: Path) -> dict:
    """The run's settings and scores (module doc)."""
    run = read_json(out_dir / "run" / "run.json")
    summary = read_json(out_dir / "run" / "summary.json")
    scores = {}
    for split in SPLITS:
        cased = read_json(out_dir / f"{split}.scores.json")
        lower = read_json(out_dir / f"{split}.scores-lc.json")
        scores[split] = {"sacrebleu": cased["sacrebleu"]["score"], "chrf": cased["chrf"]["score"],
                         "signature": cased["sacrebleu"].get("signature"),
                         "lowercased_tokenized_bleu": lower["tokenized_bleu"]["score"],
                         "evaluate": cased, "evaluate_lowercase": lower}
    options = run.get("options", {})
    return {"config": run.get("config"), "time_budget_minutes": options.get("time_budget"),
            "precision": summary.get("precision"), "steps": summary.get("steps"),
            "stopped_by": summary.get("stopped_by"), "train_seconds": summary.get("train_seconds"),
            "tgt_tokens_per_s": summary.get("tgt_tokens_per_s"), "seed": run.get("seed"),
            "torch": run.get("torch"), "allocator": run.get("allocator"), "scores": scores}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", required=True, help="the recipe's OUT directory")
    p.add_argument("--results", required=True, help="the JSON file to write (not replaced)")
    p.add_argument("--code", default=str(REPO), help="the checkout the run was made from")
    p.add_argument("--name", default="Multi30k EN-DE", help="what the run is, for the row")
    p.add_argument("--preset", default="translation-tiny-v2",
                   help="the preset the run trained (the recipe's PRESET; run.json holds its config)")
    args = p.parse_args(argv)
    out = Path(args.results)
    if out.exists():
        raise SystemExit(f"error: {out} exists; choose another name")
    record = {"name": args.name, "preset": args.preset, **stamp(Path(args.code)),
              **gather(Path(args.out_dir))}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(out)
    test, valid = record["scores"]["test"], record["scores"]["valid"]
    print(stamp_line(record))
    print("| run | updates | test sacreBLEU / lc tok. BLEU | chrF | valid sacreBLEU |")
    print("|---|---|---|---|---|")
    budget = record["time_budget_minutes"]
    minutes = f"{budget:g} min" if budget is not None else "no time budget"
    print(f"| {args.name}, {record['preset']}, {minutes}, {record['precision']} | {record['steps']} | {test['sacrebleu']:.2f} / "
          f"{test['lowercased_tokenized_bleu']:.2f} | {test['chrf']:.2f} | "
          f"{valid['sacrebleu']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
