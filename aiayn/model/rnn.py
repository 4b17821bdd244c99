"""The attention-based RNN encoder-decoder (Bahdanau, Cho and Bengio 2015, "RNNsearch"): the
recurrent baseline the Transformer paper set out to replace (§1, §2, Table 1). Not the paper's
model: `Config.arch = "rnn"` selects it (off by default); `aiayn.model.build_model` builds it.

- Encoder: embeddings, then one bidirectional GRU layer; the annotation of source position j is
  h_j = [forward h_j; backward h_j], (B, S, 2H): the "memory".
- Decoder (Bahdanau et al., appendix A): s_0 = tanh(W_s backward-h_1). At step i, the additive
  alignment model e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j), alpha_ij = softmax over the real source
  tokens, context c_i = sum_j alpha_ij h_j; the new state s_i = GRU([E y_{i-1}; c_i], s_{i-1}); a
  deep output t_i = maxout_2(W_o [s_i; E y_{i-1}; c_i]) of size E; logits = t_i E^T.
- Deviations from that paper, each the common modern choice: the readout reads the new state s_i
  (Nematus, OpenNMT) where the appendix writes s_{i-1}; the output layer is tied to the target
  embedding (Press and Wolf 2017; `Config.tie_embeddings` / `tie_output`, as for the
  Transformer); dropout P_drop on the embeddings and on t_i; Adam and the training recipe of the
  trainer instead of Adadelta.

The interface is the Transformer's, so the trainer, checkpoints, averaging, greedy and beam search,
`translate` and `evaluate` serve both: `model(src, tgt_in) -> logits (B, T, V)`,
`encode(src, src_mask) -> memory (B, S, 2H)`, `decode(tgt_in, memory, src_mask)`,
`new_cache(memory, src_mask) -> RNNState`, `decode_step(tokens (B, 1), cache) -> (B, V)` and
`cache.reorder(index, cross_index)`. `return_attention=True` gives the alignment weights as
{"cross": [(B, 1, T, S)]}: one layer with one head, the shape of the Transformer's per-layer
cross-attention weights.

Only the recurrence is a Python loop over target positions; the attention keys U_a h_j are
computed once per sentence, and the readout and output layer run over all positions at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from aiayn.config import Config
from aiayn.kernels.dropout import dropout
from aiayn.model.cache import source_rows
from aiayn.special import PAD_ID


@dataclass
class RNNState:
    """Per-batch decoding state of `RNNSearch` (the counterpart of `KVCache`).

      state:    (B, H)      decoder state s_{i-1}
      memory:   (N, S, 2H)  encoder annotations h_j
      keys:     (N, S, A)   U_a h_j, the alignment model's source half, computed once
      src_mask: (N, S) bool True at real source tokens (may attend)
      length:   int         target positions decoded so far

    N = B / g: the g consecutive rows of a sentence (its beams) share its source side, as in
    `KVCache`.
    """

    state: Tensor
    memory: Tensor
    keys: Tensor
    src_mask: Tensor
    length: int = 0

    @property
    def batch_size(self) -> int:
        return self.state.size(0)

    @property
    def group(self) -> int:
        """g: consecutive rows that share one source row (1: a source row per row)."""
        return self.batch_size // self.src_mask.size(0)

    def reorder(self, index: Tensor, cross_index: Tensor | None | bool = True) -> None:
        """Row i becomes row index[i], as `KVCache.reorder`: `cross_index` True moves the source
        side (memory, keys, mask) by `index` too, None leaves it (beams of one sentence share it),
        a tensor moves it by its own index."""
        self.state = self.state.index_select(0, index)
        ci = source_rows(index, cross_index)
        if ci is None:
            return
        self.memory = self.memory.index_select(0, ci)
        self.keys = self.keys.index_select(0, ci)
        self.src_mask = self.src_mask.index_select(0, ci)

    def extend(self, other: "RNNState") -> "RNNState":
        """Add `other`'s rows after these (sentences joining a batch that is already decoding;
        the recurrence needs no positions), the source side padded to the longer source; returns
        this state."""
        if other.group != self.group:
            raise ValueError("states of different beam groups cannot be joined")
        s = max(self.src_mask.size(1), other.src_mask.size(1))

        def join(a: Tensor, b: Tensor) -> Tensor:  # (N, S, ...) zero-padded along S, then stacked
            return torch.cat([_pad_source(a, s), _pad_source(b, s)])

        self.state = torch.cat([self.state, other.state])
        self.memory, self.keys = join(self.memory, other.memory), join(self.keys, other.keys)
        self.src_mask = join(self.src_mask, other.src_mask)
        self.length = max(self.length, other.length)
        return self


def _pad_source(x: Tensor, s: int) -> Tensor:
    """(N, S', ...) zero-padded along its source axis to (N, s, ...); x itself when S' = s."""
    if x.size(1) == s:
        return x
    return torch.cat([x, x.new_zeros(x.size(0), s - x.size(1), *x.shape[2:])], 1)


class RNNSearch(nn.Module):
    """Bidirectional-GRU encoder, additive attention, GRU decoder; see the module docstring.

    src: (B, S) token ids (pieces + EOS, right-padded with PAD), tgt_in: (B, T) ([BOS] + pieces).
    """

    def __init__(self, cfg: Config):
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("Config.vocab_size must be set before building a model")
        self.cfg = cfg
        e, h, a = cfg.rnn_emb, cfg.rnn_hidden, cfg.rnn_attn
        self.src_embed = nn.Embedding(cfg.src_vocab, e)
        self.tgt_embed = None if cfg.tie_embeddings else nn.Embedding(cfg.tgt_vocab, e)
        tie_out = cfg.tie_embeddings or cfg.tie_output
        self.out_proj = None if tie_out else nn.Linear(e, cfg.tgt_vocab, bias=False)
        self.encoder = nn.GRU(e, h, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(h, h)  # W_s
        self.key_proj = nn.Linear(2 * h, a, bias=False)  # U_a
        self.query_proj = nn.Linear(h, a)  # W_a, with the alignment model's bias
        self.score = nn.Linear(a, 1, bias=False)  # v_a
        self.cell = nn.GRUCell(e + 2 * h, h)
        self.readout = nn.Linear(h + e + 2 * h, 2 * e)  # W_o, before the maxout
        for emb in (self.src_embed, self.tgt_embed):
            if emb is not None:  # unit-norm vectors, as the Transformer's scaled embeddings
                nn.init.normal_(emb.weight, std=e**-0.5)

    @property
    def target_embedding(self) -> nn.Embedding:
        return self.tgt_embed if self.tgt_embed is not None else self.src_embed

    def logits(self, t: Tensor) -> Tensor:
        """Output layer: (..., E) -> (..., V_tgt)."""
        if self.out_proj is not None:
            return self.out_proj(t)
        return F.linear(t, self.target_embedding.weight)

    # --- encoder ---------------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """src: (B, S) -> annotations (B, S, 2H); zeros at padded positions."""
        if src_mask is None:
            src_mask = src != PAD_ID
        x = dropout(self.src_embed(src), self.cfg.p_drop, self.training)  # (B, S, E)
        # Packed, so that the backward GRU starts at each sentence's last real token, not at PAD.
        lengths = src_mask.sum(dim=1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return memory  # (B, S, 2H)

    # --- decoder ---------------------------------------------------------------------------
    def new_cache(self, memory: Tensor, src_mask: Tensor, capacity: int = 0) -> RNNState:
        """Start decoding: s_0 = tanh(W_s backward-h_1) and the keys U_a h_j. memory: (B, S, 2H),
        src_mask: (B, S) bool. `capacity` is accepted for the Transformer's signature."""
        h = self.cfg.rnn_hidden
        s0 = torch.tanh(self.init_state(memory[:, 0, h:]))  # the backward GRU's final state
        return RNNState(state=s0, memory=memory, keys=self.key_proj(memory),
                        src_mask=src_mask.to(torch.bool))

    def _attend(self, s: Tensor, cache: RNNState) -> tuple[Tensor, Tensor]:
        """Additive attention of state s (B, H): context (B, 2H) and weights alpha (B, S). The g
        rows of a source sentence (`RNNState.group`) attend to its one copy of the source."""
        b, g = s.size(0), cache.group
        q = self.query_proj(s).view(b // g, g, 1, -1)  # (N, g, 1, A)
        e = self.score(torch.tanh(cache.keys[:, None] + q)).squeeze(-1)  # (N, g, S)
        alpha = e.masked_fill(~cache.src_mask[:, None], float("-inf")).softmax(dim=-1)
        c = torch.bmm(alpha, cache.memory)  # (N, g, 2H)
        return c.reshape(b, -1), alpha.reshape(b, -1)  # (B, 2H), (B, S)

    def _step(self, y: Tensor, cache: RNNState) -> tuple[Tensor, Tensor, Tensor]:
        """One recurrence step from embedded y_{i-1} (B, E): (s_i, c_i, alpha_i); advances cache."""
        c, alpha = self._attend(cache.state, cache)
        s = self.cell(torch.cat([y, c], dim=-1), cache.state)  # (B, H)
        cache.state = s
        cache.length += 1
        return s, c, alpha

    def _output(self, s: Tensor, y: Tensor, c: Tensor) -> Tensor:
        """Deep output with maxout (pool 2), then the output layer: (..., H), (..., E), (..., 2H)
        -> logits (..., V_tgt)."""
        t = self.readout(torch.cat([s, y, c], dim=-1))  # (..., 2E)
        t = t.unflatten(-1, (self.cfg.rnn_emb, 2)).amax(dim=-1)  # (..., E)
        return self.logits(dropout(t, self.cfg.p_drop, self.training))

    def _embed_target(self, tokens: Tensor) -> Tensor:
        return dropout(self.target_embedding(tokens), self.cfg.p_drop, self.training)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               return_attention: bool = False):
        """Teacher-forced: tgt_in (B, T) -> logits (B, T, V_tgt) [, {"cross": [(B, 1, T, S)]}]."""
        cache = self.new_cache(memory, src_mask)
        y = self._embed_target(tgt_in)  # (B, T, E)
        states, contexts, weights = [], [], []
        for i in range(tgt_in.size(1)):
            s, c, alpha = self._step(y[:, i], cache)
            states.append(s)
            contexts.append(c)
            weights.append(alpha)
        out = self._output(torch.stack(states, 1), y, torch.stack(contexts, 1))  # (B, T, V)
        if return_attention:
            return out, {"cross": [torch.stack(weights, 1)[:, None]]}  # (B, 1, T, S)
        return out

    def decode_step(self, tokens: Tensor, cache: RNNState) -> Tensor:
        """Feed one token per row, (B, 1); returns next-token logits (B, V_tgt) and advances the
        state. Equals `decode` on the whole prefix (tested)."""
        y = self._embed_target(tokens[:, 0])  # (B, E)
        s, c, _ = self._step(y, cache)
        return self._output(s, y, c)

    def forward(self, src: Tensor, tgt_in: Tensor, src_mask: Tensor | None = None,
                return_attention: bool = False):
        """Teacher-forced pass: (B, S), (B, T) -> logits (B, T, V_tgt) [, attention weights]."""
        if src_mask is None:
            src_mask = src != PAD_ID
        return self.decode(tgt_in, self.encode(src, src_mask), src_mask, return_attention)
