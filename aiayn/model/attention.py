"""Scaled dot-product attention and multi-head attention (§3.2).

Masks are boolean and mean "may attend" (True = allowed), as in
`torch.nn.functional.scaled_dot_product_attention`. Which kernel computes Eq. 1 in a CPU training
or decoding step (PyTorch's fused one, or Eq. 1 written out) is `aiayn.kernels.attention`'s choice.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import Config
from aiayn.kernels.attention import training_attention, unfused_training
from aiayn.model.banded import Band, banded_attention


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
