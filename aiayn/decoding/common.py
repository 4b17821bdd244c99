"""What the search and its engine share: the result type, the length penalty, the maximum output
length, and turning lists of subword ids into a padded source batch.

Conventions (§6.1, "beam search ... length penalty alpha = 0.6 ... maximum output length to input
length + 50"):

- |Y|, the output length used by the length penalty and by the maximum length, counts every token
  the decoder generated *including EOS*: it is the number of log-probability terms in the score.
  (Tensor2Tensor, whose settings the paper reports, divides by the decode length with EOS as its
  last position; fairseq also counts EOS.)
- The source length S counts the real source tokens *including the source's EOS* (every True in
  `src_mask`), as fairseq does. With both lengths counting EOS, `max_len_a=1, max_len_b=50` means
  "at most 50 more pieces than the source" for a hypothesis that ends.
- The maximum output length is L = floor(a * S + b), at least 1: at most L decoding steps, so
  |Y| <= L. A hypothesis still open after L steps is returned cut off (L pieces, no EOS,
  `complete=False`); it ranks below every complete hypothesis of its sentence.
  Models with learned positions also cap L at `max_positions` (the decoder cannot go further).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import torch
from torch import Tensor

from aiayn.config import Config
from aiayn.data.batching import pad_rows
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

# Never an output: PAD is not a token, BOS only ever starts the decoder input.
NEVER_OUTPUT = (PAD_ID, BOS_ID)


@dataclass
class Hypothesis:
    """One output of a search.

    tokens: subword ids, without BOS and EOS.
    score: the ranking score, `logprob / lp(|Y|)` (beam search); for greedy search `logprob`.
    logprob: sum of the log-probabilities of every generated token, EOS included when complete.
    complete: True when the hypothesis ended with EOS, False when cut off at the maximum length.
    token_logprobs: per generated token (len(tokens) + 1 entries when complete: the last is EOS's).
    attention: only when the search was given an `AttentionRequest`: the cross-attention weights
      of every decoding step that produced this hypothesis, (L', h', steps, S) float32, steps =
      len(token_logprobs), S = the sentence's real source tokens (pieces + EOS); layers and
      heads as the request selects them. Each row sums to 1.
    """

    tokens: list[int]
    score: float
    logprob: float
    complete: bool = True
    token_logprobs: list[float] = field(default_factory=list, repr=False)
    attention: Tensor | None = field(default=None, repr=False)


@dataclass(frozen=True)
class AttentionRequest:
    """Which encoder-decoder attention weights a search keeps for each hypothesis (off unless
    given: keeping them costs memory and a second Eq. 1 per step, not a different result).

    layers: decoder layers, 0-based, negative counting from the top (-1 the last); None: all.
    heads: heads, 0-based; None: all. mean_heads: average the selected heads into one (what
    word alignments use, and h times less to keep)."""

    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    mean_heads: bool = False

    def kept(self, n_layers: int, n_heads: int) -> tuple[int, int]:
        """(L', h'): how many layers and heads `select` keeps of a model with these."""
        layers = n_layers if self.layers is None else len(self.layers)
        heads = 1 if self.mean_heads else n_heads if self.heads is None else len(self.heads)
        return layers, heads

    def select(self, cross: Sequence[Tensor]) -> Tensor:
        """One step's weights, per layer (B, h, 1, S) -> (B, L', h', S) float32."""
        n_layers, n_heads = len(cross), cross[0].size(1)
        layers = range(n_layers) if self.layers is None else self.layers
        w = torch.stack([cross[check_index(i, n_layers, "layer")] for i in layers], 1)
        # (B, L', h, 1, S)
        w = w[:, :, :, 0].float()  # (B, L', h, S)
        if self.heads is not None:
            w = w[:, :, [check_index(j, n_heads, "head") for j in self.heads]]
        return w.mean(dim=2, keepdim=True) if self.mean_heads else w


class StepConstraint(Protocol):
    """Restricts what a search may write (off unless given; e.g.
    `aiayn.parsing.constrain.TreeConstraint`). It keeps one row of state per live hypothesis:
    built with one row per sentence of the batch; the search calls `allowed(steps_left)` before
    each step and masks every other token to -inf, then `reorder(index)` with the row index it
    gives the model's cache (beams reordered, finished sentences dropped) and `advance(tokens)`
    with the token each row appended. Only choices are removed, so beam search's
    early-stopping bound still holds."""

    def allowed(self, steps_left: Tensor) -> Tensor:
        """(R, V) bool, True where row r may write token v next; steps_left (R,) int64: how many
        tokens the row may still write, this one and EOS included (L - t)."""

    def reorder(self, index: Tensor) -> None:
        """Row i becomes old row index[i]: index (R',) int64."""

    def advance(self, tokens: Tensor) -> None:
        """tokens (R,) int64: the token each row appended."""


def apply_constraint(logp: Tensor, constraint: StepConstraint | None, steps_left: Tensor
                     ) -> Tensor:
    """logp (N, V) with every token the constraint forbids set to -inf (in place)."""
    if constraint is not None:
        logp.masked_fill_(~constraint.allowed(steps_left), float("-inf"))
    return logp


def check_index(i: int, n: int, what: str) -> int:
    """A 0-based index into n items, negative counting from the end; ValueError when outside."""
    if not -n <= i < n:
        raise ValueError(f"{what} {i} does not exist: the model has {n} {what}s")
    return i % n


def unflatten_attention(flat: Tensor, steps: int, shape: tuple[int, int, int], src_len: int
                        ) -> Tensor:
    """A search's kept weights of one hypothesis, (W, L' * h' * S) with W >= steps, as
    `Hypothesis.attention`: (L', h', steps, src_len)."""
    layers, heads, s = shape
    w = flat[:steps].reshape(steps, layers, heads, s)  # (steps, L', h', S)
    return w.permute(1, 2, 0, 3)[..., :src_len].contiguous()  # (L', h', steps, src_len)


def next_token_logprobs(logits: Tensor) -> Tensor:
    """log p(y_t | y_<t, x) from decoder logits (N, V): log-softmax in float32 (even under bf16
    autocast, where the logits may be bf16), then PAD and BOS set to -inf so that no search
    generates them (the model's other probabilities are left as they are, not renormalised)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    logp[:, list(NEVER_OUTPUT)] = float("-inf")
    return logp


def ban_early_eos(logp: Tensor, step: int | Tensor, min_len: int) -> Tensor:
    """Not in the paper (off when min_len <= 1): forbid EOS at decoding step `step` (1-based,
    the |Y| an EOS chosen now would give) while step < min_len, so every complete hypothesis has
    |Y| >= min_len, EOS counted. Benchmarks use it to make every system decode the same number of
    steps. logp: (N, V), changed in place and returned; `step` one for all rows, or (N,) each
    row's own."""
    if isinstance(step, Tensor):
        if min_len > 1:
            logp[:, EOS_ID] = logp[:, EOS_ID].masked_fill(step < min_len, float("-inf"))
    elif step < min_len:
        logp[:, EOS_ID] = float("-inf")
    return logp


# bf16 products on a CPU run in oneDNN, which builds a kernel for every shape it meets and keeps
# up to 1,024 of them, and a search's row count changes at nearly every step: padding the rows to
# a multiple of 32 leaves few shapes, 40% less memory at the same speed with every output
# equal, while a lone sentence's four beam rows stay cheap to pad (64 saved little more and was a
# little slower). The measurements: docs/experiments/decoding.md.
ROW_MULTIPLE = 32


# Columns per block of `row_topk`: a block's maximum is one vectorised reduction over it
TOPK_BLOCK = 64


def row_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values of each row of x (N, V) and their columns, best first: what
    `x.topk(k, dim=1)` returns, found in two rounds because PyTorch's CPU top-k copies every row
    into (value, index) pairs and heap-sorts them, about 2.5 ns an element, where beam search asks
    for the 2k best of a whole vocabulary per row at every step. The row is cut into blocks of
    `TOPK_BLOCK` columns; the k largest values lie in the k blocks with the largest maxima (a
    value outside them is beaten by the maximum of each of those k blocks), so one maximum per
    block, a top-k of those, and a top-k of the k blocks' columns find them: 2.2x faster on
    (1,200, 8,000) float32 (docs/experiments/decoding.md). The same values as
    `topk`; among exactly equal values the columns may differ, as `topk` leaves their order
    unspecified too. Small rows go straight to `topk`."""
    n, v = x.shape
    b = TOPK_BLOCK
    blocks = v // b
    if blocks < 4 * k or x.device.type != "cpu":
        return x.topk(k, dim=1)
    block_max = x[:, : blocks * b].view(n, blocks, b).amax(dim=2)  # (N, blocks)
    best = block_max.topk(k, dim=1).indices  # (N, k)
    cols = (best[:, :, None] * b + torch.arange(b, device=x.device)).view(n, k * b)  # (N, k b)
    if blocks * b < v:  # the last, partial block is always searched
        tail = torch.arange(blocks * b, v, device=x.device).expand(n, -1)  # (N, v - blocks b)
        cols = torch.cat([cols, tail], dim=1)
    values, pos = x.gather(1, cols).topk(k, dim=1)  # (N, k)
    return values, cols.gather(1, pos)


# Rows of a step's logits made log-probabilities and searched at a time by `best_next_tokens`
LOGPROB_ROWS = 256


def best_next_tokens(logits: Tensor, c: int, steps: Tensor, min_len: int = 0,
                     allowed: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The c best next tokens of each row of a decoding step's logits (N, V), best first: their
    float32 log-probabilities (N, c) and ids (N, c). Each row is `next_token_logprobs`, then
    `ban_early_eos` at its own step (`steps`, (N,), 1-based), then every token `allowed` (N, V)
    bool forbids set to -inf (a `StepConstraint`'s mask, when given), then `row_topk`.

    Done `LOGPROB_ROWS` rows at a time, because the float32 (N, V) log-probabilities of a whole
    step are the largest thing beam search makes besides its cache (a Multi30k step of ~1,200
    rows over 8,000 pieces: 38 MB, and as much again for the float32 copy of bf16 logits): by
    blocks, `aiayn translate`'s peak RSS on Multi30k's test set fell by 9-68 MB at the same
    speed (docs/experiments/decoding.md). Rows never mix, so each row's result is the one the
    whole matrix gives (tested)."""
    n = logits.size(0)
    values, tokens = [], []
    for i in range(0, max(n, 1), LOGPROB_ROWS):
        rows = slice(i, i + LOGPROB_ROWS)
        logp = ban_early_eos(next_token_logprobs(logits[rows]), steps[rows], min_len)  # (b, V)
        if allowed is not None:
            logp.masked_fill_(~allowed[rows], float("-inf"))
        v, t = row_topk(logp, c)  # (b, c)
        values.append(v)
        tokens.append(t)
    if len(values) == 1:
        return values[0], tokens[0]
    return torch.cat(values), torch.cat(tokens)


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, Eq. 14); |Y| counts
    EOS. alpha = 0 gives 1 (plain log-probability); larger alpha favours longer outputs."""
    return ((5.0 + length) / 6.0) ** alpha


def first_parameter(model: Any) -> Tensor | None:
    """The model's first parameter (its device and dtype), None for a model without any."""
    return next(iter(model.parameters()), None) if hasattr(model, "parameters") else None


def model_device(model: Any) -> torch.device:
    p = first_parameter(model)
    return p.device if p is not None else torch.device("cpu")


def max_output_lengths(src_mask: Tensor, a: float, b: float, cap: int | None = None) -> Tensor:
    """L = floor(a * S + b) per sentence, S = real source tokens (EOS included), clamped to
    [1, cap]. src_mask: (B, S) bool -> (B,) int64 on the same device."""
    s = src_mask.sum(dim=1).to(torch.float64)  # (B,)
    lengths = torch.floor(a * s + b + 1e-9).to(torch.long).clamp(min=1)
    if cap is not None:
        lengths = lengths.clamp(max=max(1, cap))
    return lengths


def decoder_heads(model: Any) -> tuple[int, int]:
    """(decoder layers, heads per layer) of the model's config: what an `AttentionRequest`
    selects from (a model that keeps attention has a config)."""
    return model.cfg.n_layers, model.cfg.n_heads


def decoder_length_cap(model: Any) -> int | None:
    """The most target positions the decoder can take: `max_positions` for learned positions."""
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, Config) and cfg.positions == "learned":
        return cfg.max_positions
    return None


# Source positions of a decoding batch are rounded up to a multiple of this (masked PAD keys).
# Attention kernels sum keys in blocks whose boundaries follow the key count, so a sentence padded
# to its batch's longest was rounded differently from the same sentence alone, enough in bf16 to
# flip near ties; with every count a multiple of 16, a sentence gets the same numbers in any
# batch (measured: docs/experiments/decoding.md).
SOURCE_MULTIPLE = 16


def source_width(longest: int, multiple: int = SOURCE_MULTIPLE, limit: int | None = None) -> int:
    """The positions `source_batch` gives a batch whose longest source is `longest` tokens (EOS
    included): rounded up to `multiple`, not past `limit` unless the source itself is longer.
    The decoding room (`--batch-tokens`) counts these, the positions the encoder and the cache
    actually hold, not the real tokens."""
    width = -(-longest // multiple) * multiple
    return width if limit is None else min(width, max(limit, longest))


def source_batch(sources: Sequence[Sequence[int]], device: torch.device | str = "cpu",
                 multiple: int = SOURCE_MULTIPLE, limit: int | None = None) -> tuple[Tensor, Tensor]:
    """Padded model input from subword ids (no specials): each row is pieces + [EOS], then PAD,
    S rounded up to a multiple of `multiple` (`SOURCE_MULTIPLE`: a sentence's results do not
    depend on its batch) but not past `limit` positions (a model's learned position table,
    `decoder_length_cap`). Returns src (B, S) int64 and src_mask (B, S) bool, True at real
    tokens."""
    rows, lengths = pad_rows(sources, multiple=multiple)  # (B, S'): pieces, a column for EOS, PAD
    width = source_width(int(lengths.max(initial=0)) + 1, multiple, limit)  # S <= S': PAD cut only
    rows = rows[:, :width]  # (B, S)
    rows[np.arange(len(rows)), lengths] = EOS_ID
    src = torch.from_numpy(rows).to(device)
    return src, src != PAD_ID


def resolve_mask(src: Tensor, src_mask: Tensor | None) -> Tensor:
    return src != PAD_ID if src_mask is None else src_mask.to(torch.bool)
