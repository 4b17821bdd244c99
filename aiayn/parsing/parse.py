"""Sentences in, trees out: beam search (§6.3 settings from the model's config: beam 21,
alpha 0.3, output length up to input + 300) over linearized trees, then `delinearize`, which
always gives a tree over exactly the sentence's words and counts its repairs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from aiayn.parsing.constrain import TreeVocabulary, tree_constraints
from aiayn.parsing.linearize import Repairs, delinearize
from aiayn.parsing.signatures import model_inputs
from aiayn.parsing.treebank import tree_line


@dataclass
class ParseResult:
    """Tree lines in input order (an empty line for a blank input), the repairs made and the
    outputs (linearized, as the model wrote them)."""

    trees: list[str]
    repairs: Repairs = field(default_factory=Repairs)
    outputs: list[str] = field(default_factory=list)
    seconds: float = 0.0


# Brackets inside words would break the bracketed output; the treebank writes them this way.
PTB_ESCAPES = {"(": "-LRB-", ")": "-RRB-"}


def ptb_escape(line: str) -> str:
    """`f ( x )` -> `f -LRB- x -RRB-`: words that are brackets, as the Penn Treebank writes them;
    a bracket inside a longer word is replaced the same way."""
    return " ".join("".join(PTB_ESCAPES.get(c, c) for c in w) for w in line.split())


def trees_from_outputs(lines: Sequence[str], outputs: Sequence[str]) -> tuple[list[str], Repairs]:
    """Delinearize each output over its sentence's whitespace-separated words."""
    repairs = Repairs()
    trees = []
    for line, out in zip(lines, outputs, strict=True):
        words = line.split()
        if not words:
            trees.append("")
            continue
        tree, fix = delinearize(out, words)
        repairs.add(fix)
        trees.append(tree_line(tree))
    return trees, repairs


def parse_lines(translator: Any, lines: Sequence[str], progress: bool = False,
                constrained: bool = False, first_line: int = 1) -> ParseResult:
    """Parse tokenized sentences (one per line, words separated by spaces; brackets become
    -LRB- and -RRB-) with a `aiayn.decoding.translate.Translator` over a model trained on
    linearized trees. `constrained` (not in the paper): the search writes only well-formed trees
    over exactly each sentence's words (`aiayn.parsing.constrain`). A model trained with
    signatures reads the words its vocabulary lacks as their signatures
    (`aiayn.parsing.signatures`); the trees are over the words as given. `first_line`: the
    number of `lines[0]` in warnings (a group of a longer input)."""
    lines = [ptb_escape(line) for line in lines]
    t0 = time.perf_counter()
    constraint = None
    if constrained:
        constraint = tree_constraints(TreeVocabulary.from_tokenizer(translator.tgt_tokenizer), lines)
    outputs = translator.translate(model_inputs(lines, translator.src_tokenizer), progress=progress,
                                   first_line=first_line, constraint=constraint)
    seconds = time.perf_counter() - t0
    trees, repairs = trees_from_outputs(lines, outputs)
    return ParseResult(trees, repairs, list(outputs), seconds)
