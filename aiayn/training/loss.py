"""Label-smoothed cross-entropy (§5.4) and the plain negative log-likelihood beside it.

§5.4 cites Szegedy et al. (2016), whose smoothed target mixes the one-hot reference with a uniform
distribution over the K classes, the reference among them: q(k) = (1 - eps) [k == y] + eps / K.
Here the classes are the K = V - 2 ids that can ever be a target: PAD (padding, never predicted)
and BOS (only ever the decoder's first input) get no smoothing mass, every other id eps / K, the
reference included (so it receives 1 - eps + eps / K):

    q(k) = (1 - eps) * [k == y] + eps / K * [k not in {PAD, BOS}]
    smoothed = -sum_k q(k) log p(k) = (1 - eps) * nll + eps * mean_{k not PAD, BOS}(-log p(k))

written in the second form so no (N, V) target matrix is ever built. (fairseq and the Annotated
Transformer spread eps over all V ids; Tensor2Tensor over the V - 1 ids other than the reference.)
Padding positions (target == PAD) contribute nothing. Everything is computed in float32 whatever
the logits' dtype (bf16/fp16 logits lose too much precision in log-softmax over large V).

The computation, with its hand-written gradient, is `aiayn.kernels.loss` (`SmoothedCrossEntropy`;
`token_losses`, the per-token terms, for evaluation); the tests compare it with this definition
written with a one-hot target matrix.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from aiayn.kernels.loss import SmoothedCrossEntropy
from aiayn.special import PAD_ID


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (divide by `n_tokens` for means)."""

    smoothed: Tensor  # scalar float32: the training objective, summed
    nll: Tensor  # scalar float32: plain -log p(reference), summed (for perplexity)
    n_tokens: Tensor  # scalar int64: non-padding target tokens


def label_smoothed_loss(logits: Tensor, target: Tensor, eps: float, pad_id: int = PAD_ID) -> LossSums:
    """logits: (B, T, V) or (N, V); target: (B, T) or (N,) ids, `pad_id` where padded.

    Returns summed label-smoothed loss and summed NLL over non-padding positions (§5.4), computed
    in float32 from logits of any float dtype.
    """
    flat = logits.reshape(-1, logits.size(-1))  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != pad_id  # (N,)
    smoothed, nll = SmoothedCrossEntropy.apply(flat, target, keep, float(eps))
    return LossSums(smoothed, nll, keep.sum())


def label_smoothed_mean(logits: Tensor, target: Tensor, eps: float, pad_id: int = PAD_ID
                        ) -> tuple[Tensor, Tensor]:
    """(smoothed, nll) each averaged per non-padding target token; a convenience for one batch.
    The trainer works with sums, normalised by the tokens of the whole accumulated batch."""
    s = label_smoothed_loss(logits, target, eps, pad_id)
    n = s.n_tokens.clamp(min=1).float()
    return s.smoothed / n, s.nll / n
