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
Because the sorted sequence of k is the same every epoch, so are the cut points and the batch count
(unless the text is re-segmented every epoch: `aiayn.data.resegment`, BPE-dropout); each epoch
changes which equal-length pairs share a batch and the order of the batches. Everything is a
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


def sort_key(src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, secondary) per pair; lengths exclude EOS/BOS.

    k = max(src, tgt) + 1 is the padded width the budget sees. Among equal k, secondary = tgt - src
    (shifted to be >= 0) runs from "source longest, target short" through "both k - 1" to "target
    longest, source short", so neighbours have similar lengths on both sides: on Multi30k this
    wastes 2-4x less padding than sorting by k alone at small budgets.
    """
    s = np.asarray(src_lengths, np.int64)
    t = np.asarray(tgt_lengths, np.int64)
    return np.maximum(s, t) + 1, t - s + int(s.max(initial=0))


def length_order(k: np.ndarray, secondary: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Indices sorted by (k, secondary); ties in random order (by index when `rng` is None)."""
    n = len(k)
    perm = rng.permutation(n) if rng is not None else np.arange(n)
    key = k[perm] * (int(secondary.max(initial=0)) + 1) + secondary[perm]
    return perm[np.argsort(key, kind="stable")]


def cut_points(k_sorted: np.ndarray, max_tokens: int) -> np.ndarray:
    """Batch boundaries over a non-decreasing array of widths: the greedy largest batches with
    size * max width <= max_tokens. Returns starts+[n], so batch j is [b[j], b[j+1]).
    A width > max_tokens gets a batch of its own (callers reject it first when not allowed)."""
    n = len(k_sorted)
    if n == 0:
        return np.zeros(1, np.int64)
    # Work over the distinct widths (a few hundred at most) instead of over pairs: a batch from i
    # whose widest member has width v holds at most max_tokens // v pairs, and at most the pairs
    # from i to the last one of width v; the batch is the best such v.
    vals, first = np.unique(k_sorted, return_index=True)
    end = np.append(first[1:], n)  # exclusive end of each width's run
    cap = max_tokens // vals
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


@dataclass(frozen=True)
class EpochLayout:
    """One epoch's lengths (pieces, no EOS/BOS), sort keys and batch boundaries (see `cut_points`)."""

    src: np.ndarray
    tgt: np.ndarray
    k: np.ndarray
    secondary: np.ndarray
    bounds: np.ndarray


class TokenBatchSampler:
    """Batches (numpy arrays of pair indices) for one rank, epoch after epoch.

    Iterating yields the rest of the current epoch from `position`; a new `iter()` after a finished
    epoch starts the next one. `len()` is the number of batches per epoch for this rank (the same
    for every rank; the same for every epoch unless a subclass re-segments the text per epoch, as
    `aiayn.data.resegment.ResegmentingSampler` does). `state_dict()` counts the batches handed
    out: with a prefetching loader, save the number the trainer consumed instead.
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
    ):
        src = np.asarray(src_lengths, np.int64)
        tgt = np.asarray(tgt_lengths, np.int64)
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
        self.allow_oversize = allow_oversize
        self._fixed = self._plan(src, tgt)
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def _plan(self, src: np.ndarray, tgt: np.ndarray) -> EpochLayout:
        k, secondary = sort_key(src, tgt)
        too_big = np.flatnonzero(k > self.max_tokens)
        if len(too_big) and not self.allow_oversize:
            i = int(too_big[0])
            raise UserError(
                f"pair {i} has {src[i] + 1} source / {tgt[i] + 1} target tokens with EOS/BOS, more "
                f"than max_tokens={self.max_tokens} ({len(too_big)} such pairs); raise max_tokens or "
                f"re-run aiayn prepare with --max-len {self.max_tokens - 1}"
            )
        k_sorted = np.sort(k)
        bounds = split_for_ranks(cut_points(k_sorted, self.max_tokens), k_sorted, self.world_size)
        return EpochLayout(src, tgt, k, secondary, bounds)

    def layout(self, epoch: int) -> EpochLayout:
        """The lengths and cut points of `epoch`: the same every epoch here; a subclass whose
        segmentation changes per epoch (BPE-dropout) plans each epoch anew."""
        return self._fixed

    # --- one epoch ------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int | None = None, all_ranks: bool = False) -> list[np.ndarray]:
        """The batches of `epoch` (default: the current one) in iteration order, for this rank or,
        with `all_ranks`, for all ranks interleaved (batch b belongs to rank b % world_size)."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            lay = self.layout(epoch)
            rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
            order = length_order(lay.k, lay.secondary, rng)
            batches = np.split(order, lay.bounds[1:-1])
            if rng is not None:
                batches = [batches[j] for j in rng.permutation(len(batches))]
            self._cache = (epoch, batches)
        batches = self._cache[1]
        return batches if all_ranks else batches[self.rank :: self.world_size]

    def batches_per_rank(self, epoch: int) -> int:
        return (len(self.layout(epoch).bounds) - 1) // self.world_size

    def __len__(self) -> int:
        """Batches per rank in the current epoch."""
        return self.batches_per_rank(self.epoch)

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
        lay = self.layout(self.epoch)
        for idx in self.epoch_batches(all_ranks=True):
            s, t = lay.src[idx] + 1, lay.tgt[idx] + 1
            real += int(s.sum() + t.sum())
            padded += len(idx) * int(s.max() + t.max())
        return 1.0 - real / padded if padded else 0.0

    # --- resuming -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "max_tokens": self.max_tokens, "world_size": self.world_size,
                "n_pairs": len(self.src_lengths), "batches_per_rank": len(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` left off; the data and batching settings must be the same."""
        mine = self.state_dict()
        for key in ("seed", "max_tokens", "world_size", "n_pairs"):
            if key in state and state[key] != mine[key]:
                raise UserError(f"cannot resume batches: saved with {key}={state[key]}, now {mine[key]}")
        epoch, position = int(state["epoch"]), int(state["position"])
        n = self.batches_per_rank(epoch)
        if not 0 <= position <= n:
            raise UserError(f"cannot resume batches: position {position} outside 0..{n}")
        self.epoch, self.position = epoch, position


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


def pad_pieces(
    flat: np.ndarray, offsets: np.ndarray, indices: np.ndarray, extra: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(B, max_len + extra) int64 matrix of the sentences' pieces, left-aligned and PAD-filled, and
    their lengths; gathered from a concatenated id array in one vectorised step."""
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    width = int(lengths.max(initial=0)) + extra
    col = np.arange(width)
    real = col[None, :] < lengths[:, None]  # (B, W)
    out = np.full((len(indices), width), PAD_ID, np.int64)
    out[real] = flat[(starts[:, None] + col[None, :])[real]]
    return out, lengths


def _pad_rows(rows: list[np.ndarray], extra: int = 1) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max(initial=0)) + extra), PAD_ID, np.int64)
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out, lengths


def collate(dataset: Any, indices: Sequence[int] | np.ndarray) -> Batch:
    """Padded tensors for the pairs `indices` of `dataset`. Fast path for `ParallelDataset`
    (anything with src_ids/src_offsets/tgt_ids/tgt_offsets); otherwise `dataset[i] -> (src, tgt)`."""
    idx = np.asarray(indices, np.int64)
    if len(idx) == 0:
        raise ValueError("cannot collate an empty batch")
    if all(hasattr(dataset, a) for a in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")):
        src, src_len = pad_pieces(dataset.src_ids, dataset.src_offsets, idx)
        tgt, tgt_len = pad_pieces(dataset.tgt_ids, dataset.tgt_offsets, idx)
    else:
        pairs = [dataset[int(i)] for i in idx]
        src, src_len = _pad_rows([np.asarray(p[0]) for p in pairs])
        tgt, tgt_len = _pad_rows([np.asarray(p[1]) for p in pairs])
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
