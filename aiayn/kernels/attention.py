"""How attention is computed where aiayn chooses the kernel: Eq. 1 (§3.2.1) written out for a CPU
training step with short keys, with its own float32 softmax; Eq. 1 written out for a CPU decoding
step in float32; and the kernels a GPU search decodes with. The definition is
`aiayn.model.attention` (`masked_scores`, `explicit_attention`); the tests compare these paths
with it and with PyTorch's fused kernel.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.kernels.dropout import dropout

# Every SDPA kernel but cuDNN's (`decoding_kernels`).
_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# Longest key sequence for which unfused attention trains faster on a CPU in float32 than the
# flash kernel, forward + backward: faster at the keys of words and sentences, slower beyond,
# where the (B, h, T, S) weights outgrow the cache (measured in docs/experiments/performance.md,
# "CPU fast paths of the training step").
MATH_MAX_KEYS_FP32 = 128


def unfused_training(q: Tensor, k: Tensor) -> bool:
    """Whether a training step's attention (gradients on, CPU) is Eq. 1 written out
    (`training_attention`) instead of PyTorch's fused (flash) kernel: the flash kernel's blocking
    and its backward's recomputation cost more than they save for the short sequences of
    translation batches. Always in bf16 (where the fused kernel made a whole training step
    slower, docs/experiments/performance.md); in float32 up to `MATH_MAX_KEYS_FP32` keys. Same
    mathematics, rounding aside."""
    if q.device.type != "cpu" or not torch.is_grad_enabled():
        return False
    bf16 = q.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                         and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    return bf16 or k.size(-2) <= MATH_MAX_KEYS_FP32


class _RowSoftmax(torch.autograd.Function):
    """softmax over the last dim, computed in float32 as whole-tensor passes (max, exp, sum,
    divide) with its own backward, y * (g - sum(g * y)); the weights come out in the scores'
    dtype (bf16 under autocast, as the product with V takes them). Hand-written because PyTorch's
    CPU softmax kernel is slow on rows as short as a training step's (9-26 keys for
    Multi30k and G2P), and its unfused SDPA kernel, which ran here before, adds a check for fully
    masked rows and float32 copies under bf16 autocast: a bf16 training step is faster with this
    path than with that kernel, a float32 one level (benchmarks/bench_step.py; measured in
    docs/experiments/performance.md). A fully masked row gets weights 0, as SDPA gives it."""

    @staticmethod
    def forward(ctx, scores: Tensor) -> Tensor:
        x = scores.float()
        # A fully masked row has max -inf; clamping it keeps exp(-inf - max) at 0, not NaN.
        e = (x - x.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).min)).exp_()
        y = e.div_(e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny))
        ctx.save_for_backward(y)  # float32: the backward's products in full precision
        return y.to(scores.dtype)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        gf = g.float()
        return (y * (gf - (gf * y).sum(dim=-1, keepdim=True))).to(g.dtype)


def training_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
                       dropout_p: float) -> Tensor:
    """Eq. 1 for a CPU training step with short keys (where `unfused_training` says so): the
    products in the autocast dtype, the softmax computed in float32 (`_RowSoftmax`), aiayn's
    dropout on the weights. q: (B, h, T, d_k), k: (B, h, S, d_k), v: (B, h, S, d_v), mask
    broadcastable to (B, h, T, S), True = may attend; returns (B, h, T, d_v).

    The scores are `aiayn.model.attention.masked_scores`'s, computed again here because the
    kernels sit below the model (the tests compare the two paths, outputs and gradients)."""
    t = q.size(-2)
    if is_causal and mask is None:  # §3.2.3: query i sees keys j <= i
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, S), §3.2.1, Eq. 1
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = dropout(_RowSoftmax.apply(scores), dropout_p, True)  # (B, h, T, S)
    return w @ v  # (B, h, T, d_v)


def decoding_kernels(device: torch.device):
    """The attention kernels for incremental decoding on `device`, as a context around a whole
    search (entering one per attention call costs more host time than a GPU decoding step takes).
    On a GPU, PyTorch's default choice in bf16 is cuDNN's attention, which builds a plan for every
    new shape, and incremental decoding makes a new shape at every step (one more key, fewer rows
    as sentences finish), which made bf16 decoding several times slower on a GPU than without it
    (measured in docs/experiments/decoding.md). Elsewhere: PyTorch's choice."""
    return sdpa_kernel(_NO_CUDNN) if device.type == "cuda" else contextlib.nullcontext()


def unfused_decoding(q: Tensor) -> bool:
    """Whether a decoding step attends with Eq. 1 written out (`aiayn.model.attention.
    explicit_attention`) instead of the fused kernel: on CPU in float32, where the fused (flash)
    kernel's blocking costs more than it saves for the one query per row of a decoding step (its
    keys are the few positions decoded so far, or a sentence's source for its k beams; measured
    at Multi30k's decoding shapes in docs/experiments/decoding.md). The fused kernel everywhere
    else (GPU, bf16)."""
    return q.device.type == "cpu" and q.dtype == torch.float32
