"""`aiayn parse`: sentences in, bracketed trees out, with a chart parser (`--preset
parsing-chart-small`, not in the paper: CKY over span scores) or a model trained on linearized
trees (§6.3, `--preset parsing-seq2seq-small`: beam search).

    aiayn parse --model runs/chart/model --input sentences.txt --output trees.txt
    echo "The cat sat on the mat ." | aiayn parse --model runs/parsing/model

Input: one sentence a line, words separated by spaces (tokenized as the treebank is: `do n't`,
`-LRB-`). Output: one tree a line, `(S (NP (XX The) (XX cat)) ...)`, over exactly the input's
words (a blank line gives a blank line). A sequence-to-sequence parser reads and writes as it
goes, as `aiayn translate` does (groups of `STREAM_LINES` lines; from a pipe each group's trees
are flushed at once); a chart parser reads its whole input first (its --votes files align with
it). The model's output is turned into a tree whatever it is: unbalanced brackets are closed,
missing word slots added, extra ones dropped; the repairs are counted on stderr. Search defaults
come from the model's config: §6.3's beam 21, alpha 0.3, outputs up to input + 300 tokens. Not in the paper: `--constrained` restricts the search to
well-formed trees over exactly the input's words (then no repairs are needed), and several
`--model` directories (trained on one `aiayn prepare` output) parse as their ensemble. A model
trained with `aiayn treebank --signatures` reads the words its vocabulary lacks as their
signatures (aiayn/parsing/signatures.py); nothing to pass.

A chart parser's every tree is well formed over exactly the input's words, so it needs no
repairs; of the search and hardware options it reads --device, and --precision auto or fp32
(it computes in fp32), and refuses the others in one line.
"""

from __future__ import annotations

import argparse
import sys

from aiayn.commands.common import (
    STREAM_LINES,
    add_search_arguments,
    check_precision,
    given,
    input_groups,
    read_input,
    search_settings,
    set_examples,
    torch_device,
    translator_from_args,
)
from aiayn.decoding import DECODE_PRECISIONS


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn parse --model runs/chart/model --input corpus/test.words --output test.trees",
                 "echo 'The cat sat on the mat .' | aiayn parse --model runs/chart/model",
                 "aiayn parse --model runs/parsing/model --input sentences.txt --constrained",
                 about=__doc__.split("\n\n", 2)[2])
    p.add_argument("--model", required=True, nargs="+", metavar="DIR",
                   help="model directory (from train/average); several: their ensemble, the mean "
                        "of their next-token probabilities (not in the paper; "
                        "aiayn/decoding/ensemble.py)")
    p.add_argument("--input", "-i", metavar="FILE", help="one sentence a line (default: stdin)")
    p.add_argument("--output", "-o", metavar="FILE", help="where to write the trees (default: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    p.add_argument("--linearized", metavar="FILE",
                   help="also write the model's raw outputs (linearized trees) here")
    p.add_argument("--constrained", action="store_true",
                   help="not in the paper: let the search write only well-formed trees over "
                        "exactly the input's words, so nothing is repaired "
                        "(aiayn/parsing/constrain.py)")
    p.add_argument("--votes", nargs="+", metavar="FILE",
                   help="chart parsers only (not in the paper): other parsers' trees of the same "
                        "input, one file per parser, one tree a line; each of their labelled "
                        "spans adds --vote-weight to that span's score before CKY")
    p.add_argument("--vote-weight", type=float, default=1.0, metavar="W",
                   help="what each voted span adds to its label's log-probability gain (default 1)")
    p.add_argument("--progress", action="store_true",
                   help="show progress on stderr: a bar at a terminal (the default there), a "
                        "line every 30 seconds in a log")
    add_search_arguments(p, nbest=False)


def main(args: argparse.Namespace) -> int:
    from aiayn.data.model_dir import read_config
    from aiayn.errors import UserError
    from aiayn.files import check_writable
    from aiayn.parsing.chart.files import is_chart_model
    from aiayn.parsing.constrain import TreeVocabulary

    check_precision(args, DECODE_PRECISIONS, "parse")  # before reading any model
    charts = [is_chart_model(m) for m in args.model]
    if any(charts):
        if not all(charts):
            raise UserError("--model: chart parsers (--preset parsing-chart-small) and "
                            "sequence-to-sequence models cannot parse as one ensemble")
        return _chart_main(args)
    if args.votes:
        raise UserError("--votes needs chart parsers (--preset parsing-chart-small) as --model")
    settings = search_settings(args, read_config(args.model[0]))
    for path in (args.output, args.linearized):
        if path is not None:
            check_writable(path, args.overwrite)
    groups = input_groups(args.input, STREAM_LINES)
    translator = translator_from_args(args, "parse", settings)  # an ensemble shares its tokenizers
    if not bool((TreeVocabulary.from_tokenizer(translator.tgt_tokenizer).open_label >= 0).any()):
        raise UserError(f"{translator.loaded.path}: not a parser: its target vocabulary has no "
                        f"tree brackets (such as `(NP` and `)NP`); parsers train on the "
                        f"linearized trees of aiayn treebank")
    n, seconds, repairs = _stream(args, translator, groups)
    print(f"aiayn parse: {n} sentences in {seconds:.1f}s ({n / max(seconds, 1e-9):.2f} "
          f"sentences/s); {repairs.summary()}", file=sys.stderr)
    return 0


def _stream(args: argparse.Namespace, translator, groups):
    """Parse each group of input lines and write its trees (and raw outputs) before reading on,
    as `aiayn translate` does: flushed, so a reader at the other end of a pipe sees them at once.
    Returns the sentences, the seconds parsing took and the repairs made."""
    import contextlib

    from aiayn.files import atomic_write
    from aiayn.parsing.linearize import Repairs
    from aiayn.parsing.parse import parse_lines
    from aiayn.progress import Progress

    n, seconds, repairs = 0, 0.0, Repairs()
    progress = args.progress or sys.stderr.isatty()
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.output is None else stack.enter_context(atomic_write(args.output))
        lin = (None if args.linearized is None
               else stack.enter_context(atomic_write(args.linearized)))
        bar = stack.enter_context(Progress(None, desc="parsing", unit="sent", enabled=progress))
        for lines in groups:
            res = parse_lines(translator, lines, constrained=args.constrained, first_line=n + 1)
            out.write("".join(t + "\n" for t in res.trees))
            out.flush()
            if lin is not None:
                lin.write("".join(o + "\n" for o in res.outputs))
            n, seconds = n + len(lines), seconds + res.seconds
            repairs.add(res.repairs)
            bar.update(len(lines))
    return n, seconds, repairs


# The options a chart parser reads; it refuses the others (the search's).
_CHART_OPTIONS = ("help", "model", "input", "output", "overwrite", "linearized", "votes",
                  "vote_weight", "progress", "device", "precision")
# A chart parser computes in fp32: its span scores feed CKY, and no bf16 path was measured.
_CHART_PRECISIONS = ("auto", "fp32")


def _chart_main(args: argparse.Namespace) -> int:
    """`aiayn parse` with chart parsers (aiayn/parsing/chart/): CKY over span scores, so every
    tree is well formed over exactly the input's words; the search options do not apply."""
    import time

    from aiayn.errors import UserError
    from aiayn.files import check_writable
    from aiayn.parsing.chart.files import load_chart
    from aiayn.parsing.chart.parse import chart_parse

    unused = given(args, [a.dest for a in args._parser._actions if a.dest not in _CHART_OPTIONS])
    if unused:
        flags = ", ".join(unused)
        raise UserError(f"{flags}: a chart parser finds its tree by CKY over span scores; the "
                        f"search options are for sequence-to-sequence parsers")
    check_precision(args, _CHART_PRECISIONS, "parse (with a chart parser)")
    device = torch_device(args.device)
    for path in (args.output, args.linearized):
        if path is not None:
            check_writable(path, args.overwrite)
    models = [load_chart(m, device) for m in args.model]
    lines = read_input(args.input)
    votes = _read_votes(args.votes, lines) if args.votes else None
    start = time.perf_counter()
    trees = chart_parse(models, lines, progress=args.progress or sys.stderr.isatty(), votes=votes,
                        vote_weight=args.vote_weight)
    seconds = time.perf_counter() - start
    _write(args, trees, trees)  # a chart parser's output is the tree itself
    print(f"aiayn parse: {len(lines)} sentences in {seconds:.1f}s "
          f"({len(lines) / max(seconds, 1e-9):.2f} sentences/s); chart parser, no repairs needed",
          file=sys.stderr)
    return 0


def _write(args: argparse.Namespace, trees: list[str], linearized: list[str]) -> None:
    """The trees to --output (atomically) or stdout, the raw outputs to --linearized if asked."""
    from aiayn.files import atomic_write

    text = "".join(t + "\n" for t in trees)
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with atomic_write(args.output) as f:
            f.write(text)
    if args.linearized is not None:
        with atomic_write(args.linearized) as f:
            f.write("".join(o + "\n" for o in linearized))


def _read_votes(paths: list[str], lines: list[str]) -> list[list]:
    """Per input line, the trees of every --votes file at that line (nltk trees); a file of
    another length, a tree that does not read, or one over other words is one error line."""
    from pathlib import Path

    from aiayn.errors import UserError
    from aiayn.parsing.treebank import parse_tree

    votes: list[list] = [[] for _ in lines]
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"--votes {p}: no such file")
        try:
            rows = p.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise UserError(f"--votes {p}: not UTF-8 ({e.reason} at byte {e.start})") from None
        if len(rows) != len(lines):
            raise UserError(f"--votes {p}: {len(rows)} lines, but the input has {len(lines)}")
        for k, (row, line) in enumerate(zip(rows, lines)):
            if not line.split():
                continue
            tree = parse_tree(row, f"{p}:{k + 1}")
            if tree.leaves() != line.split():
                raise UserError(f"{p}:{k + 1}: the tree is over other words than input line {k + 1}")
            votes[k].append(tree)
    return votes
