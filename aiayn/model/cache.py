"""The key/value cache for incremental decoding.

At decoding step t the decoder's self-attention needs the keys and values of all earlier target
positions; recomputing them would make a sequence of length T cost O(T^2) projections. The cache
keeps them, and the cross-attention keys/values of the encoder output, which never change.

With restricted self-attention (`Config.attn_window` = r) a query sees only the last r + 1
positions, so the cache keeps just those: a ring of `window` = r + 1 slots, position t in slot
t mod window. Attention is a sum over the keys, so their order in the ring does not matter, and
a decoding step then costs O(r d) however long the output grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

# Positions the self-attention buffers grow by when full: a copy of the filled positions each
# time, small beside beam search's reorder, which copies them at every step; small steps keep the
# buffers close to what is decoded (the first step of a large batch is decoding's peak). Growth is
# a step of its own, not folded into the reorder's copy: that saved little and raised the peak
# (docs/experiments/decoding.md).
GROW = 4


def source_rows(index: Tensor, cross_index: Tensor | None | bool) -> Tensor | None:
    """In a reorder, the rows the source side (cross-attention keys, source mask) takes:
    `index` when cross_index is True, its own index when a tensor, none (stays) when None."""
    if cross_index is None:
        return None
    return index if cross_index is True else cross_index


@dataclass
class KVCache:
    """Per-batch decoding state; one instance per `Transformer.new_cache` call.

    Buffers (L = n_layers, B = batch rows, e.g. sentences x beams; h = n_heads):
      self_k:  L tensors (B, h, capacity, d_k)  decoder self-attention keys, one per layer,
                                                positions [0, length) valid
      self_v:  L tensors (B, h, capacity, d_v)  decoder self-attention values
      cross_k: (L, N, h, S, d_k)                encoder-output keys, computed once
      cross_v: (L, N, h, S, d_v)                encoder-output values, computed once
      src_mask: (N, S) bool                     True at real source tokens (may attend)
      length: int                               target positions decoded so far (the next position)
      window: int | None                        restricted attention: slots kept (r + 1); None: all

    The source side has N = B / g rows: one per source sentence, whose g consecutive batch rows
    (beam search's k beams of a sentence) share it (`group`); a reorder with `cross_index=None`
    leaves it as it is, so expanding a batch of sentences to k beams each (`reorder(beams,
    cross_index=None)`) stores each sentence's keys and values once, not k times. g = 1 when
    every row has its own.

    `capacity` grows when full, to the next multiple of `GROW` positions, so callers need not know
    the output length and the buffers stay close to the positions decoded (doubling left up to
    half of them empty: with beam search the cache is most of decoding's memory); with a window
    it stops at `window`, and then new positions overwrite the oldest. Slots past the filled ones
    hold whatever the allocator left (never read: `append` writes a slot before it returns it),
    so no buffer is zeroed: in a BASE int8 beam search zeroing them took 3% of the time.

    One tensor per layer (not one (L, ...) tensor) so that `reorder` and growth replace a layer's
    buffer at a time: the cache's peak is itself plus one layer's buffer, where a whole second copy
    doubled it.

    Every row is at the same position, `length`. Sentences that start later (a decoding engine
    letting them join a running search) get a cache of their own: `extend` makes the two a
    `CacheCohorts`, copying nothing.
    """

    self_k: list[Tensor]
    self_v: list[Tensor]
    cross_k: Tensor
    cross_v: Tensor
    src_mask: Tensor
    length: int = 0
    window: int | None = None
    # The buffer `reorder` writes the next layer's rows into (a layer buffer's shape, contents
    # stale): the one each reordered buffer leaves behind.
    _spare: Tensor | None = field(default=None, repr=False)

    @property
    def batch_size(self) -> int:
        return self.self_k[0].size(0)

    @property
    def group(self) -> int:
        """g: consecutive batch rows that share one source row (1: a source row per row)."""
        return self.batch_size // self.src_mask.size(0)

    @property
    def capacity(self) -> int:
        return self.self_k[0].size(2)

    @property
    def filled(self) -> int:
        """Slots holding a position: length, or at most `window` with restricted attention."""
        return self.length if self.window is None else min(self.length, self.window)

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new position's k (B, h, 1, d_k) and v (B, h, 1, d_v) for one layer and return
        that layer's keys and values for positions [0, length], or for the last `window` of them
        in ring order (views, no copy)."""
        t = self.length
        slot, n = t, t + 1
        if self.window is not None:
            slot, n = t % self.window, min(t + 1, self.window)
        self.self_k[layer][:, :, slot : slot + 1] = k
        self.self_v[layer][:, :, slot : slot + 1] = v
        return self.self_k[layer][:, :, :n], self.self_v[layer][:, :, :n]

    def ensure_capacity(self, needed: int) -> None:
        if self.window is not None:
            needed = min(needed, self.window)
        if needed <= self.capacity:
            return
        new_cap = -(-needed // GROW) * GROW
        if self.window is not None:
            new_cap = min(new_cap, self.window)
        filled = self.filled

        def grow(buf: Tensor) -> Tensor:
            shape = list(buf.shape)
            shape[2] = new_cap
            out = buf.new_empty(shape)  # slots >= filled are written before they are read
            out[:, :, :filled] = buf[:, :, :filled]
            return out

        self._spare = None  # the old capacity: no longer of use
        for bufs in (self.self_k, self.self_v):
            for i in range(len(bufs)):  # a layer at a time: the old one is freed before the next grows
                bufs[i] = grow(bufs[i])

    def reorder(self, index: Tensor, cross_index: Tensor | None | bool = True) -> None:
        """Select batch rows: row i of the result is row index[i] (beam search reorders
        hypotheses after each step, and expands each sentence to k beams at the start).

        Only the filled slots (`filled`) of the self-attention buffers are copied, once, layer by
        layer, straight into a spare buffer that the layer's old buffer then becomes (beam search
        reorders at every step: a gather then a copy back would move the cache twice, and a fresh
        buffer per step would cost page faults).
        `cross_index` selects the cross-attention rows: True (default) means `index`; None means
        leave them as they are, which is right when every row keeps its source sentence (the
        beams of one sentence share their cross keys/values); a tensor gives their own index."""
        t = self.filled
        grad = torch.is_grad_enabled()
        for bufs in (self.self_k, self.self_v):
            for i, buf in enumerate(bufs):
                shape = (index.numel(), *buf.shape[1:])
                spare = self._spare
                if spare is None or spare.shape != shape or (buf.requires_grad and grad):
                    spare = buf.new_empty(shape)  # positions >= t are written before they are read
                if buf.requires_grad and grad:  # out= is not differentiable
                    spare[:, :, :t] = buf[:, :, :t].index_select(0, index)
                else:
                    torch.index_select(buf[:, :, :t], 0, index, out=spare[:, :, :t])  # (B', h, t, d)
                bufs[i] = spare
                self._spare = buf if buf.shape == shape else None
        ci = source_rows(index, cross_index)
        if ci is None:
            return
        self.cross_k = self.cross_k.index_select(1, ci)
        self.cross_v = self.cross_v.index_select(1, ci)
        self.src_mask = self.src_mask.index_select(0, ci)

    @property
    def parts(self) -> list["KVCache"]:
        """The cohorts of rows at one position each: this cache alone (see `CacheCohorts`)."""
        return [self]

    def slices(self) -> list[tuple["KVCache", slice]]:
        """Each cohort with its rows in the batch: here every row."""
        return [(self, slice(None))]

    def extend(self, other: "KVCache | CacheCohorts") -> "CacheCohorts":
        """This cache's rows, then `other`'s (sentences that joined later, at their own
        positions): one batch of cohorts, nothing copied."""
        return CacheCohorts([self]).extend(other)

    @classmethod
    def allocate(cls, n_layers: int, batch: int, n_heads: int, d_k: int, d_v: int,
                 cross_k: Tensor, cross_v: Tensor, src_mask: Tensor, capacity: int,
                 window: int | None = None) -> "KVCache":
        opts = dict(dtype=cross_k.dtype, device=cross_k.device)
        if window is not None:
            capacity = min(capacity, window)
        return cls(  # empty: slots are written before they are read (class doc)
            self_k=[torch.empty(batch, n_heads, capacity, d_k, **opts) for _ in range(n_layers)],
            self_v=[torch.empty(batch, n_heads, capacity, d_v, **opts) for _ in range(n_layers)],
            cross_k=cross_k, cross_v=cross_v, src_mask=src_mask, window=window,
        )


@dataclass
class CacheCohorts:
    """Rows of several `KVCache`s decoded as one batch: cohorts of sentences that began
    decoding at different steps, each cohort's rows at one position of their own (its `length`).
    The batch's rows are the cohorts' rows one after the other. A decoding step runs the
    position-wise work (projections, FFN, output layer) on every row at once and attention per
    cohort (`aiayn.model.layers.DecoderLayer.step`), over exactly the positions that cohort has
    decoded and its own sources: nothing is padded, masked or copied to put rows of different
    ages in one rectangle, and a reorder moves each cohort's filled positions only.

    A reorder never moves a row to another cohort (beam search reorders the beams of a sentence,
    which stay in its cohort, and drops finished sentences): `reorder`'s index selects rows of
    each cohort in order, and a cohort left with no rows is dropped."""

    parts: list[KVCache]

    @property
    def batch_size(self) -> int:
        return sum(p.batch_size for p in self.parts)

    @property
    def group(self) -> int:
        return self.parts[0].group

    def extend(self, other: "KVCache | CacheCohorts") -> "CacheCohorts":
        more = other.parts if isinstance(other, CacheCohorts) else [other]
        if any(p.group != self.group or p.window != self.parts[0].window for p in more):
            raise ValueError("caches of different beam groups or windows cannot be joined")
        self.parts = self.parts + list(more)
        return self

    def slices(self) -> list[tuple[KVCache, slice]]:
        """Each cohort with its rows in the batch."""
        out, at = [], 0
        for p in self.parts:
            out.append((p, slice(at, at + p.batch_size)))
            at += p.batch_size
        return out

    def reorder(self, index: Tensor, cross_index: Tensor | None | bool = True) -> None:
        """`KVCache.reorder` over the whole batch: index (B',) selects rows within their
        cohorts, cohort by cohort (a cohort's rows may be permuted among themselves);
        `cross_index` as there, a tensor likewise cohort by cohort."""
        rows = _split(index, [p.batch_size for p in self.parts])
        if cross_index is None or cross_index is True:
            cross = [cross_index] * len(self.parts)
        else:
            cross = _split(cross_index, [p.src_mask.size(0) for p in self.parts])
        kept = []
        for p, mine, ci in zip(self.parts, rows, cross):
            if mine.numel():
                p.reorder(mine, cross_index=ci)
                kept.append(p)
        self.parts = kept


def _split(index: Tensor, sizes: list[int]) -> list[Tensor]:
    """A batch-wide row index, ascending by cohort (each cohort's entries together, in cohort
    order), as one local index per cohort of `sizes` rows."""
    sizes_t = torch.tensor(sizes)
    firsts = sizes_t.cumsum(0) - sizes_t  # (C,) each cohort's first row
    which = torch.bucketize(index.cpu(), firsts, right=True) - 1  # (B',) the cohort of each entry
    counts = torch.bincount(which, minlength=len(sizes)).tolist()
    out, at = [], 0
    for n, first in zip(counts, firsts.tolist()):
        out.append(index[at: at + n] - first)
        at += n
    return out
