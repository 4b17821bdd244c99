"""Evaluation: sacreBLEU and chrF (`sacre`), the paper's tokenized BLEU (`tokenized`, on the BLEU
core in `bleu`), reference perplexity (`perplexity`) and G2P error rates (`g2p`).

Importing this package does not import torch; `reference_perplexity` loads it on first use.
"""

from __future__ import annotations

from aiayn.evaluation.bleu import BleuResult, corpus_bleu_from_tokens
from aiayn.evaluation.g2p import edit_distance, phoneme_error_rate, word_error_rate
from aiayn.evaluation.sacre import ChrfResult, chrf, sacre_bleu
from aiayn.evaluation.tokenized import multi30k_bleu, split_hyphen_compounds, tokenized_bleu

__all__ = [
    "BleuResult", "ChrfResult", "chrf", "corpus_bleu_from_tokens", "edit_distance",
    "multi30k_bleu", "phoneme_error_rate", "reference_perplexity", "sacre_bleu",
    "split_hyphen_compounds", "tokenized_bleu", "word_error_rate",
]


def __getattr__(name: str):
    if name == "reference_perplexity":
        from aiayn.evaluation.perplexity import reference_perplexity

        return reference_perplexity
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
