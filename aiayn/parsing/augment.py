"""Subtree substitution: more training trees from the same treebank (not in the paper, off by
default: `aiayn treebank --augment K`).

The 10% WSJ sample gives 3.4K training trees, and 30 minutes of training read each about 70
times. Shi, Livescu and Gimpel (2021, "Substructure Substitution: Structured Data Augmentation
for NLP") make new examples for low-resource parsing by swapping a constituent of a training
tree for another constituent with the same label, taken from anywhere in the training set. The
new sentence may be odd English (`the cats sits`), but every bracket of the new tree is one the
treebank drew, so its tree is as right as the treebank's: the parser sees more combinations of
phrases it knows, in contexts it knows.

Only phrasal constituents are swapped (not part-of-speech nodes, whose swap would only change a
word) and never the root. Each new tree is one substitution into one training tree, so `K`
copies give up to `K` times the training set; a swap that would make the sentence longer than
the longest training sentence is drawn again (a few tries, then that copy is skipped).
"""

from __future__ import annotations

import random
from typing import Sequence

from aiayn.parsing.treebank import is_preterminal, tree_class

TRIES = 10  # draws per new tree before giving up on it


def phrase_positions(tree) -> list[tuple[int, ...]]:
    """Tree positions of `tree`'s phrasal constituents below the root (nodes over other
    nodes, not part-of-speech nodes over a word), in pre-order."""
    Tree = tree_class()
    return [p for p in tree.treepositions()
            if p and isinstance(tree[p], Tree) and not is_preterminal(tree[p])]


def substitute(trees: Sequence, copies: int, seed: int = 1, max_words: int | None = None) -> list:
    """`copies` rounds over `trees`, each making from every tree a new one with one phrasal
    constituent (drawn uniformly among the tree's) replaced by a copy of a different constituent
    with the same label (drawn uniformly among the training set's). New sentences have at most
    `max_words` words (default: as many as the longest of `trees`). The input is not changed;
    the same trees, copies and seed give the same list."""
    if copies <= 0 or not trees:
        return []
    rng = random.Random(seed)
    positions = [phrase_positions(t) for t in trees]
    pool: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
    for i, ps in enumerate(positions):
        for p in ps:
            pool.setdefault(trees[i][p].label(), []).append((i, p))
    limit = max_words if max_words is not None else max(len(t.leaves()) for t in trees)
    out = []
    for _ in range(copies):
        for i, tree in enumerate(trees):
            if not positions[i]:
                continue
            n_words = len(tree.leaves())
            for _ in range(TRIES):
                p = rng.choice(positions[i])
                old = tree[p]
                j, q = rng.choice(pool[old.label()])
                new = trees[j][q]
                if new == old or n_words - len(old.leaves()) + len(new.leaves()) > limit:
                    continue
                made = tree.copy(deep=True)
                made[p] = new.copy(deep=True)
                out.append(made)
                break
    return out
