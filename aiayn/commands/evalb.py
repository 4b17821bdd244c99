"""`aiayn evalb`: labelled bracket precision, recall and F1 of test trees against gold trees,
exactly as EVALB computes them with COLLINS.prm (aiayn/parsing/evalb.py): one tree per line in
both files; corpus totals, complete match, crossing brackets, and the same for sentences of at
most 40 words; per-sentence rows as EVALB prints them.
"""

from __future__ import annotations

import argparse
import json
import sys

from aiayn.commands.common import set_examples
from aiayn.parsing.evalb import COLLINS, evalb, format_report, read_params, retag_from_gold


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn evalb --gold corpus/test.gold --test test.trees",
                 "aiayn evalb --gold corpus/test.gold --test test.trees --summary --json",
                 "aiayn evalb --gold corpus/test.gold --test test.trees --tags-from-gold   # XX-tagged output")
    p.add_argument("--gold", required=True, metavar="FILE", help="gold trees, one per line")
    p.add_argument("--test", required=True, metavar="FILE", help="trees to score, one per line")
    p.add_argument("--prm", metavar="FILE",
                   help="an EVALB parameter file instead of the built-in COLLINS.prm settings")
    p.add_argument("--tags-from-gold", action="store_true",
                   help="give each test word the gold tag at its position: EVALB uses tags only to "
                        "delete punctuation, and a parser trained on tags normalised to XX has none; "
                        "this deletes the same words on both sides, brackets untouched")
    p.add_argument("--summary", action="store_true", help="only the summary, no per-sentence rows")
    p.add_argument("--json", action="store_true", help="print the totals as one JSON object")


def main(args: argparse.Namespace) -> int:
    from aiayn.data.corpus import read_lines  # loads numpy: here, so that --help answers at once

    params = read_params(args.prm) if args.prm else COLLINS
    gold, test = read_lines(args.gold), read_lines(args.test)
    if args.tags_from_gold:
        test = [retag_from_gold(t, g) for t, g in zip(test, gold)]
    res = evalb(gold, test, params)
    bad = [n for n, sent in enumerate(res.sentences, 1) if sent.status == "error"]
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        print(f"aiayn evalb: warning: {len(bad)} of {len(test)} test trees could not be scored "
              f"(unreadable, or over other words than the gold tree: {args.test} lines {shown}); "
              f"EVALB counts them as error sentences, outside the bracket scores", file=sys.stderr)
    if args.json:
        print(json.dumps({"all": res.all.as_dict(), f"len<={res.cutoff_len}": res.short.as_dict()},
                         indent=2))
    else:
        print(format_report(res, per_sentence=not args.summary))
    return 0
