"""The Transformer (§3, Figure 1): encoder and decoder stacks, shared embeddings, incremental
decoding through an explicit `KVCache`.

Batches are right-padded: real tokens first, PAD after. The decoder's causal mask then also hides
every padded key from every real query, so decoder self-attention needs no padding mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import Config
from aiayn.kernels.dropout import dropout
from aiayn.model.banded import Band
from aiayn.model.cache import GROW, CacheCohorts, KVCache
from aiayn.model.dropout import word_dropout
from aiayn.model.embedding import LearnedPositions, ScaledEmbedding, SinusoidalPositions
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.special import PAD_ID


class Transformer(nn.Module):
    """Encoder-decoder Transformer.

    src: (B, S) token ids (pieces + EOS, right-padded with PAD), tgt_in: (B, T) ([BOS] + pieces).
    `model(src, tgt_in)` -> logits (B, T, V_tgt).
    """

    def __init__(self, cfg: Config):
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("Config.vocab_size must be set before building a model")
        self.cfg = cfg
        d = cfg.d_model
        # §3.4: one matrix for both embeddings and the pre-softmax projection when tied.
        self.src_embed = ScaledEmbedding(cfg.src_vocab, d)
        self.tgt_embed = None if cfg.tie_embeddings else ScaledEmbedding(cfg.tgt_vocab, d)
        tie_out = cfg.tie_embeddings or cfg.tie_output
        self.out_proj = None if tie_out else nn.Linear(d, cfg.tgt_vocab, bias=False)
        if cfg.positions == "learned":  # Table 3 (E): a table per stack
            self.src_pos: nn.Module = LearnedPositions(cfg.max_positions, d)
            self.tgt_pos: nn.Module = LearnedPositions(cfg.max_positions, d)
        else:
            self.src_pos = self.tgt_pos = SinusoidalPositions(d)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        # Pre-norm leaves the residual stream un-normalised: a final LayerNorm per stack.
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if pre else None
        self.dec_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if pre else None
        self._init_weights()

    def _init_weights(self) -> None:
        # The paper gives no initialisation; Xavier-uniform per projection matrix as in the
        # Annotated Transformer and fairseq (each of the fused Q/K/V blocks on its own).
        for name, p in self.named_parameters():
            if p.dim() != 2 or "embed" in name or "_pos" in name:
                if name.endswith(".bias"):
                    nn.init.zeros_(p)
                continue
            rows = p.size(0)
            if name.endswith("qkv_proj.weight") or name.endswith("kv_proj.weight"):
                hk, hv = self.cfg.n_heads * self.cfg.head_dim_k, self.cfg.n_heads * self.cfg.head_dim_v
                sizes = [hk, hk, hv] if "qkv" in name else [hk, hv]
                with torch.no_grad():
                    for chunk in p.split(sizes, dim=0):
                        nn.init.xavier_uniform_(chunk)
                assert sum(sizes) == rows
            else:
                nn.init.xavier_uniform_(p)

    # --- embeddings ------------------------------------------------------------------------
    @property
    def target_embedding(self) -> ScaledEmbedding:
        return self.tgt_embed if self.tgt_embed is not None else self.src_embed

    def _embed(self, ids: Tensor, embed: ScaledEmbedding, pos: nn.Module, offset: int = 0,
               positions: Tensor | None = None) -> Tensor:
        """Scaled embeddings plus positions, then dropout P_drop (§3.4, §3.5, §5.4). The
        positions are those from `offset` on, or `positions` (B, T, d_model) given per row."""
        x = embed(ids)  # (B, T, d_model)
        p = pos(ids.size(1), offset) if positions is None else positions
        x = x + p.to(x.dtype)  # x's dtype: an int8 embedding has no weight
        return dropout(x, self.cfg.p_drop, self.training)

    def logits(self, y: Tensor) -> Tensor:
        """Pre-softmax projection (§3.4): (B, T, d_model) -> (B, T, V_tgt)."""
        if self.out_proj is not None:
            return self.out_proj(y)
        return F.linear(y, self.target_embedding.weight)

    # --- masks -----------------------------------------------------------------------------
    def _encoder_mask(self, src_mask: Tensor) -> Tensor | Band:
        if self.cfg.attn_window is not None:  # restricted (Table 1), computed banded
            return Band(self.cfg.attn_window, causal=False, key_mask=src_mask)
        return src_mask[:, None, None, :]  # (B, 1, 1, S): keys that are real tokens

    def _decoder_self_mask(self) -> Band | None:
        if self.cfg.attn_window is None:
            return None  # plain causal masking, done inside the attention kernel
        return Band(self.cfg.attn_window, causal=True)

    # --- full-sequence passes ----------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None, return_attention: bool = False):
        """src: (B, S) -> memory (B, S, d_model) [, list of (B, h, S, S) weights per layer]."""
        if src_mask is None:
            src_mask = src != PAD_ID
        mask = self._encoder_mask(src_mask)
        src = word_dropout(src, self.cfg.p_word_drop, self.training)  # not in the paper; 0 by default
        x = self._embed(src, self.src_embed, self.src_pos)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, mask, need_weights=return_attention)
            weights.append(w)
        if self.enc_norm is not None:
            x = self.enc_norm(x)
        return (x, weights) if return_attention else x

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               return_attention: bool = False):
        """tgt_in: (B, T), memory: (B, S, d_model), src_mask: (B, S) -> logits (B, T, V_tgt)
        [, {"self": [...], "cross": [...]} attention weights per layer]."""
        self_mask = self._decoder_self_mask()
        cross_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        y = self._embed(tgt_in, self.target_embedding, self.tgt_pos)
        ws, wc = [], []
        for layer in self.decoder:
            y, w_self, w_cross = layer(y, memory, self_mask, cross_mask, need_weights=return_attention)
            ws.append(w_self)
            wc.append(w_cross)
        if self.dec_norm is not None:
            y = self.dec_norm(y)
        out = self.logits(y)
        return (out, {"self": ws, "cross": wc}) if return_attention else out

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None,
                return_attention: bool = False):
        """Teacher-forced pass: (B, S), (B, T) -> logits (B, T, V_tgt) [, attention weights]."""
        if src_mask is None:
            src_mask = src != PAD_ID
        if not return_attention:
            return self.decode(tgt_in, self.encode(src, src_mask), src_mask)
        memory, w_enc = self.encode(src, src_mask, return_attention=True)
        logits, w_dec = self.decode(tgt_in, memory, src_mask, return_attention=True)
        return logits, {"encoder": w_enc, **w_dec}

    # --- incremental decoding ----------------------------------------------------------------
    def new_cache(self, memory: Tensor, src_mask: Tensor, capacity: int = GROW) -> KVCache:
        """Start decoding a batch: computes every layer's cross-attention keys/values once.
        memory: (B, S, d_model), src_mask: (B, S) bool. With restricted attention the cache keeps
        only the last attn_window + 1 positions (all a query's window holds)."""
        ks, vs = zip(*(layer.cross_attn.project_kv(memory) for layer in self.decoder))
        cfg = self.cfg
        window = None if cfg.attn_window is None else cfg.attn_window + 1
        cache = KVCache.allocate(
            cfg.n_layers, memory.size(0), cfg.n_heads, cfg.head_dim_k, cfg.head_dim_v,
            cross_k=torch.stack(ks), cross_v=torch.stack(vs),  # (L, B, h, S, d_k), (L, B, h, S, d_v)
            src_mask=src_mask, capacity=capacity, window=window)
        return cache

    def decode_step(self, tokens: Tensor, cache: KVCache | CacheCohorts, return_attention: bool = False):
        """Feed one token per row, (B, 1), at position `cache.length` (a `CacheCohorts`: each
        cohort's rows at its own); returns next-token logits (B, V_tgt) and advances the cache.
        Equals `decode` on the whole prefix (tested).
        With `return_attention` also returns {"self": [(B, h, 1, t+1)], "cross": [(B, h, 1, S)]},
        one entry per layer: this step's weights, equal to row t of a teacher-forced `decode`
        (tested); the logits are the same as without it. With restricted attention the self
        entries cover only the window the cache holds, in the cache's order."""
        parts = cache.parts
        for part in parts:
            part.ensure_capacity(part.length + 1)
        positions = None  # one cohort: every row at parts[0].length
        if len(parts) > 1:  # each cohort at its own position: (B, 1, d_model)
            positions = torch.cat([self.tgt_pos(1, p.length).expand(p.batch_size, -1)
                                   for p in parts])[:, None]
        y = self._embed(tokens, self.target_embedding, self.tgt_pos, offset=parts[0].length,
                        positions=positions)
        ws, wc = [], []
        for i, layer in enumerate(self.decoder):
            # a windowed cache holds exactly the window: no mask
            y, w_self, w_cross = layer.step(y, cache, i, need_weights=return_attention)
            ws.append(w_self)
            wc.append(w_cross)
        for part in parts:
            part.length += 1
        if self.dec_norm is not None:
            y = self.dec_norm(y)
        logits = self.logits(y[:, 0])  # (B, V_tgt)
        return (logits, {"self": ws, "cross": wc}) if return_attention else logits
