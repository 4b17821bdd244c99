"""English constituency parsing (§6.3) on a Penn Treebank: the recipe's data step and presets.

The recipe (scripts/parsing.sh runs it; docs/guides/parsing.md):

    aiayn treebank --treebank treebank.zip --out corpus --slots words --signatures 3 --augment 2
    aiayn train --preset parsing-chart-small --data corpus ...; aiayn average ...   # the chart parser
    # or §6.3's sequence-to-sequence parser: prepare a dataset of the corpus first
    aiayn prepare --src-lang src --tgt-lang tree --train corpus/train --valid corpus/valid \\
        --test corpus/test --model-type word --vocab-size V ...   # one word vocabulary
    aiayn train --preset parsing-seq2seq-small ...; aiayn average ...
    aiayn parse --model M --input corpus/test.words --output test.trees [--constrained]
    aiayn evalb --gold corpus/test.gold --test test.trees --tags-from-gold # EVALB, COLLINS.prm

V is the number of training words left, `corpus.json`'s "vocabulary". `write_corpus` writes, per
split, `SPLIT.words` (the sentence, words separated by spaces), `SPLIT.tree` (the linearized
tree: the target) and `SPLIT.gold` (the cleaned tree on one line, for scoring), line-aligned, and
with signatures `SPLIT.src` (the source as the model reads it; `aiayn parse` maps a sentence's
words the same way, so it takes `SPLIT.words`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from aiayn.config import PRESETS as PAPER_PRESETS
from aiayn.errors import UserError
from aiayn.files import atomic_write
from aiayn.parsing.augment import substitute
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.linearize import linearize
from aiayn.parsing.signatures import replace_rare
from aiayn.parsing.treebank import DEFAULT_SPLITS, read_treebank, split_treebank, tree_line

# §6.3's sequence-to-sequence parser at the size of the 10% WSJ sample on 2 CPU cores: 3+3 pre-norm
# layers of width 128 (the paper's post-norm encoder collapses to one vector on this data),
# dropout 0.15, source word dropout 0.1, a warmup fit for a run of a few thousand updates;
# decoding stays §6.3's (beam 21, alpha 0.3, outputs up to input + 300). Chosen on dev, with the
# target's words, signatures, augmentation and constrained search of scripts/parsing.sh
# (docs/experiments/parsing.md).
PARSING_SEQ2SEQ_SMALL = replace(PAPER_PRESETS["parsing"], n_layers=3, d_model=128, d_ff=512, n_heads=4,
                                p_drop=0.15, p_word_drop=0.1, norm="pre", warmup_steps=500,
                                max_tokens=2048, lr_cooldown=0.2)

PRESETS = {
    # the chart parser (not in the paper; aiayn/parsing/chart/): ChartConfig's defaults, chosen
    # on dev (docs/experiments/parsing.md)
    "parsing-chart-small": ChartConfig(),
    "parsing-seq2seq-small": PARSING_SEQ2SEQ_SMALL,
}

SOURCE, TARGET, GOLD = "words", "tree", "gold"  # corpus file suffixes; also prepare's "languages"
MODEL_SOURCE = "src"  # with signatures: the source as the model reads it (rare words as signatures)


def known_words(seen: Counter, n: int) -> set[str] | None:
    """The `n` commonest words of `seen` (word counts; ties broken by first occurrence); None
    for n = 0."""
    if n <= 0:
        return None
    return {w for w, _ in seen.most_common(n)}


def write_corpus(treebank: str | Path, out_dir: str | Path, splits: str | None = None,
                 slots: str = "xx", target_words: int = 0, signatures: int = 0,
                 augment: int = 0, augment_seed: int = 1) -> dict:
    """Read, clean and split a treebank, write each split's files (module docstring) and
    `corpus.json` (counts and settings); returns what it wrote there. With slots="words" and
    `target_words` > 0, only the training set's `target_words` commonest words are written in
    the targets, others as XX. With `signatures` > 0 (not in the paper) each split also gets
    `SPLIT.src`, the source with the words seen fewer than `signatures` times in training
    written as their signatures (aiayn/parsing/signatures.py), and XX in the targets; a word is
    then in the vocabulary exactly when it was seen `signatures` times, which is what `aiayn
    parse` asks (`model_inputs`). `vocabulary` in corpus.json counts the distinct tokens of
    train.src and train.tree, plus the 4 specials. With `augment` > 0 (not in the paper) the
    train files also hold `augment` rounds of new trees made by subtree substitution
    (aiayn/parsing/augment.py), after the treebank's; word counts, and so signatures and the
    target's words, come from the treebank's trees alone."""
    spec = splits or DEFAULT_SPLITS
    parts = split_treebank(read_treebank(treebank), spec)
    out = Path(out_dir)
    train = parts["train"].trees if "train" in parts else []
    if signatures > 0 and not train:
        raise UserError("signatures need a train split: they are given to the words rarer there")
    seen = Counter(w for t in train for w in t.leaves())
    known = known_words(seen, target_words) if train else None
    if signatures > 0:  # a word the source writes as its signature is XX in the target, so the
        common = {w for w, n in seen.items() if n >= signatures}  # vocabulary never holds it
        known = common if known is None else known & common
    if augment > 0 and not train:
        raise UserError("--augment needs a train split: it makes new trees from its trees")
    made = substitute(train, augment, augment_seed)
    if made:
        parts["train"].trees = train + made
    info: dict = {"treebank": str(treebank), "splits": spec, "slots": slots,
                  "target_words": target_words, "signatures": signatures,
                  "augment": augment, "augment_seed": augment_seed, "counts": {}}
    for name, split in parts.items():
        columns = {
            SOURCE: [" ".join(t.leaves()) for t in split.trees],
            TARGET: [" ".join(linearize(t, slots, known)) for t in split.trees],
            GOLD: [tree_line(t) for t in split.trees],
        }
        if signatures > 0:
            columns[MODEL_SOURCE] = [" ".join(replace_rare(t.leaves(), common)) for t in split.trees]
        if name == "train":
            train_columns = columns
        for suffix, lines in columns.items():
            with atomic_write(out / f"{name}.{suffix}") as f:
                f.write("".join(line + "\n" for line in lines))
        info["counts"][name] = {"files": len(split.files), "sentences": len(split.trees),
                                "words": sum(len(t.leaves()) for t in split.trees),
                                "dropped_empty": split.dropped,
                                "first_file": split.files[0], "last_file": split.files[-1]}
        if name == "train":
            info["counts"][name]["augmented"] = len(made)  # of the sentences and words above
    if "train" in parts:  # the target vocabulary: these symbols and the 4 specials
        target = {tok for line in train_columns[TARGET] for tok in line.split()}
        info["train_target_symbols"] = len(target)
        if signatures > 0:
            source = {w for line in train_columns[MODEL_SOURCE] for w in line.split()}
            info["vocabulary"] = len(source | target) + 4
    with atomic_write(out / "corpus.json") as f:
        json.dump(info, f, indent=2)
    return info
