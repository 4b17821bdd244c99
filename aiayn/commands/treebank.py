"""`aiayn treebank`: a Penn Treebank (a directory or a zip of .mrg files) -> the parsing corpus.

Cleans every tree (traces and the constituents they leave empty removed, function tags and
indices stripped, the outer empty bracket dropped: aiayn/parsing/treebank.py), splits by file
number and writes, per split, SPLIT.words (the sentence: the source), SPLIT.tree (the
linearized tree, §6.3: the target) and SPLIT.gold (the cleaned tree on one line, for `aiayn
evalb`), plus corpus.json; with --signatures also SPLIT.src, the source as the model reads it
(rare words as signatures); with --augment, the train files also hold new trees made by
subtree substitution (aiayn/parsing/augment.py). Then `aiayn prepare --src-lang words --tgt-lang
tree --train OUT/train ...` (`--src-lang src` with signatures; scripts/parsing.sh runs the whole
recipe).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.checks import read_json
from aiayn.commands.common import set_examples
from aiayn.errors import UserError
from aiayn.parsing.treebank import DEFAULT_SPLITS, parse_split_spec
from aiayn.recipes.parsing import GOLD, MODEL_SOURCE, SOURCE, TARGET, write_corpus


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn treebank --treebank treebank.zip --out corpus",
                 "aiayn treebank --treebank treebank.zip --out corpus --signatures 3 --augment 2",
                 "aiayn treebank --treebank wsj/ --out corpus "
                 "--splits train=200-2199,valid=2200-2299,test=2300-2399",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--treebank", required=True, metavar="PATH",
                   help="a directory or a zip holding PTB-format .mrg files (searched recursively)")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write the corpus files")
    p.add_argument("--splits", default=DEFAULT_SPLITS, metavar="SPEC",
                   help=f"file-number ranges per split (default {DEFAULT_SPLITS}: the NLTK 10%% "
                        "sample; the full WSJ's sections 02-21/22/23 are files 200-2199/2200-2299/2300-2399)")
    p.add_argument("--slots", default="xx", choices=["xx", "tags", "words"],
                   help="what stands for each word in the target: xx (default: every "
                        "part-of-speech tag normalised to XX, as Vinyals et al.), tags (the real "
                        "tags), or words (the word itself; not in the paper)")
    p.add_argument("--target-words", type=int, default=0, metavar="K",
                   help="with --slots words: write only the K commonest training words in the "
                        "targets, the others as XX (default 0: every word)")
    p.add_argument("--signatures", type=int, default=0, metavar="N",
                   help="not in the paper: also write SPLIT.src, the source with every word seen "
                        "fewer than N times in training as its signature (shape and suffix, "
                        "`UNK-Cap-ing`: aiayn/parsing/signatures.py); default 0: off")
    p.add_argument("--augment", type=int, default=0, metavar="K",
                   help="not in the paper: add K rounds of new training trees, each a training "
                        "tree with one phrase swapped for another of the same label from the "
                        "training set (aiayn/parsing/augment.py); default 0: off")
    p.add_argument("--augment-seed", type=int, default=1, metavar="S",
                   help="the random seed of --augment (default 1)")
    p.add_argument("--overwrite", action="store_true", help="replace corpus files already in --out")


def corpus_files(splits: str, signatures: int) -> set[str]:
    """The names `aiayn treebank --splits SPLITS --signatures N` writes in --out."""
    suffixes = (SOURCE, TARGET, GOLD) + ((MODEL_SOURCE,) if signatures > 0 else ())
    return {f"{name}.{s}" for name in parse_split_spec(splits) for s in suffixes} | {"corpus.json"}


def check_out(out, splits: str, signatures: int, overwrite: bool) -> None:
    """Refuse, before any work, to replace a file of --out that an earlier `aiayn treebank` there
    did not write (its corpus.json names them), and an earlier corpus without --overwrite."""
    existing = sorted(n for n in corpus_files(splits, signatures) if (out / n).exists())
    if not existing:
        return
    if not (out / "corpus.json").is_file():
        raise UserError(f"{out / existing[0]} exists and was not written by aiayn treebank (there "
                        f"is no {out}/corpus.json); choose another --out or move it away")
    if not overwrite:
        raise UserError(f"{out} already holds a corpus; pass --overwrite to replace it")
    old = read_json(out / "corpus.json", {"splits": str, "?signatures": int})
    ours = corpus_files(old["splits"], old.get("signatures", 0))
    foreign = [n for n in existing if n not in ours]
    if foreign:
        raise UserError(f"{out / foreign[0]} is not a file of the corpus in {out} (its corpus.json "
                        f"does not list it); --overwrite replaces only what aiayn treebank wrote: "
                        f"move it away, or choose another --out")


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    check_out(out, args.splits, args.signatures, args.overwrite)
    if args.target_words < 0:
        raise UserError(f"--target-words must be >= 0, got {args.target_words}")
    if args.signatures < 0:
        raise UserError(f"--signatures must be >= 0, got {args.signatures}")
    if args.augment < 0:
        raise UserError(f"--augment must be >= 0, got {args.augment}")
    info = write_corpus(args.treebank, out, args.splits, args.slots, args.target_words,
                        args.signatures, args.augment, args.augment_seed)
    for name, c in info["counts"].items():
        made = f", {c['augmented']:,} of them made by --augment" if c.get("augmented") else ""
        print(f"{name}: {c['sentences']:,} sentences, {c['words']:,} words from {c['files']} files "
              f"({c['first_file']} .. {c['last_file']}){made}")
    print(f"target symbols in train: {info.get('train_target_symbols')} "
          f"(word slots: {args.slots}); wrote {out}/corpus.json")
    if args.signatures:
        print(f"source with signatures (words seen < {args.signatures} times): SPLIT.src; "
              f"a shared word vocabulary holds {info['vocabulary']} pieces")
    return 0
