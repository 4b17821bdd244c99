"""Compare `aiayn evalb` with EVALB's C program on the same files, number for number.

    python tools/evalb_compare.py --evalb /path/to/evalb --prm /path/to/COLLINS.prm \
        --gold corpus/valid.gold [--test trees.txt | --corrupt 0.15]

EVALB is not shipped by any package registry we know of; build it from its C source (`gcc -O2 -o
evalb evalb.c`). With `--corrupt P` the test trees are made from the gold ones: each gold tree is
linearized with its real tags, each token is dropped, duplicated or swapped with its neighbour
with probability P, and the result is delinearized over the gold words, which gives realistic
parser errors (misattachments, missing and extra constituents, unary chains); the gold tags are
put back on the words. Exits 1 if any
per-sentence row or summary figure differs.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from aiayn.parsing.evalb import evalb, format_report, read_params
from aiayn.parsing.linearize import delinearize, linearize
from aiayn.parsing.treebank import parse_tree, tree_line


def corrupt(gold_lines: list[str], p: float, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for line in gold_lines:
        tree = parse_tree(line)
        toks = linearize(tree, "tags")
        noisy: list[str] = []
        for tok in toks:
            r = rng.random()
            if r < p / 3:
                continue
            noisy.append(tok)
            if r < 2 * p / 3:
                noisy.append(tok)
            elif r < p and len(noisy) > 1:
                noisy[-1], noisy[-2] = noisy[-2], noisy[-1]
        noisy_tree = delinearize(noisy, tree.leaves())[0]
        # the gold tags back on every word, so that both sides delete the same punctuation
        for pos, (_, tag) in zip(noisy_tree.treepositions("leaves"), tree.pos()):
            noisy_tree[pos[:-1]].set_label(tag)
        out.append(tree_line(noisy_tree))
    return out


def numbers(report: str) -> tuple[list[list[str]], dict[str, str]]:
    """Per-sentence rows (their numbers) and the summary's `name = value` figures, by block."""
    rows = [line.split()[:12] for line in report.splitlines() if re.match(r"\s*\d+\s+\d+\s+\d\s", line)]
    summary, block = {}, ""
    for line in report.splitlines():
        if line.startswith("-- "):
            block = line.strip("- ")
        m = re.match(r"(.+?)\s+=\s+(\S+)", line)
        if m and block:
            summary[f"{block}: {m.group(1).strip()}"] = m.group(2)
    return rows, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--evalb", required=True, help="EVALB's compiled C program")
    ap.add_argument("--prm", required=True, help="its parameter file (COLLINS.prm)")
    ap.add_argument("--gold", required=True)
    ap.add_argument("--test", help="test trees (default: corrupted gold trees, --corrupt)")
    ap.add_argument("--corrupt", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gold = Path(args.gold).read_text(encoding="utf-8").splitlines()
    test = (Path(args.test).read_text(encoding="utf-8").splitlines() if args.test
            else corrupt(gold, args.corrupt, args.seed))
    with tempfile.TemporaryDirectory() as tmp:
        g, t = Path(tmp) / "gold", Path(tmp) / "test"
        g.write_text("".join(x + "\n" for x in gold), encoding="utf-8")
        t.write_text("".join(x + "\n" for x in test), encoding="utf-8")
        theirs = subprocess.run([args.evalb, "-e", "1000000", "-p", args.prm, str(g), str(t)], capture_output=True,
                                text=True, check=True).stdout
    ours = format_report(evalb(gold, test, read_params(args.prm)))
    (rows_c, sum_c), (rows_p, sum_p) = numbers(theirs), numbers(ours)
    bad = [f"row {i + 1}: EVALB {a} aiayn {b}" for i, (a, b) in enumerate(zip(rows_c, rows_p)) if a != b]
    if len(rows_c) != len(rows_p):
        bad.append(f"EVALB printed {len(rows_c)} rows, aiayn {len(rows_p)}")
    bad += [f"{k}: EVALB {v} aiayn {sum_p.get(k)}" for k, v in sum_c.items() if sum_p.get(k) != v]
    print(f"{len(rows_c)} sentences, {len(sum_c)} summary figures compared; "
          f"{len(bad)} difference(s)")
    for line in bad[:20]:
        print("  " + line)
    for k in ("All: Bracketing FMeasure", "len<=40: Bracketing FMeasure", "All: Complete match"):
        print(f"  {k}: EVALB {sum_c.get(k)}, aiayn {sum_p.get(k)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
