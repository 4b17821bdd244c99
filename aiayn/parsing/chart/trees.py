"""Trees as labelled spans and back, and CKY (aiayn/parsing/chart/__init__.py).

Fenceposts and spans: a sentence of n words has fenceposts 0..n; the span (i, j), i < j, holds
words i+1..j. Label 0 is "no constituent" (`NONE`); a unary chain (`S -> VP`) is one label,
`S+VP`; part-of-speech tags are not predicted (they are normalized to XX as in the
sequence-to-sequence target, and EVALB reads the gold tags with `--tags-from-gold`).

Decoding treats the spans as independent: a tree's log-probability is the sum of log p(label)
over its spans plus log p(none) over all others, so CKY maximizes the sum, over the spans of a
binary bracketing, of max(0, max_label log p(label) - log p(none)): a span whose best is "none"
is one of the binarization's helper nodes and is dissolved. The whole sentence always gets a
label. CKY is written here (numpy, one vectorized max over split points per span) because no
package the field uses does it for a score tensor.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

NONE = "<none>"  # label 0: the span is not a constituent


def tree_spans(tree) -> list[tuple[int, int, str]]:
    """The labelled spans (i, j, label) of an nltk tree, parents before children: preterminals
    left out, a unary chain one label joined by `+`, top first (`S+VP`)."""
    out: list[tuple[int, int, str]] = []

    def walk(node, i: int) -> int:
        if isinstance(node, str) or (len(node) == 1 and isinstance(node[0], str)):
            return i + 1
        chain = [node.label()]
        while len(node) == 1 and not (len(node[0]) == 1 and isinstance(node[0][0], str)):
            node = node[0]
            chain.append(node.label())
        at = len(out)
        out.append((i, i, ""))  # filled once the end is known
        j = i
        for child in node:
            j = walk(child, j)
        out[at] = (i, j, "+".join(chain))
        return j

    walk(tree, 0)
    return out


def cky(span_scores: np.ndarray) -> list[tuple[int, int]]:
    """The binary bracketing of fenceposts 0..n whose spans' scores sum highest: `span_scores`
    (n+1, n+1), the score of span (i, j) at [i, j] (i < j). Returns its 2n - 1 spans (i, j), the
    whole sentence first, then preorder. Ties break to the leftmost split."""
    n = span_scores.shape[0] - 1
    best = np.zeros((n + 1, n + 1))
    split = np.zeros((n + 1, n + 1), dtype=np.int64)
    for length in range(1, n + 1):
        for i in range(0, n - length + 1):
            j = i + length
            if length == 1:
                best[i, j] = span_scores[i, j]
                continue
            inner = best[i, i + 1:j] + best[i + 1:j, j]  # split at k = i+1 .. j-1
            k = int(np.argmax(inner))
            split[i, j] = i + 1 + k
            best[i, j] = span_scores[i, j] + inner[k]
    spans: list[tuple[int, int]] = []
    stack = [(0, n)]
    while stack:
        i, j = stack.pop()
        spans.append((i, j))
        if j - i > 1:
            k = int(split[i, j])
            stack.append((k, j))
            stack.append((i, k))
    return spans


def spans_to_tree(words: Sequence[str], spans: Sequence[tuple[int, int, str]], tag: str = "XX") -> str:
    """The one-line tree over `words` from labelled spans that do not cross (the whole sentence
    among them), each word under a `tag` preterminal; `A+B` labels become a unary chain."""
    order = sorted(spans, key=lambda s: (s[0], -s[1]))
    leaves = [f"({tag} {w})" for w in words]

    def build(lo: int, hi: int, items: list) -> list[str]:
        parts, k, p = [], 0, lo
        while k < len(items):
            i, j, label = items[k]
            parts.extend(leaves[p:i])
            inner, k = [], k + 1
            while k < len(items) and items[k][1] <= j:
                inner.append(items[k])
                k += 1
            text = " ".join(build(i, j, inner))
            for lab in reversed(label.split("+")):
                text = f"({lab} {text})"
            parts.append(text)
            p = j
        parts.extend(leaves[p:hi])
        return parts

    return " ".join(build(0, len(words), order))


def decode_tree(log_probs: np.ndarray, words: Sequence[str], labels: Sequence[str],
                votes: np.ndarray | float | None = None) -> str:
    """The tree CKY finds in one sentence's (n+1, n+1, L) label log-probabilities, plus `votes`
    ((n+1, n+1, L), or one number for all) added to each label's score over "none" where given
    (`span_votes`)."""
    n = len(words)
    gain = log_probs[..., 1:] - log_probs[..., :1]  # (n+1, n+1, L-1): over "none"
    if votes is not None:
        gain = gain + (votes[..., 1:] if isinstance(votes, np.ndarray) else votes)
    best_label = gain.argmax(-1) + 1  # (n+1, n+1)
    best_gain = gain.max(-1)
    keep = np.maximum(best_gain, 0.0)
    keep[0, n] = best_gain[0, n]  # the whole sentence is always a constituent
    chosen = []
    for i, j in cky(keep):
        if (i, j) == (0, n) or best_gain[i, j] > 0:
            chosen.append((i, j, labels[int(best_label[i, j])]))
    return spans_to_tree(words, chosen)


def span_votes(trees: Sequence, n: int, labels: Sequence[str], weight: float) -> np.ndarray:
    """(n+1, n+1, L): `weight` for every labelled span of every tree in `trees` (other parsers'
    trees of one sentence of n words, nltk trees), summed; a label the model does not have
    adds nothing (the chart can only write its own labels)."""
    index = {lab: k for k, lab in enumerate(labels)}
    votes = np.zeros((n + 1, n + 1, len(labels)))
    for tree in trees:
        for i, j, lab in tree_spans(tree):
            if lab in index:
                votes[i, j, index[lab]] += weight
    return votes
