"""Trees as token sequences and back (§6.3, after Vinyals et al. 2015, "Grammar as a Foreign Language").

`linearize` writes a tree depth first: an opening token `(NP` per constituent, its children, then
a labelled closing token `)NP`; each word's part-of-speech tag becomes one slot token, `XX` (the
normalisation Vinyals et al. apply), or the tag itself (`slots="tags"`), or, not in the paper,
the word itself (`slots="words"`). By default the words are not in the target: the source is
the sentence.

    (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))
    -> source: The cat sat .
    -> target: (S (NP XX XX )NP (VP XX )VP XX )S

`delinearize` turns *any* token sequence back into a tree over exactly the given words, and
counts what it had to repair (`Repairs`): a model's output may be unbalanced, have too few or too
many word slots, or be empty. Every token that does not start with `(` or `)` is a word slot,
whatever its text; a slot that reads as a part-of-speech tag gives the word that tag, any other
gives it XX. The tree's words are always the input's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Container, Sequence

from aiayn.parsing.treebank import is_preterminal, tree_class

SLOT = "XX"  # the one part-of-speech symbol of the normalised target
ROOT = "S"  # label of the root added above several top-level pieces (the commonest root label)

# What `delinearize` can repair, in the order a reader meets them.
REPAIR_KINDS = (
    "empty_output",  # no tokens at all: a flat tree (S (XX w1) (XX w2) ...)
    "extra_close",  # a closing token with nothing open: ignored
    "mismatched_close",  # `)VP` closing an `(NP`: closed, keeping the opening label
    "unclosed",  # constituents still open at the end: closed there
    "extra_slots",  # word slots beyond the last word: dropped
    "missing_slots",  # words the output had no slot for: attached, in order, at the end of the root
    "empty_constituents",  # constituents over no words: dropped
    "wrapped",  # several top-level pieces (or a bare word): put under one root `S`
    "unlabelled",  # an opening token with no label, `(`: labelled `X`
)


@dataclass
class Repairs:
    """Repair counts; `sentences` counts the outputs that needed any."""

    counts: Counter = field(default_factory=Counter)
    sentences: int = 0

    def add(self, other: "Repairs") -> None:
        self.counts.update(other.counts)
        self.sentences += other.sentences

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> str:
        if not self.total:
            return "no repairs"
        kinds = ", ".join(f"{k} {self.counts[k]}" for k in REPAIR_KINDS if self.counts[k])
        return f"{self.sentences} output(s) repaired: {kinds}"


SLOT_KINDS = ("xx", "tags", "words")

# The Penn Treebank's part-of-speech tags: a word slot whose text is one of these (or XX) gives
# the word its tag; any other slot text (a word, with `slots="words"`) gives XX.
PTB_TAGS = frozenset("CC CD DT EX FW IN JJ JJR JJS LS MD NN NNS NNP NNPS PDT POS PRP PRP$ RB RBR "
                     "RBS RP SYM TO UH VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB # $ . , : `` '' "
                     "-LRB- -RRB-".split()) | {SLOT}


def linearize(tree, slots: str = "xx", known_words: Container[str] | None = None) -> list[str]:
    """Depth-first tokens of `tree` (an nltk Tree whose leaves are words), module docstring.
    `slots` says what stands for each word: "xx" (§6.3 after Vinyals et al.), "tags" (its
    part-of-speech tag) or "words" (the word itself; not in the paper, off by default: the
    decoder then sees the words it has placed, as a language model over trees does). With
    "words", a word not in `known_words` (when given) is written XX: every slot stays one token
    of a closed target vocabulary, where an unknown-word id would merge neighbouring rare words."""
    if slots not in SLOT_KINDS:
        raise ValueError(f"slots must be one of {SLOT_KINDS}, got {slots!r}")
    if is_preterminal(tree):
        if slots == "words":
            return [tree[0] if known_words is None or tree[0] in known_words else SLOT]
        return [SLOT if slots == "xx" else tree.label()]
    out = ["(" + tree.label()]
    for child in tree:
        out += linearize(child, slots, known_words)
    out.append(")" + tree.label())
    return out


def _prune(node, repairs: Counter):
    """Drop constituents over no words (counting them); None if `node` itself is empty."""
    Tree = tree_class()
    if is_preterminal(node):
        return node
    kids = [k for k in (_prune(c, repairs) for c in node) if k is not None]
    if not kids:
        repairs["empty_constituents"] += 1
        return None
    return Tree(node.label(), kids)


def delinearize(tokens: Sequence[str] | str, words: Sequence[str]) -> tuple[object, Repairs]:
    """(tree over exactly `words`, repairs): never fails. `tokens` may be a string (split on
    whitespace). With no words there is nothing to build a tree over: a ValueError."""
    Tree = tree_class()
    if not words:
        raise ValueError("delinearize needs at least one word")
    toks = tokens.split() if isinstance(tokens, str) else list(tokens)
    fix: Counter = Counter()
    if not toks:
        fix["empty_output"] += 1
        return Tree(ROOT, [Tree(SLOT, [w]) for w in words]), Repairs(fix, 1)

    top: list = []  # finished top-level pieces
    stack: list = []  # open constituents, innermost last
    n = 0  # words placed
    for tok in toks:
        if tok.startswith("("):
            label = tok[1:]
            if not label:
                fix["unlabelled"] += 1
                label = "X"
            stack.append(Tree(label, []))
        elif tok.startswith(")"):
            if not stack:
                fix["extra_close"] += 1
                continue
            node = stack.pop()
            if tok[1:] and tok[1:] != node.label():
                fix["mismatched_close"] += 1
            (stack[-1] if stack else top).append(node)
        elif n < len(words):
            (stack[-1] if stack else top).append(Tree(tok if tok in PTB_TAGS else SLOT, [words[n]]))
            n += 1
        else:
            fix["extra_slots"] += 1
    if stack:
        fix["unclosed"] += len(stack)
        while stack:
            node = stack.pop()
            (stack[-1] if stack else top).append(node)

    pieces = [p for p in (_prune(t, fix) for t in top) if p is not None]
    if len(pieces) == 1 and not is_preterminal(pieces[0]):
        root = pieces[0]
    else:
        if pieces:  # nothing at all left means the output had no slots: not a wrap, a rebuild
            fix["wrapped"] += 1
        root = Tree(ROOT, pieces)
    if n < len(words):
        fix["missing_slots"] += len(words) - n
        root.extend(Tree(SLOT, [w]) for w in words[n:])
    return root, Repairs(fix, int(bool(fix)))
