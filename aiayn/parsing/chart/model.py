"""The chart parser's network: the paper's encoder stack (pre-norm), a character CNN per word, and
a span scorer; the span loss; a sentence's words as the ids and characters it reads
(aiayn/parsing/chart/__init__.py).

Each encoder output splits into a forward half f and a backward half b (Kitaev & Klein §2.1);
fencepost k reads f at token k (left of it) and b at token k+1 (right of it), and the span (i, j)
is [f_j - f_i ; b_i - b_j], scored by a two-layer MLP into one logit per label. Training is
local: cross-entropy of every span's label (label 0 for the spans that are not constituents).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.kernels.dropout import dropout
from aiayn.model.dropout import word_dropout
from aiayn.model.embedding import ScaledEmbedding, SinusoidalPositions
from aiayn.model.layers import EncoderLayer
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.signatures import signature
from aiayn.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")  # word ids PAD_ID, UNK_ID, BOS_ID, EOS_ID

CHAR_SPECIALS = ("<cpad>", "<cunk>", "<w>", "</w>")  # char ids 0-3: pad, unknown, word start, end


def char_ids(words_list: Sequence[Sequence[str]], index: dict[str, int],
             max_chars: int) -> tuple[Tensor, Tensor]:
    """The characters of sentences read as BOS w_1..w_n EOS PAD.., each distinct word once:
    `chars` (U + 1, C), row u the u-th distinct word as `<w>` its characters `</w>` (a word
    longer than max_chars as its first and last max_chars // 2 characters: the prefix and the
    suffix carry its shape and part of speech), row 0 empty; `where` (B, S), each slot's row
    (0 for BOS, EOS and PAD). The char encoder then runs once per distinct word rather than per
    slot: in news text `the` and `,` fill many slots."""
    half = max_chars // 2
    rows: dict[str, int] = {}
    s = max(len(w) for w in words_list) + 2
    where = [[0] + [rows.setdefault(w, len(rows) + 1) for w in words] + [0] * (s - 1 - len(words))
             for words in words_list]  # +1: BOS is slot 0, row 0 is the empty word
    def clip(w: str) -> str:  # not w[-half:]: at half 0 that is the whole word
        return w if len(w) <= max_chars else w[:half] + w[len(w) - half:]

    spelled = [[2] + [index.get(c, 1) for c in clip(w)] + [3] for w in rows]
    c = max((len(x) for x in spelled), default=2)
    chars = torch.tensor([[0] * c] + [x + [0] * (c - len(x)) for x in spelled], dtype=torch.long)
    where = torch.tensor(where, dtype=torch.long)
    return chars, where


class CharEncoder(nn.Module):
    """A word from its characters (not in the paper): embeddings, one convolution of width 3,
    ReLU, the maximum over the word's characters (Kim et al. 2016's character CNN, one width).
    A word the vocabulary does not know, or training's word dropout hid, still reaches the model
    as its spelling; a CNN rather than Kitaev & Klein's character LSTM because it is one batched
    convolution on a CPU.

    (chars (U, C), where (B, S)) from `char_ids` -> (B, S, d_model); row 0 (BOS, EOS, PAD) gives 0."""

    def __init__(self, n_chars: int, d_char: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(n_chars, d_char, padding_idx=0)
        self.conv = nn.Conv1d(d_char, d_model, kernel_size=3, padding=1)

    def forward(self, chars: tuple[Tensor, Tensor]) -> Tensor:
        spelled, where = chars  # (U, C), (B, S)
        x = self.embed(spelled).transpose(1, 2)  # (U, d_char, C)
        h = F.relu(self.conv(x))  # (U, d_model, C)
        h = h.masked_fill((spelled == 0)[:, None, :], 0.0)  # pads never win the max; row 0 is all 0
        return h.amax(dim=-1)[where]  # (B, S, d_model)


class SpanParser(nn.Module):
    """The paper's encoder stack (pre-norm) and a span scorer.

    `model(ids, chars)`: ids (B, S) = BOS w_1..w_n EOS PAD.., chars their characters
    (`char_ids`; None when cfg.d_char is 0) -> logits (B, F, F, L) with F = S - 1 fenceposts;
    only cells i < j <= n (the sentence's words) mean anything."""

    def __init__(self, cfg: ChartConfig, n_words: int, n_labels: int, n_chars: int = 0):
        super().__init__()
        self.cfg = cfg
        enc = cfg.encoder_config(n_words)
        d = cfg.d_model
        self.embed = ScaledEmbedding(n_words, d)
        self.pos = SinusoidalPositions(d)
        self.char_encoder = CharEncoder(n_chars, cfg.d_char, d) if cfg.d_char else None
        self.layers = nn.ModuleList(EncoderLayer(enc) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d)
        self.span_hidden = nn.Linear(d, cfg.d_span)
        self.span_norm = nn.LayerNorm(cfg.d_span)
        self.span_out = nn.Linear(cfg.d_span, n_labels)
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)

    def encode(self, ids: Tensor, chars: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """ids (B, S), chars from `char_ids` or None -> the encoder's output (B, S, d_model), after the
        final LayerNorm. Word dropout hides the word's id, not its characters."""
        mask = ids != PAD_ID  # (B, S)
        ids = word_dropout(ids, self.cfg.p_word_drop, self.training)
        x = self.embed(ids) + self.pos(ids.size(1), 0).to(self.embed.weight.dtype)  # (B, S, d)
        if self.char_encoder is not None:
            if chars is None:
                raise ValueError("this chart parser reads characters: pass chars (char_ids)")
            x = x + self.char_encoder(chars)
        x = dropout(x, self.cfg.p_drop, self.training)
        attend = mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x, _ = layer(x, attend)
        return self.norm(x)

    def forward(self, ids: Tensor, chars: tuple[Tensor, Tensor] | None = None) -> Tensor:
        h = self.encode(ids, chars)  # (B, S, d)
        n_words = (ids != PAD_ID).sum(dim=1) - 2  # (B,)
        f = ids.size(1) - 1  # fenceposts of the longest sentence
        half = h.size(-1) // 2
        fwd, bwd = h[:, :-1, :half], h[:, 1:, half:]  # (B, F, d/2): fencepost k's left, right
        # span_hidden([f_j - f_i ; b_i - b_j]) = A_j - A_i + B_i - B_j + bias, with A and B its
        # two halves applied once per fencepost instead of once per span: the same numbers, F
        # matrix rows instead of F^2
        w = self.span_hidden.weight  # (d_span, d)
        a, b = F.linear(fwd, w[:, :half]), F.linear(bwd, w[:, half:])  # (B, F, d_span) each
        grid = torch.ones(f, f, dtype=torch.bool, device=ids.device).triu(1)  # i < j
        valid = grid[None] & (torch.arange(f, device=ids.device)[None, None, :] <= n_words[:, None, None])
        bi, i, j = valid.nonzero(as_tuple=True)  # (N,) each: the spans i < j <= n
        pre = a[bi, j] - a[bi, i] + b[bi, i] - b[bi, j] + self.span_hidden.bias  # (N, d_span)
        hidden = F.relu(self.span_norm(pre))
        cells = self.span_out(dropout(hidden, self.cfg.p_drop, self.training))  # (N, L)
        out = cells.new_zeros(ids.size(0), f, f, cells.size(-1))  # (B, F, F, L); 0 where not a span
        out[bi, i, j] = cells
        return out


def span_targets(spans: Sequence[tuple[int, int, int]], n: int) -> Tensor:
    """(n+1, n+1) long: the label id of each span i < j (0: none), -100 elsewhere (ignored).
    A span labelled twice (impossible in a tree) keeps the first."""
    t = torch.full((n + 1, n + 1), -100, dtype=torch.long)
    upper = torch.triu(torch.ones(n + 1, n + 1, dtype=torch.bool), diagonal=1)
    t[upper] = 0
    for i, j, lab in reversed(spans):
        t[i, j] = lab
    return t


def span_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy summed over the cells `targets` does not ignore (-100), in float32.
    logits (B, F, F, L), targets (B, F', F') with F' <= F."""
    f = targets.size(1)
    logits = logits[:, :f, :f]  # (B, F', F', L)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                           ignore_index=-100, reduction="sum")


def encode(words_list: Sequence[Sequence[str]], index: dict[str, int]) -> Tensor:
    """(B, S) ids: BOS, each word's id (UNK when unknown), EOS, right-padded with PAD."""
    s = max(len(w) for w in words_list) + 2
    ids = torch.full((len(words_list), s), PAD_ID, dtype=torch.long)
    for b, words in enumerate(words_list):
        row = [BOS_ID] + [index.get(w, UNK_ID) for w in words] + [EOS_ID]
        ids[b, : len(row)] = torch.tensor(row)
    return ids


def model_words(words: Sequence[str], index: dict[str, int]) -> list[str]:
    """A sentence as the model reads it: a word the vocabulary lacks as its signature when the
    vocabulary has that (as training saw rare words), else as it is (then UNK)."""
    out = []
    for w in words:
        sig = w if w in index else signature(w)
        out.append(sig if sig in index else w)
    return out
