"""G2P scores: word error rate against any reference, phoneme error rate against the closest."""

from __future__ import annotations

import functools
import random

import pytest

from aiayn.evaluation import edit_distance, phoneme_error_rate, word_error_rate


def slow_edit_distance(a: tuple, b: tuple) -> int:
    """The Levenshtein recursion, memoised: an independent reference for the DP."""

    @functools.lru_cache(maxsize=None)
    def d(i: int, j: int) -> int:
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


def test_edit_distance_known_cases():
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance([], ["AH", "B"]) == 2
    assert edit_distance(["K", "AE1", "T"], ["K", "AE1", "T"]) == 0
    # tokens are compared whole: AH0 vs AH1 is one substitution, not a character edit
    assert edit_distance(["AH0", "B"], ["AH1", "B"]) == 1


def test_edit_distance_matches_recursion_on_random_sequences():
    rng = random.Random(0)
    for _ in range(200):
        a = tuple(rng.choice("abc") for _ in range(rng.randint(0, 7)))
        b = tuple(rng.choice("abc") for _ in range(rng.randint(0, 7)))
        assert edit_distance(a, b) == slow_edit_distance(a, b) == edit_distance(b, a)


def test_word_error_rate_accepts_any_reference_and_ignores_spacing():
    refs = [["T AH0 M EY1 T OW2", "T AH0 M AA1 T OW2"], ["K AE1 T"], ["D AO1 G"], ["R EH1 D"]]
    hyps = ["T AH0 M AA1 T OW2", " K  AE1 T ", "D AA1 G", "R EH1"]  # 2nd variant, spacing, 2 wrong
    assert word_error_rate(hyps, refs) == pytest.approx(2 / 4)
    assert word_error_rate([r[0] for r in refs], refs) == 0.0
    assert word_error_rate([], []) == 0.0


def test_phoneme_error_rate_uses_the_closest_reference():
    refs = [["T AH0 M EY1 T OW2", "T AH0 M AA1 T OW2"], ["K AE1 T"], ["R EH1 D"]]
    hyps = ["T AH0 M AA1 T", "K AE1 T", "R EH1 D Z"]
    # word 1: 1 deletion from the 2nd variant (2 from the 1st) over its 6 phonemes;
    # word 2: exact, 3 phonemes; word 3: 1 insertion over 3 phonemes
    assert phoneme_error_rate(hyps, refs) == pytest.approx((1 + 0 + 1) / (6 + 3 + 3))


def test_phoneme_error_rate_brute_force_agreement():
    rng = random.Random(1)
    phones = ["AA1", "B", "K", "S", "T"]
    hyps, refs = [], []
    for _ in range(30):
        refs.append([" ".join(rng.choices(phones, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 3))])
        hyps.append(" ".join(rng.choices(phones, k=rng.randint(0, 6))))
    errors = length = 0
    for h, rs in zip(hyps, refs):
        # closest reference; ties resolved to the first listed
        best = min(range(len(rs)), key=lambda k: (slow_edit_distance(tuple(h.split()), tuple(rs[k].split())), k))
        errors += slow_edit_distance(tuple(h.split()), tuple(rs[best].split()))
        length += len(rs[best].split())
    assert phoneme_error_rate(hyps, refs) == pytest.approx(errors / length)


def test_tie_goes_to_the_first_reference():
    # "A" is 1 edit from both "B" (1 phoneme) and "A C" (2 phonemes)
    assert phoneme_error_rate(["A"], [["B", "A C"]]) == pytest.approx(1 / 1)
    assert phoneme_error_rate(["A"], [["A C", "B"]]) == pytest.approx(1 / 2)


def test_g2p_scores_reject_bad_input():
    with pytest.raises(ValueError):
        word_error_rate(["A"], [])
    with pytest.raises(ValueError):
        phoneme_error_rate(["A"], [[]])
    with pytest.raises(ValueError):
        word_error_rate(["A"], ["A"])  # a bare string instead of a list of pronunciations
