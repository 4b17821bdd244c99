"""Label-smoothed cross-entropy (§5.4) and the plain negative log-likelihood beside it.

Convention (the one fairseq and the Annotated Transformer use): the smoothed target distribution
puts (1 - eps) on the reference token plus eps spread *uniformly over the whole vocabulary*,
eps / V on every id (the reference included, so it receives 1 - eps + eps / V):

    q(k) = (1 - eps) * [k == y] + eps / V
    smoothed = -sum_k q(k) log p(k) = (1 - eps) * nll + eps * mean_k(-log p(k))

written in the second form so no (N, V) one-hot matrix is ever built. Tensor2Tensor instead spreads
eps over the V - 1 other ids; the difference is a factor V / (V - 1) on the smoothing term.
Padding positions (target == PAD) contribute nothing. Everything is computed in float32 whatever
the logits' dtype (bf16/fp16 logits lose too much precision in log-softmax over large V).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from aiayn.special import PAD_ID


class LossSums(NamedTuple):
    """Sums over the non-padding target tokens of a batch (divide by `n_tokens` for means)."""

    smoothed: Tensor  # scalar float32: the training objective, summed
    nll: Tensor  # scalar float32: plain -log p(reference), summed (for perplexity)
    n_tokens: Tensor  # scalar int64: non-padding target tokens


def label_smoothed_loss(logits: Tensor, target: Tensor, eps: float, pad_id: int = PAD_ID) -> LossSums:
    """logits: (B, T, V) or (N, V); target: (B, T) or (N,) ids, `pad_id` where padded.

    Returns summed label-smoothed loss and summed NLL over non-padding positions (§5.4).
    """
    lprobs = torch.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != pad_id  # (N,)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)  # (N,)
    nll = nll.masked_fill(~keep, 0.0).sum()
    if eps > 0:
        uniform = -lprobs.mean(dim=-1).masked_fill(~keep, 0.0).sum()  # sum over positions of mean_k -log p(k)
        smoothed = (1.0 - eps) * nll + eps * uniform
    else:
        smoothed = nll
    return LossSums(smoothed, nll, keep.sum())


def label_smoothed_mean(logits: Tensor, target: Tensor, eps: float, pad_id: int = PAD_ID
                        ) -> tuple[Tensor, Tensor]:
    """(smoothed, nll) each averaged per non-padding target token; a convenience for one batch.
    The trainer works with sums, normalised by the tokens of the whole accumulated batch."""
    s = label_smoothed_loss(logits, target, eps, pad_id)
    n = s.n_tokens.clamp(min=1).float()
    return s.smoothed / n, s.nll / n
