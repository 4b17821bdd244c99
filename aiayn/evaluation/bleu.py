"""Corpus BLEU on already tokenized text: the one BLEU core every tokenized score goes through.

The paper's metric (§6.1): BLEU = BP * exp(sum_n w_n log p_n), n = 1..4, w_n = 1/4, where p_n
is the corpus-level modified (clipped) n-gram precision and BP = min(1, exp(1 - r/c)), with r and
c the reference and hypothesis lengths summed over the corpus. No smoothing, as multi-bleu.perl:
a corpus with no matching n-gram of some order scores 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_ORDER = 4


@dataclass(frozen=True)
class BleuResult:
    """A corpus BLEU score with its components, in sacrebleu's units.

    `score` and `precisions` are percentages (0..100); `counts[n-1]` / `totals[n-1]` are the
    clipped matches and the hypothesis n-grams of order n; `signature` says how it was computed.
    """

    score: float
    precisions: tuple[float, ...]
    bp: float
    ratio: float
    sys_len: int
    ref_len: int
    counts: tuple[int, ...]
    totals: tuple[int, ...]
    signature: str

    def summary(self) -> str:
        """One line in the familiar form: precisions, BP, length ratio and lengths."""
        precs = "/".join(f"{p:.1f}" for p in self.precisions)
        return (f"{precs} (BP = {self.bp:.3f} ratio = {self.ratio:.3f} "
                f"hyp_len = {self.sys_len} ref_len = {self.ref_len})")


def ngram_counts(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    """Multiset of the n-grams of `tokens` (empty when the sequence is shorter than n)."""
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def clipped_matches(hyp: Sequence[str], ref: Sequence[str], n: int) -> tuple[int, int]:
    """(clipped matches, hypothesis n-grams) of order n for one sentence pair.

    Each hypothesis n-gram counts at most as often as it occurs in the reference ("modified
    precision"), so repeating a correct word earns nothing.
    """
    h, r = ngram_counts(hyp, n), ngram_counts(ref, n)
    matched = sum(min(c, r[g]) for g, c in h.items())
    return matched, max(len(hyp) - n + 1, 0)


def brevity_penalty(sys_len: int, ref_len: int) -> float:
    """BP = min(1, exp(1 - r/c)); 0 for an empty hypothesis side (c = 0)."""
    if sys_len == 0:
        return 0.0
    return min(1.0, math.exp(1.0 - ref_len / sys_len))


def corpus_bleu_from_tokens(
    hyps: Sequence[Sequence[str]],
    refs: Sequence[Sequence[str]],
    max_order: int = MAX_ORDER,
    signature: str = "tok:given|smooth:none",
) -> BleuResult:
    """Corpus BLEU of tokenized hypotheses against one tokenized reference each.

    Counts are summed over the corpus before the precisions are taken (corpus BLEU is not the
    mean of sentence BLEUs). An empty corpus, or one with no match at some order, scores 0.
    """
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    counts = [0] * max_order
    totals = [0] * max_order
    sys_len = ref_len = 0
    for hyp, ref in zip(hyps, refs):
        sys_len += len(hyp)
        ref_len += len(ref)
        for n in range(1, max_order + 1):
            m, t = clipped_matches(hyp, ref, n)
            counts[n - 1] += m
            totals[n - 1] += t
    precisions = [100.0 * m / t if t else 0.0 for m, t in zip(counts, totals)]
    bp = brevity_penalty(sys_len, ref_len)
    if min(counts) == 0:
        score = 0.0  # log 0: the geometric mean is 0, no smoothing (as multi-bleu.perl)
    else:
        # BP * exp(sum_n w_n log p_n), w_n = 1/N
        log_mean = sum(math.log(m / t) for m, t in zip(counts, totals)) / max_order
        score = 100.0 * bp * math.exp(log_mean)
    return BleuResult(
        score=score,
        precisions=tuple(precisions),
        bp=bp,
        ratio=sys_len / ref_len if ref_len else 0.0,
        sys_len=sys_len,
        ref_len=ref_len,
        counts=tuple(counts),
        totals=tuple(totals),
        signature=signature,
    )
