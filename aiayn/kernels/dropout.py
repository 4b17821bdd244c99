"""Dropout (Srivastava et al., 2014) as the Transformer applies it (§5.4), with a faster mask on CPU.

PyTorch's CPU dropout draws one Bernoulli sample per element through a generic sampler, a sizeable
share of a small model's training step at the recipes' dropout rates. This module draws 64 random
bits at a time and compares them 16 bits per element against a threshold, which is several times
faster (measured in docs/experiments/performance.md). The keep probability becomes the nearest
multiple of 1/65536 to 1 - p (at most 7.6e-6 away) and kept values are scaled by the inverse of
*that* probability, so E[dropout(x)] = x exactly, as in inverted dropout. On CUDA, and outside
training, `torch.nn.functional.dropout` is used unchanged (its fused kernel is already fast).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

_LEVELS = 1 << 16  # int16 values: -32768 .. 32767, all equally likely


def keep_threshold(p: float) -> tuple[int, float]:
    """(threshold, keep probability): an int16 draw r keeps its element when r < threshold."""
    kept_levels = round((1.0 - p) * _LEVELS)
    return kept_levels - _LEVELS // 2, kept_levels / _LEVELS


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> tuple[Tensor, float]:
    """A bool mask of `shape` keeping each element with probability ~(1 - p), and that exact
    probability. Uses the default generator (seeded by torch.manual_seed, saved on checkpoints)."""
    threshold, keep = keep_threshold(p)
    n = math.prod(shape)
    # from=-2**63, to=None: all 64 bits random; plain random_() leaves the sign bit 0, which
    # would bias every fourth element
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    r = words.view(torch.int16)[:n].view(shape)  # uniform int16, one per element
    return r < threshold, keep


class _MaskedScale(torch.autograd.Function):
    """y = x * mask / keep; the same mask and scale on the way back."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return x * mask * scale

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask * ctx.scale, None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout with probability p (§5.4); identity when not training or p == 0."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    mask, keep = keep_mask(x.shape, p, x.device)
    return _MaskedScale.apply(x, mask, 1.0 / keep)

