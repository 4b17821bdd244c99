"""sacreBLEU and chrF on detokenized text, through the sacrebleu library, with their signatures.

Today's standard for reporting: the metric does its own
tokenization, so numbers are comparable across systems; the signature records the settings.

sacrebleu is imported when a score is computed: the package `aiayn.evaluation` imports this
module, and what imports the package for other metrics (G2P error rates) need not pay for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiayn.evaluation.bleu import BleuResult


@dataclass(frozen=True)
class ChrfResult:
    """chrF score (0..100) with the metric's name (e.g. `chrF2`) and sacrebleu signature."""

    score: float
    name: str
    signature: str


def _check(hyps: Sequence[str], refs: Sequence[str]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")


def sacre_bleu(
    hyps: Sequence[str],
    refs: Sequence[str],
    lowercase: bool = False,
    tokenize: str = "13a",
) -> BleuResult:
    """sacreBLEU (default settings: 13a tokenization, exp smoothing) against one reference each.

    sacrebleu fails on an empty corpus, so that is scored as one blank line: 0, with a signature.
    """
    from sacrebleu.metrics import BLEU

    _check(hyps, refs)
    metric = BLEU(lowercase=lowercase, tokenize=tokenize)
    s = metric.corpus_score(list(hyps) or [""], [list(refs) or [""]])
    signature = str(metric.get_signature())
    return BleuResult(
        score=s.score,
        precisions=tuple(s.precisions),
        bp=s.bp,
        ratio=s.ratio,
        sys_len=s.sys_len,
        ref_len=s.ref_len,
        counts=tuple(s.counts),
        totals=tuple(s.totals),
        signature=signature,
    )


def chrf(hyps: Sequence[str], refs: Sequence[str], lowercase: bool = False) -> ChrfResult:
    """chrF (character n-gram F-score, beta = 2, sacrebleu defaults) against one reference each."""
    from sacrebleu.metrics import CHRF

    _check(hyps, refs)
    metric = CHRF(lowercase=lowercase)
    score = metric.corpus_score(list(hyps) or [""], [list(refs) or [""]]).score  # as sacre_bleu
    signature = str(metric.get_signature())
    name = f"chrF{metric.beta}" + ("+" * metric.word_order)
    return ChrfResult(score=score, name=name, signature=signature)
