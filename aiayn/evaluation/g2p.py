"""Scores for grapheme-to-phoneme conversion (the CMUdict demo task).

A word may have several reference pronunciations (CMUdict lists variants). Pronunciations are
compared as whitespace-split phoneme sequences, so spacing differences do not count.

- word error rate (WER): the fraction of words whose hypothesis equals none of the references;
- phoneme error rate (PER): total edit distance to the closest reference of each word, divided
  by the total length of those references.

Both are fractions in [0, 1] (PER can exceed 1 when hypotheses are much longer than references);
an empty test set scores 0.
"""

from __future__ import annotations

from collections.abc import Sequence


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two token sequences (unit cost insert/delete/substitute)."""
    if len(a) < len(b):
        a, b = b, a  # keep the row as short as the shorter sequence
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        cur = [i]
        for j, y in enumerate(b, start=1):
            cur.append(min(prev[j] + 1,              # delete x
                           cur[j - 1] + 1,           # insert y
                           prev[j - 1] + (x != y)))  # substitute (free when equal)
        prev = cur
    return prev[-1]


def _check(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} reference sets")
    for i, r in enumerate(refs):
        if isinstance(r, str) or len(r) == 0:
            raise ValueError(f"reference set {i} must be a non-empty list of pronunciations")


def word_error_rate(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """Fraction of hypotheses that match none of their reference pronunciations."""
    _check(hyps, refs)
    if not hyps:
        return 0.0
    wrong = sum(h.split() not in [r.split() for r in rs] for h, rs in zip(hyps, refs))
    return wrong / len(hyps)


def phoneme_error_rate(hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """Sum of edit distances to the closest reference / sum of those references' lengths.

    Ties between equally close references go to the first listed (CMUdict lists the main
    pronunciation first).
    """
    _check(hyps, refs)
    errors = length = 0
    for h, rs in zip(hyps, refs):
        ht = h.split()
        scored = [(edit_distance(ht, r.split()), len(r.split())) for r in rs]
        # min() returns the first of equal keys, hence the tie rule above
        dist, ref_len = min(scored, key=lambda d_len: d_len[0])
        errors += dist
        length += ref_len
    if length == 0:
        if errors:
            raise ValueError("references have no phonemes, so the phoneme error rate is undefined")
        return 0.0
    return errors / length
