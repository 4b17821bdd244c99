"""`aiayn parse`: sentences in, bracketed trees out, with a model trained on linearized trees (§6.3).

    aiayn parse --model runs/parsing/model --input sentences.txt --output trees.txt
    echo "The cat sat on the mat ." | aiayn parse --model runs/parsing/model

Input: one sentence a line, words separated by spaces (tokenized as the treebank is: `do n't`,
`-LRB-`). Output: one tree a line, `(S (NP (XX The) (XX cat)) ...)`, over exactly the input's
words (a blank line gives a blank line). The model's output is turned into a tree whatever it
is: unbalanced brackets are closed, missing word slots added, extra ones dropped; the repairs
are counted on stderr. Search defaults come from the model's config: §6.3's beam 21, alpha 0.3,
outputs up to input + 300 tokens. Not in the paper: `--constrained` restricts the search to
well-formed trees over exactly the input's words (then no repairs are needed), and several
`--model` directories (trained on one `aiayn prepare` output) parse as their ensemble. A model
trained with `aiayn treebank --signatures` reads the words its vocabulary lacks as their
signatures (aiayn/parsing/signatures.py); nothing to pass.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    from aiayn.commands.translate import add_search_arguments

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
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
    p.add_argument("--progress", action="store_true",
                   help="show a progress bar on stderr (default: when stderr is a terminal)")
    add_search_arguments(p)


def main(args: argparse.Namespace) -> int:
    from aiayn.commands.translate import decode_precision, read_input, search_options, torch_device
    from aiayn.decoding.ensemble import load_models
    from aiayn.decoding.translate import SearchOptions, Translator
    from aiayn.errors import UserError
    from aiayn.io import atomic_write, check_writable
    from aiayn.model.io import read_config
    from aiayn.parsing.parse import parse_lines

    options = search_options(args)
    try:
        SearchOptions(**options).validate(read_config(args.model[0]))
    except ValueError as e:
        raise UserError(str(e)) from None
    if options["nbest"] > 1:
        raise UserError("--nbest is not supported by parse: one tree per sentence")
    for path in (args.output, args.linearized):
        if path is not None:
            check_writable(path, args.overwrite)
    device = torch_device(args.device)
    precision = decode_precision(args, device)
    lines = read_input(args.input)
    try:
        translator = Translator(load_models(args.model, device), precision=precision,
                                max_src_tokens=args.max_src_tokens,
                                warn=lambda m: print(f"aiayn parse: warning: {m}", file=sys.stderr),
                                **options)
    except ValueError as e:
        raise UserError(str(e)) from None
    res = parse_lines(translator, lines, progress=args.progress or sys.stderr.isatty(),
                      constrained=args.constrained)
    text = "".join(t + "\n" for t in res.trees)
    if args.output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with atomic_write(args.output) as f:
            f.write(text)
    if args.linearized is not None:
        with atomic_write(args.linearized) as f:
            f.write("".join(o + "\n" for o in res.outputs))
    print(f"aiayn parse: {len(lines)} sentences in {res.seconds:.1f}s "
          f"({res.sentences_per_second:.2f} sentences/s); {res.repairs.summary()}", file=sys.stderr)
    return 0
