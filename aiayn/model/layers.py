"""Encoder and decoder layers (§3.1) and the position-wise feed-forward network (§3.3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import Config
from aiayn.kernels.attention import unfused_decoding
from aiayn.kernels.dropout import dropout
from aiayn.model.attention import MultiHeadAttention, attention_weights
from aiayn.model.banded import Band
from aiayn.model.cache import CacheCohorts, KVCache


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. 2), applied to each position alike."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.p_ffn_drop = cfg.p_ffn_drop  # deviation, default 0: dropout on the ReLU output

    def forward(self, x: Tensor) -> Tensor:
        # ReLU in place: nothing else reads w1's output (its backward needs x and W1), so decoding
        # and training skip a (tokens, d_ff) tensor
        return self.w2(dropout(F.relu(self.w1(x), inplace=True), self.p_ffn_drop, self.training))


class Residual(nn.Module):
    """Post-norm LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4), or, as an option, pre-norm
    x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.pre = cfg.norm == "pre"
        self.p_drop = cfg.p_drop

    def inp(self, x: Tensor) -> Tensor:
        """What the sub-layer reads."""
        return self.norm(x) if self.pre else x

    def out(self, x: Tensor, sub: Tensor) -> Tensor:
        """Combine the sub-layer's output with the residual stream."""
        y = x + dropout(sub, self.p_drop, self.training)
        return y if self.pre else self.norm(y)


class EncoderLayer(nn.Module):
    """Self-attention, then FFN, each wrapped in `Residual` (§3.1)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.ffn = FeedForward(cfg)
        self.res_attn, self.res_ffn = Residual(cfg), Residual(cfg)

    def forward(self, x: Tensor, mask: Tensor | Band, need_weights: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, S, d_model); mask broadcastable to (B, h, S, S), True = may attend, or a `Band`
        (restricted self-attention)."""
        q, k, v = self.self_attn.project_qkv(self.res_attn.inp(x))
        a, w = self.self_attn.attend(q, k, v, mask, need_weights=need_weights)
        x = self.res_attn.out(x, a)
        return self.res_ffn.out(x, self.ffn(self.res_ffn.inp(x))), w


class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the encoder output, then FFN (§3.1)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, self_attention=True)
        self.cross_attn = MultiHeadAttention(cfg, self_attention=False)
        self.ffn = FeedForward(cfg)
        self.res_self, self.res_cross, self.res_ffn = Residual(cfg), Residual(cfg), Residual(cfg)

    def forward(self, y: Tensor, memory: Tensor, self_mask: Band | None, cross_mask: Tensor,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """y: (B, T, d_model), memory: (B, S, d_model). `self_mask` None means plain causal
        masking, a `Band` restricted (causal) attention; cross_mask broadcastable to (B, h, T, S)."""
        q, k, v = self.self_attn.project_qkv(self.res_self.inp(y))
        a, w_self = self.self_attn.attend(q, k, v, self_mask, is_causal=self_mask is None,
                                          need_weights=need_weights)
        y = self.res_self.out(y, a)
        q = self.cross_attn.project_q(self.res_cross.inp(y))
        k, v = self.cross_attn.project_kv(memory)
        a, w_cross = self.cross_attn.attend(q, k, v, cross_mask, need_weights=need_weights)
        y = self.res_cross.out(y, a)
        return self.res_ffn.out(y, self.ffn(self.res_ffn.inp(y))), w_self, w_cross

    def step(self, y: Tensor, cache: KVCache | CacheCohorts, layer: int,
             need_weights: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoding position. y: (B, 1, d_model); appends this layer's k/v to the cache and
        attends to every position the cache returns (with restricted attention, the window).
        With `need_weights` also returns the self-attention (B, h, 1, n) weights over the n
        cached positions and the cross-attention (B, h, 1, S) weights. Where the step attends
        with Eq. 1 written out (`unfused_decoding`: CPU, float32) they are that path's own;
        elsewhere they are computed beside the fused kernel (Eq. 1 again from the same q and k).
        Either way the outputs stay bit-identical to a step without weights.
        A `CacheCohorts` (rows that began decoding at different steps) is attended cohort by
        cohort, each over its own positions and sources; projections and the FFN take every row
        at once; its weights are zero-padded to the longest cohort's positions and sources."""
        q, k, v = self.self_attn.project_qkv(self.res_self.inp(y))
        parts = cache.slices()
        heads, w_self = [], []
        for part, rows in parts:
            k_all, v_all = part.append(layer, k[rows], v[rows])  # (b, h, n, d_k), (b, h, n, d_v)
            a, w = self._self_heads(q[rows], k_all, v_all, need_weights)
            heads.append(a)
            w_self.append(w)
        y = self.res_self.out(y, self.self_attn.out_proj(_stack_rows(heads)))
        q = self.cross_attn.project_q(self.res_cross.inp(y))  # (B, h, 1, d_k)
        heads, w_cross = [], []
        for part, rows in parts:
            a, w = self._cross_heads(q[rows], part, layer, need_weights)
            heads.append(a)
            w_cross.append(w)
        y = self.res_cross.out(y, self.cross_attn.out_proj(_stack_rows(heads)))
        if len(parts) == 1:
            w_self, w_cross = w_self[0], w_cross[0]
        elif need_weights:  # cohorts differ in positions and source width: zero-padded to the most
            w_self, w_cross = _cat_padded(w_self), _cat_padded(w_cross)
        return self.res_ffn.out(y, self.ffn(self.res_ffn.inp(y))), w_self, w_cross

    def _self_heads(self, q: Tensor, k_all: Tensor, v_all: Tensor, need_weights: bool
                    ) -> tuple[Tensor, Tensor | None]:
        explicit = unfused_decoding(q)
        a, w = self.self_attn.heads(q, k_all, v_all, None, need_weights=explicit)
        if not need_weights:
            return a, None
        return a, w if w is not None else attention_weights(q, k_all)

    def _cross_heads(self, q: Tensor, cache: KVCache, layer: int, need_weights: bool
                     ) -> tuple[Tensor, Tensor | None]:
        b, h, g = q.size(0), q.size(1), cache.group
        # The g rows of one source sentence (its beams) are g queries against its keys, which
        # the cache holds once: (N, h, g, d_k)
        q = q.reshape(b // g, g, h, q.size(-1)).transpose(1, 2)
        cross_mask = cache.src_mask[:, None, None, :]  # (N, 1, 1, S)
        a, w = self.cross_attn.heads(q, cache.cross_k[layer], cache.cross_v[layer], cross_mask,
                                     need_weights=unfused_decoding(q))
        a = a.reshape(b, 1, a.size(-1))  # (N, g, h d_v) -> (B, 1, h d_v)
        if not need_weights:
            return a, None
        if w is None:
            w = attention_weights(q, cache.cross_k[layer], cross_mask)  # (N, h, g, S)
        return a, w.transpose(1, 2).reshape(b, h, 1, w.size(-1))  # (B, h, 1, S)


def _stack_rows(parts: list[Tensor]) -> Tensor:
    """The cohorts' rows as one batch (no copy for a single cohort)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _cat_padded(ws: list[Tensor]) -> Tensor:
    """(b_i, h, 1, n_i) weights -> (sum b_i, h, 1, max n_i), zero past each n_i."""
    n = max(w.size(-1) for w in ws)
    return torch.cat([F.pad(w, (0, n - w.size(-1))) for w in ws])
