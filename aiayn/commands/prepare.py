"""`aiayn prepare`: learn a subword vocabulary and binarize a parallel corpus into a dataset directory.

Any size: the corpus is streamed, the vocabulary learned from a sample, the encoding spread over
worker processes and written in shards; an interrupted run resumes where it stopped.
Each corpus is given as PREFIX (finds PREFIX.<src-lang> and PREFIX.<tgt-lang>, each optionally .gz
or WMT .sgm), as one FILE.tsv (source<TAB>target), or as two files SRC TGT. Only the training
corpus is cleaned; dev and test sets keep every line. Re-running with the same inputs and options
reuses the result.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from aiayn.commands.args import options_from_args
from aiayn.commands.common import add_no_progress_argument, refuse_unused, set_examples
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.data.prepare import PrepareOptions

CORPUS_HELP = "PREFIX (PREFIX.SRC_LANG + PREFIX.TGT_LANG, optionally .gz), FILE.tsv, or two files SRC TGT"


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn prepare --src-lang en --tgt-lang de --train data/multi30k/train "
                    "--valid data/multi30k/val --test data/multi30k/test_2016_flickr "
                    "--out data/m30k --vocab-size 8000",
                 "aiayn prepare --src-lang en --tgt-lang de --train corpus.tsv --out data/mine",
                 "aiayn prepare --src-lang en --tgt-lang de --train news/train --valid news/dev "
                 "--out data/news --vocab-from runs/m30k/model   # to fine-tune that model",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--src-lang", required=True, help="source language code, e.g. en")
    p.add_argument("--tgt-lang", required=True, help="target language code, e.g. de")
    p.add_argument("--train", required=True, nargs="+", metavar="PATH",
                   help=f"training corpus: {CORPUS_HELP}")
    p.add_argument("--valid", nargs="+", metavar="PATH", help="dev corpus (never filtered), same forms")
    p.add_argument("--test", nargs="+", action="append", default=[], metavar="PATH",
                   help="test corpus (never filtered), same forms; repeat for more (splits test, test2, ...)")
    p.add_argument("--out", required=True, metavar="DIR", help="dataset directory to create")
    p.add_argument("--vocab-from", metavar="MODEL_DIR",
                   help="encode with this model's sentencepiece model(s) instead of learning a "
                        "vocabulary: data to fine-tune that model on (aiayn train --init-from); "
                        "the vocabulary options below then do not apply")
    p.add_argument("--vocab-size", type=int, default=8000,
                   help="subword vocabulary size including 4 specials (default 8000; the paper's WMT "
                        "EN-DE used about 37000)")
    p.add_argument("--separate-vocab", action="store_true",
                   help="one vocabulary per language instead of the paper's shared one (untied embeddings)")
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram", "char", "word"],
                   help="sentencepiece model (default bpe, as the paper)")
    p.add_argument("--tgt-model-type", default=None, choices=["bpe", "unigram", "char", "word"],
                   help="with --separate-vocab: the target side's own model type (e.g. char in, "
                        "word out for grapheme-to-phoneme)")
    p.add_argument("--tgt-vocab-size", type=int, default=None, metavar="N",
                   help="with --separate-vocab: the target vocabulary's own size (default: --vocab-size)")
    p.add_argument("--max-len", type=int, default=250,
                   help="drop training pairs with a side longer than this many subword tokens (0: no "
                        "limit; default 250)")
    p.add_argument("--max-ratio", type=float, default=9.0,
                   help="drop training pairs whose longer side has more than this many times the "
                        "tokens of the shorter (0: no limit; default 9)")
    p.add_argument("--vocab-sample", type=int, default=None, metavar="N",
                   help="learn the vocabulary from a seeded random sample of N training pairs "
                        "(default 500000; 0: from every pair). Corpora of at most N pairs are "
                        "learned from whole")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="encoding processes (default: one per CPU core)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing dataset in --out")
    add_no_progress_argument(p)


def prepare_options(args: argparse.Namespace) -> PrepareOptions:
    """`PrepareOptions` from the parsed arguments: each field from the option of its name (one
    not given: the field's default, whose reasons are written there); the tokenizer's byte
    fallback and character coverage stay at their defaults."""
    from aiayn.data.prepare import PrepareOptions  # loads torch, as in main

    return options_from_args(PrepareOptions, args, defaults=("byte_fallback", "character_coverage"))


def main(args: argparse.Namespace) -> int:
    # these load numpy and torch: imported here so that --help and a mistyped option answer at once
    from aiayn.data.corpus import find_parallel
    from aiayn.data.prepare import format_summary, prepare_dataset

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if args.vocab_from is not None:
        refuse_unused(args, ["vocab_size", "separate_vocab", "model_type", "tgt_model_type",
                             "tgt_vocab_size", "vocab_sample"],
                      f"--vocab-from {args.vocab_from} encodes with that model's vocabulary")
    options = prepare_options(args)
    options.check()
    splits = {"train": find_parallel(args.train, args.src_lang, args.tgt_lang)}
    if args.valid:
        splits["valid"] = find_parallel(args.valid, args.src_lang, args.tgt_lang)
    for i, values in enumerate(args.test):
        splits["test" if i == 0 else f"test{i + 1}"] = find_parallel(values, args.src_lang, args.tgt_lang)
    if args.workers is not None and args.workers < 0:
        raise UserError(f"--workers must be >= 0 (0: encode in this process), got {args.workers}")
    result = prepare_dataset(args.out, splits, options, overwrite=args.overwrite, log=log,
                             workers=args.workers, progress=not args.no_progress)
    print(format_summary(result))
    return 0
