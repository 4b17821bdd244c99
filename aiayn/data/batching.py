"""Token-budget batches (§5.1) and their padded tensors.

"Sentence pairs were batched together by approximate sequence length. Each training batch contained
a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

`TokenBatchSampler` groups pairs of similar length into batches of at most `max_tokens` source AND
at most `max_tokens` target tokens, counting padding: B * max source length <= max_tokens and
B * max target length <= max_tokens, where a sentence's length counts its added EOS (source,
target output) or BOS (target input), i.e. pieces + 1.

How: pairs are sorted by k = max(src_len, tgt_len) + 1, then by tgt_len - src_len (see
`sort_key`) to waste less padding on the shorter side, with ties in random order; the sorted run is
cut greedily into the largest batches with B * k_max <= max_tokens (which implies both budgets).
Because the sorted sequence of k is the same every epoch, so are the cut points and the batch count;
each epoch changes which equal-length pairs share a batch and the order of the batches. Everything is a
function of (seed, epoch): deterministic, and resumable from `state_dict()` = {epoch, position}.

Distributed training: batch b goes to rank b % world_size. DDP needs every rank to take the same
number of steps, so when the batch count is not divisible by world_size the largest batches are
split in two until it is (no pair dropped or repeated). Ranks take the same number of batches, so
one state (epoch, position) is valid for all of them.

A pair that alone exceeds the budget is an error at construction (re-run `aiayn prepare` with a
smaller `--max-len`, or raise max_tokens); with `allow_oversize=True` (evaluation, where no line may
be dropped) it gets a batch of its own instead.

`collate(dataset, indices)` builds the model inputs as the project convention says: source =
pieces + [EOS]; decoder input = [BOS] + pieces; decoder target = pieces + [EOS]; padded with PAD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from aiayn.errors import UserError
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

# --- planning (pure functions on lengths) -------------------------------------------------------


def round_up(x: np.ndarray | int, multiple: int) -> np.ndarray | int:
    """`x` rounded up to a multiple of `multiple` (1: unchanged)."""
    return -(-x // multiple) * multiple


def sort_key(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, key) per pair; lengths exclude EOS/BOS.

    k = max(src, tgt) + 1 is the padded width the budget sees (before rounding, see `round_up`).
    `key` orders pairs by k, then by secondary = tgt - src (shifted to be >= 0), which among equal
    k runs from "source longest, target short" through "both k - 1" to "target longest, source
    short", so neighbours have similar lengths on both sides: on Multi30k this wastes 2-4x less
    padding than sorting by k alone at small budgets. Both are int32 whenever the key fits (any
    sentence under 32,000 tokens): 8 bytes a pair, 80 MB for 10M pairs.
    """
    s, t = np.asarray(src_lengths), np.asarray(tgt_lengths)
    longest = int(max(s.max(initial=0), t.max(initial=0)))
    dtype = np.int32 if (longest + 1) * (2 * longest + 2) < 2**31 else np.int64
    s, t = s.astype(dtype, copy=False), t.astype(dtype, copy=False)
    k = np.maximum(s, t)
    k += 1
    secondary = t - s
    secondary += s.max(initial=0)
    key = k * (int(secondary.max(initial=0)) + 1)
    key += secondary
    return k, key


def dense_ranks(key: np.ndarray) -> np.ndarray:
    """`key` (non-negative integers, `sort_key`'s) as each value's rank among the distinct values:
    the same order, held as uint16 when there are at most 65,536 distinct values (a few hundred
    or thousand in practice), for which numpy's stable sort is a radix sort, so `length_order`
    runs faster every epoch (`benchmarks/bench_batching.py --order-only`; docs/wmt.md). Keys too
    large or too varied for that come back unchanged."""
    if len(key) == 0 or int(key.max()) >= 1 << 22:  # np.bincount would allocate a bin per value
        return key
    present = np.bincount(key) > 0
    if int(present.sum()) > 1 << 16:
        return key
    return (np.cumsum(present) - 1).astype(np.uint16)[key]


def length_order(key: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Indices sorted by `key` (`sort_key`); ties in random order (by index when `rng` is None)."""
    perm = rng.permutation(len(key)) if rng is not None else np.arange(len(key))
    return perm[np.argsort(key[perm], kind="stable")]


def cut_points(k_sorted: np.ndarray, max_tokens: int, max_sentences: int | None = None) -> np.ndarray:
    """Batch boundaries over a non-decreasing array of widths: the greedy largest batches with
    size * max width <= max_tokens (and size <= max_sentences when given). Returns starts+[n], so
    batch j is [b[j], b[j+1]).
    A width > max_tokens gets a batch of its own (callers reject it first when not allowed)."""
    n = len(k_sorted)
    if n == 0:
        return np.zeros(1, np.int64)
    # Work over the distinct widths (a few hundred at most) instead of over pairs: a batch from i
    # whose widest member has width v holds at most max_tokens // v pairs, and at most the pairs
    # from i to the last one of width v; the batch is the best such v.
    first = np.flatnonzero(np.r_[True, k_sorted[1:] != k_sorted[:-1]])  # start of each width's run
    vals = k_sorted[first].astype(np.int64)  # int32 widths: max_tokens may not fit int32
    end = np.append(first[1:], n)  # exclusive end of each width's run
    cap = max_tokens // vals
    if max_sentences is not None:
        cap = np.minimum(cap, max_sentences)
    starts = [0]
    i, j = 0, 0
    while i < n:
        while end[j] <= i:
            j += 1
        size = int(np.max(np.minimum(end[j:] - i, cap[j:])))
        i += max(size, 1)
        starts.append(i)
    return np.asarray(starts, np.int64)


def split_for_ranks(bounds: np.ndarray, k_sorted: np.ndarray, world_size: int) -> np.ndarray:
    """Split the largest batches (by padded tokens) in two until the count divides by world_size."""
    b = [int(x) for x in bounds]
    while (len(b) - 1) % world_size:
        sizes = np.diff(b)
        padded = sizes * k_sorted[np.asarray(b[1:]) - 1]
        padded[sizes < 2] = -1  # a single pair cannot be split
        j = int(np.argmax(padded))
        if padded[j] < 0:
            raise UserError(
                f"cannot give {world_size} ranks the same number of batches: only {len(b) - 1} "
                f"batches of single pairs ({b[-1]} pairs); use fewer ranks or more data"
            )
        b.insert(j + 1, b[j] + sizes[j] // 2)
    return np.asarray(b, np.int64)


# --- the sampler --------------------------------------------------------------------------------


def _integers(values: Sequence[int] | np.ndarray) -> np.ndarray:
    a = np.asarray(values)
    return a if a.dtype.kind in "iu" else a.astype(np.int64)


class TokenBatchSampler:
    """Batches (numpy arrays of pair indices) for one rank, epoch after epoch.

    Iterating yields the rest of the current epoch from `position`; a new `iter()` after a finished
    epoch starts the next one. `len()` is the number of batches per epoch for this rank (the same
    for every rank and every epoch). `state_dict()` counts the batches handed out: with a
    prefetching loader, save the number the trainer consumed instead.

    `pad_multiple` rounds each batch's width up to a multiple (`collate` pads to it) and charges
    the budget that width: fewer distinct tensor shapes. `max_sentences` caps a batch's pairs.
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | np.ndarray,
        tgt_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        allow_oversize: bool = False,
        epoch: int = 0,
        pad_multiple: int = 1,
        max_sentences: int | None = None,
    ):
        # kept as given when integer (a dataset's int32 lengths: no per-pair copy)
        src, tgt = _integers(src_lengths), _integers(tgt_lengths)
        if src.shape != tgt.shape or src.ndim != 1:
            raise ValueError(f"length arrays must be 1-D and alike, got {src.shape} and {tgt.shape}")
        if max_tokens < 1:
            raise UserError(f"max_tokens must be >= 1, got {max_tokens}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        if len(src) and len(src) < world_size:
            raise UserError(f"{len(src)} pairs cannot be shared among {world_size} ranks")
        self.src_lengths, self.tgt_lengths = src, tgt
        self.max_tokens, self.seed, self.shuffle = int(max_tokens), int(seed), shuffle
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = int(epoch), 0
        self.pad_multiple = int(pad_multiple)
        k, key = sort_key(src, tgt)
        self.key = dense_ranks(key)  # the same order, sorted faster every epoch
        widths = round_up(k, self.pad_multiple) if self.pad_multiple > 1 else k
        too_big = np.flatnonzero(widths > self.max_tokens)
        if len(too_big) and not allow_oversize:
            i = int(too_big[0])
            raise UserError(
                f"pair {i} has {src[i] + 1} source / {tgt[i] + 1} target tokens with EOS/BOS, more "
                f"than max_tokens={self.max_tokens} ({len(too_big)} such pairs); raise max_tokens or "
                f"re-run aiayn prepare with --max-len {self.max_tokens - 1}"
            )
        # pairs stay sorted by their own widths; the budget charges each batch its rounded width
        k_sorted = np.sort(widths)
        self.bounds = split_for_ranks(cut_points(k_sorted, self.max_tokens, max_sentences),
                                      k_sorted, world_size)
        self._cache: tuple[int, list[np.ndarray]] | None = None

    # --- one epoch ------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int | None = None, all_ranks: bool = False) -> list[np.ndarray]:
        """The batches of `epoch` (default: the current one) in iteration order, for this rank or,
        with `all_ranks`, for all ranks interleaved (batch b belongs to rank b % world_size).
        Without `shuffle`: every epoch the same batches, shortest first."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
            order = length_order(self.key, rng)
            batches = np.split(order, self.bounds[1:-1])
            if rng is not None:
                batches = [batches[j] for j in rng.permutation(len(batches))]
            self._cache = (epoch, batches)
        batches = self._cache[1]
        return batches if all_ranks else batches[self.rank :: self.world_size]

    def __len__(self) -> int:
        """Batches per rank in every epoch."""
        return (len(self.bounds) - 1) // self.world_size

    def __iter__(self) -> Iterator[np.ndarray]:
        if self.position >= len(self):
            self.set_epoch(self.epoch + 1)
        batches = self.epoch_batches()
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its first batch."""
        self.epoch, self.position = int(epoch), 0

    @property
    def padding_fraction(self) -> float:
        """Share of the padded src+tgt tensor cells (all ranks, current epoch) that are PAD."""
        real = padded = 0
        for idx in self.epoch_batches(all_ranks=True):
            s, t = self.src_lengths[idx] + 1, self.tgt_lengths[idx] + 1
            real += int(s.sum() + t.sum())
            padded += len(idx) * int(round_up(s.max(), self.pad_multiple)
                                     + round_up(t.max(), self.pad_multiple))
        return 1.0 - real / padded if padded else 0.0

    # --- resuming -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "max_tokens": self.max_tokens, "world_size": self.world_size,
                "n_pairs": len(self.src_lengths), "batches_per_rank": len(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` left off; the data and batching settings must be the same."""
        mine = self.state_dict()
        for key in ("seed", "max_tokens", "world_size", "n_pairs", "batches_per_rank"):
            if key in state and state[key] != mine[key]:
                raise UserError(f"cannot resume batches: saved with {key}={state[key]}, now {mine[key]}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if not 0 <= position <= len(self):
            raise UserError(f"cannot resume batches: position {position} outside 0..{len(self)}")
        self.epoch, self.position = epoch, position


def length_batches(src_lengths: Sequence[int] | np.ndarray, max_tokens: int,
                   tgt_lengths: Sequence[int] | np.ndarray | None = None,
                   max_sentences: int | None = None) -> list[np.ndarray]:
    """Every index once, in batches of similar length within the budget, longest first, for
    evaluation and translation (no shuffling; a pair over the budget gets a batch of its own).
    Lengths are pieces, without EOS/BOS; a missing target side counts as empty."""
    src = np.asarray(src_lengths, np.int64)
    tgt = np.zeros_like(src) if tgt_lengths is None else tgt_lengths
    sampler = TokenBatchSampler(src, tgt, max_tokens, shuffle=False, allow_oversize=True,
                                max_sentences=max_sentences)
    return sampler.epoch_batches()[::-1]


# --- tensors ------------------------------------------------------------------------------------


@dataclass
class Batch:
    """Padded model inputs for B pairs (long tensors, PAD_ID-padded).

    src (B, S) = pieces + [EOS]; tgt_in (B, T) = [BOS] + pieces; tgt_out (B, T) = pieces + [EOS].
    n_src_tokens / n_tgt_tokens count non-PAD cells of src / tgt_out; `indices` are the dataset
    indices of the rows.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    n_src_tokens: int
    n_tgt_tokens: int
    indices: np.ndarray

    @property
    def src_mask(self) -> torch.Tensor:
        """(B, S) bool, True where a real token (may attend)."""
        return self.src != PAD_ID

    def __len__(self) -> int:
        return self.src.shape[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(self.src.to(device, non_blocking=non_blocking),
                     self.tgt_in.to(device, non_blocking=non_blocking),
                     self.tgt_out.to(device, non_blocking=non_blocking),
                     self.n_src_tokens, self.n_tgt_tokens, self.indices)

    def pin_memory(self) -> Batch:  # called by torch's DataLoader(pin_memory=True)
        return Batch(self.src.pin_memory(), self.tgt_in.pin_memory(), self.tgt_out.pin_memory(),
                     self.n_src_tokens, self.n_tgt_tokens, self.indices)


def pad_pieces(flat: np.ndarray, offsets: np.ndarray, indices: np.ndarray, extra: int = 1,
               multiple: int = 1, pad_id: int = PAD_ID, left: bool = False
               ) -> tuple[np.ndarray, np.ndarray]:
    """The project's one padding routine: (B, W) int64 matrix of the sentences `indices` of a
    concatenated id array (sentence i is flat[offsets[i]:offsets[i + 1]]), and their lengths.

    W = longest + `extra` free columns (for an EOS or BOS the caller writes), rounded up to
    `multiple`. Rows are left-aligned and filled with `pad_id`, or right-aligned with `left` (for
    systems that pad on the left). Gathered in one vectorised step, no Python loop over rows."""
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    width = round_up(int(lengths.max(initial=0)) + extra, multiple)
    col = np.arange(width)[None, :]  # (1, W)
    if left:
        col = col - (width - lengths)[:, None]  # (B, W): each row's pieces end in the last column
    real = (col >= 0) & (col < lengths[:, None])  # (B, W)
    out = np.full((len(indices), width), pad_id, np.int64)
    out[real] = flat[(starts[:, None] + col)[real]]
    return out, lengths


def pad_rows(rows: Sequence[Sequence[int]], extra: int = 1, multiple: int = 1, pad_id: int = PAD_ID,
             left: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """`pad_pieces` for a list of id sequences."""
    lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = (np.concatenate([np.asarray(r, np.int64) for r in rows]) if len(rows)
            else np.zeros(0, np.int64))
    return pad_pieces(flat, offsets, np.arange(len(rows)), extra, multiple, pad_id, left)


def collate(dataset: Any, indices: Sequence[int] | np.ndarray, pad_multiple: int = 1) -> Batch:
    """Padded tensors for the pairs `indices` of `dataset`, widths rounded up to `pad_multiple`.
    Fast path for `ParallelDataset` (anything with src_ids/src_offsets/tgt_ids/tgt_offsets);
    otherwise `dataset[i] -> (src, tgt)`."""
    idx = np.asarray(indices, np.int64)
    if len(idx) == 0:
        raise ValueError("cannot collate an empty batch")
    if all(hasattr(dataset, a) for a in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")):
        src, src_len = pad_pieces(dataset.src_ids, dataset.src_offsets, idx, multiple=pad_multiple)
        tgt, tgt_len = pad_pieces(dataset.tgt_ids, dataset.tgt_offsets, idx, multiple=pad_multiple)
    else:
        pairs = [dataset[int(i)] for i in idx]
        src, src_len = pad_rows([p[0] for p in pairs], multiple=pad_multiple)
        tgt, tgt_len = pad_rows([p[1] for p in pairs], multiple=pad_multiple)
    rows = np.arange(len(idx))
    src[rows, src_len] = EOS_ID  # (B, S): pieces + [EOS]
    tgt_in = np.empty_like(tgt)  # (B, T): [BOS] + pieces
    tgt_in[:, 0] = BOS_ID
    tgt_in[:, 1:] = tgt[:, :-1]
    tgt[rows, tgt_len] = EOS_ID  # (B, T): pieces + [EOS]
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt),
        n_src_tokens=int(src_len.sum()) + len(idx),
        n_tgt_tokens=int(tgt_len.sum()) + len(idx),
        indices=idx,
    )
