"""Scaled dot-product attention and multi-head attention (§3.2).

Masks are boolean and mean "may attend" (True = allowed), as in
`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.config import Config
from aiayn.model.banded import Band, banded_attention
from aiayn.model.dropout import dropout


def masked_scores(q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
    """Q K^T / sqrt(d_k) with illegal connections set to -inf (§3.2.1, Eq. 1, before softmax).

    q: (B, h, T, d_k), k: (B, h, S, d_k), mask: broadcastable to (B, h, T, S), True = may attend.
    Returns (B, h, T, S) scores.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) (§3.2.1, Eq. 1); shapes as `masked_scores`. Returns (B, h, T, S)
    float weights."""
    return masked_scores(q, k, mask).softmax(dim=-1)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                       dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """Eq. 1 written out, returning the weights too (for visualisation and as the slow reference
    for the fused kernel). Shapes as `attention_weights`; v: (B, h, S, d_v) -> out (B, h, T, d_v)."""
    w = attention_weights(q, k, mask)
    out = F.dropout(w, dropout_p, training=dropout_p > 0) @ v  # (B, h, T, d_v)
    return out, w


def causal_mask(t: int, device: torch.device | None = None) -> Tensor:
    """(t, t) bool, True where key j <= query i: the decoder may not look ahead (§3.2.3)."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


_NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


# Longest key sequence for which unfused attention trains faster on a CPU in float32. Measured
# with PyTorch's math kernel (what ran before `training_attention`), forward + backward on a
# 2-core Xeon Skylake-SP (docs/experiments/performance.md):
# 1.4-1.8x faster than the flash kernel at 9-35 keys (G2P words, Multi30k sentences), about even
# at 64, 1.5x faster at 128 and 1.7x slower at 256, where the (B, h, T, S) weights outgrow cache.
MATH_MAX_KEYS_FP32 = 128


def unfused_training(q: Tensor, k: Tensor) -> bool:
    """Whether a training step's attention (gradients on, CPU) is Eq. 1 written out
    (`training_attention`) instead of PyTorch's fused (flash) kernel: the flash kernel's blocking
    and its backward's recomputation cost more than they save for the short sequences of
    translation batches. Always in bf16 (measured 1.6x slower per training step fused than
    unfused); in float32 up to `MATH_MAX_KEYS_FP32` keys. Same mathematics, rounding aside."""
    if q.device.type != "cpu" or not torch.is_grad_enabled():
        return False
    bf16 = q.dtype == torch.bfloat16 or (torch.is_autocast_enabled("cpu")
                                         and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    return bf16 or k.size(-2) <= MATH_MAX_KEYS_FP32


class _RowSoftmax(torch.autograd.Function):
    """softmax over the last dim, computed in float32 as whole-tensor passes (max, exp, sum,
    divide) with its own backward, y * (g - sum(g * y)); the weights come out in the scores'
    dtype (bf16 under autocast, as the product with V takes them). Hand-written because PyTorch's
    CPU softmax kernel is slow on rows as short as a training step's (9-26 keys for Multi30k and
    G2P), and its unfused SDPA kernel, which ran here before, adds a check for fully masked rows
    and float32 copies under bf16 autocast: a training step in bf16 runs 1.10x faster with this
    path than with that kernel (`translation-tiny-v2`; `g2p-small-v2` 1.22-1.27x), level in
    float32 (benchmarks/bench_step.py, docs/experiments/performance.md). A fully masked row gets
    weights 0, as SDPA gives it."""

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
    dropout on the weights. Shapes as `explicit_attention`; returns (B, h, T, d_v)."""
    if is_causal and mask is None:
        mask = causal_mask(q.size(-2), q.device)
    w = dropout(_RowSoftmax.apply(masked_scores(q, k, mask)), dropout_p, True)  # (B, h, T, S)
    return w @ v  # (B, h, T, d_v)


def decoding_kernels(device: torch.device):
    """The attention kernels for incremental decoding on `device`, as a context around a whole
    search (entering one per attention call costs more host time than a GPU decoding step takes).
    On a GPU, PyTorch's default choice in bf16 is cuDNN's attention, which builds a plan for every
    new shape, and incremental decoding makes a new shape at every step (one more key, fewer rows
    as sentences finish): `aiayn translate --precision bf16` took 47 s for Multi30k's test set on
    one H100 with it and 10.5 s without (benchmarks/gpu_decode.py measures both). Elsewhere:
    PyTorch's choice."""
    return sdpa_kernel(_NO_CUDNN) if device.type == "cuda" else contextlib.nullcontext()


def unfused_decoding(q: Tensor) -> bool:
    """Whether a decoding step attends with Eq. 1 written out (`explicit_attention`) instead of
    the fused kernel: on CPU in float32, where the fused (flash) kernel's blocking costs more than
    it saves for the one query per row of a decoding step (its keys are the few positions decoded
    so far, or a sentence's source for its k beams): 25-35% less time per call at Multi30k's
    decoding shapes (docs/experiments/decoding.md). The fused kernel everywhere else (GPU, bf16)."""
    return q.device.type == "cpu" and q.dtype == torch.float32


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
    (§3.2.2). d_k and d_v are independent of d_model / h (Table 3 rows A, B).

    The per-head projections are stored fused, as one (d_model -> h*d_k) matrix per role (the
    concatenation of the h matrices W_i^Q, and so on); self-attention fuses Q, K and V into one
    product, cross-attention K and V, which is the same mathematics with fewer kernel launches.
    """

    def __init__(self, cfg: Config, self_attention: bool):
        super().__init__()
        self.h, self.d_k, self.d_v = cfg.n_heads, cfg.head_dim_k, cfg.head_dim_v
        self.self_attention = self_attention
        self.p_attn_drop = cfg.p_attn_drop
        qk, vv = self.h * self.d_k, self.h * self.d_v
        if self_attention:
            self.qkv_proj = nn.Linear(cfg.d_model, 2 * qk + vv, bias=cfg.attn_bias)
        else:
            self.q_proj = nn.Linear(cfg.d_model, qk, bias=cfg.attn_bias)
            self.kv_proj = nn.Linear(cfg.d_model, qk + vv, bias=cfg.attn_bias)
        self.out_proj = nn.Linear(vv, cfg.d_model, bias=cfg.attn_bias)  # W^O, (h d_v x d_model)

    def _heads(self, x: Tensor, d: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.h, d).transpose(1, 2)  # (B, h, T, d)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention projections of x (B, T, d_model) -> q, k (B, h, T, d_k), v (B, h, T, d_v)."""
        qk = self.h * self.d_k
        q, k, v = self.qkv_proj(x).split([qk, qk, self.h * self.d_v], dim=-1)
        return self._heads(q, self.d_k), self._heads(k, self.d_k), self._heads(v, self.d_v)

    def project_q(self, x: Tensor) -> Tensor:
        return self._heads(self.q_proj(x), self.d_k)  # (B, h, T, d_k)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output (B, S, d_model)."""
        k, v = self.kv_proj(memory).split([self.h * self.d_k, self.h * self.d_v], dim=-1)
        return self._heads(k, self.d_k), self._heads(v, self.d_v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | Band | None,
               is_causal: bool = False, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Attention over projected heads, then concat and W^O. Returns (B, T, d_model) and the
        (B, h, T, S) weights when asked (explicit path; same outputs as the fused kernel).
        A `Band` mask (restricted self-attention) computes only each query's window; asked for
        weights, it is made dense (for pictures, not speed)."""
        out, w = self.heads(q, k, v, mask, is_causal, need_weights)
        return self.out_proj(out), w

    def heads(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | Band | None,
              is_causal: bool = False, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """`attend` without W^O: Concat(head_1..head_h), (B, T, h d_v), and the weights when
        asked. Decoding attends row groups apart and projects them together."""
        p = self.p_attn_drop if self.training else 0.0
        if isinstance(mask, Band):
            if need_weights:
                mask = mask.dense(q.size(-2), q.device)
            else:
                out = banded_attention(q, k, v, mask, p)  # (B, h, T, d_v)
                b, _, t, _ = out.shape
                return out.transpose(1, 2).reshape(b, t, self.h * self.d_v), None
        if need_weights:
            if is_causal:
                mask = causal_mask(q.size(-2), q.device)
            out, w = explicit_attention(q, k, v, mask, p)
        elif unfused_training(q, k):
            out, w = training_attention(q, k, v, mask, is_causal, p), None
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 is_causal=is_causal and mask is None)
            w = None
        b, _, t, _ = out.shape
        return out.transpose(1, 2).reshape(b, t, self.h * self.d_v), w  # (B, T, h d_v): Concat(heads)
