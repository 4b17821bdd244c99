"""Token-budget batches (§5.1) and their padded tensors.

"Sentence pairs were batched together by approximate sequence length. Each training batch contained
a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

`TokenBatchSampler` groups pairs of similar length into batches of at most `max_tokens` source AND
at most `max_tokens` target tokens, counting padding: B * max source length <= max_tokens and
B * max target length <= max_tokens, where a sentence's length counts its added EOS (source,
target output) or BOS (target input), i.e. pieces + 1.

How: pairs are grouped by k = max(src_len, tgt_len) + 1, then by tgt_len - src_len (see
`length_groups`) to waste less padding on the shorter side; the groups, in that order, are cut
greedily into the largest batches with B * k_max <= max_tokens (which implies both budgets).
Because the sequence of widths is the same every epoch, so are the cut points and the batch count;
each epoch shuffles the pairs within each group (which equal-length pairs share a batch) and the
order of the batches. Everything is a function of (seed, epoch): deterministic, and resumable from
`state_dict()` = {epoch, position}.

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


@dataclass(frozen=True)
class LengthGroups:
    """The pairs grouped by their sort key, groups in key order (see `length_groups`).

    members (N,) pair indices, group after group, ascending within a group (int32 below 2**31 pairs);
    ends (G,) int64 exclusive end of each group in `members`; widths (G,) int64 each group's padded
    width k = max(src, tgt) + 1, non-decreasing.
    """

    members: np.ndarray
    ends: np.ndarray
    widths: np.ndarray

    def start(self, g: int) -> int:
        return int(self.ends[g - 1]) if g else 0

    def group(self, g: int) -> np.ndarray:
        return self.members[self.start(g) : self.ends[g]]


def length_groups(src: np.ndarray, tgt: np.ndarray, chunk: int = 1 << 20,
                  table_limit: int = 1 << 22) -> LengthGroups:
    """Group pairs (lengths without EOS/BOS) by key = (k, tgt - src), k = max(src, tgt) + 1.

    Ordering by k, then by tgt - src, runs within one k from "source longest, target short"
    through "both k - 1" to "target longest, source short", so neighbours have similar lengths on
    both sides: on Multi30k this wastes 2-4x less padding than ordering by k alone at small
    budgets. A group is every pair with one key; `TokenBatchSampler` shuffles within groups.

    A counting sort written out, `chunk` pairs at a time, because the sampler runs it at every
    start-up: all it holds is `members` (4 bytes a pair) and one chunk's temporaries, where an
    argsort of the whole key array would hold 8-byte keys and 8-byte indices per pair (10M pairs:
    0.3-0.5 s, peak 78 MB; docs/experiments/wmt.md). Keys too spread for a lookup table of
    `table_limit` entries (sentences of thousands of tokens, as translation may meet) take
    np.unique instead.
    """
    n = len(src)
    smax, tmax = int(src.max(initial=0)), int(tgt.max(initial=0))
    span = smax + tmax + 1  # tgt - src + smax lies in [0, span)
    index_type = np.int32 if n < 2**31 else np.int64

    def keys(lo: int, hi: int) -> np.ndarray:
        s, t = src[lo:hi].astype(np.int64), tgt[lo:hi].astype(np.int64)
        key = np.maximum(s, t)
        key += 1
        key *= span
        key += t
        key -= s
        key += smax
        return key

    n_keys = (max(smax, tmax) + 2) * span
    if n_keys > table_limit:
        present, group_of = np.unique(keys(0, n), return_inverse=True)
        counts = np.bincount(group_of, minlength=len(present))
        members = np.argsort(group_of, kind="stable").astype(index_type)
        return LengthGroups(members, np.cumsum(counts), present // span)

    counts = np.zeros(n_keys, np.int64)
    for lo in range(0, n, chunk):
        counts += np.bincount(keys(lo, lo + chunk), minlength=n_keys)
    present = np.flatnonzero(counts)
    n_groups = len(present)
    group_type = np.uint16 if n_groups <= 1 << 16 else np.int32  # uint16 sorts by radix
    group_of_key = np.zeros(n_keys, group_type)
    group_of_key[present] = np.arange(n_groups)
    ends = np.cumsum(counts[present])
    cursor = ends - counts[present]  # where each group's next member goes
    members = np.empty(n, index_type)
    for lo in range(0, n, chunk):
        g = group_of_key[keys(lo, lo + chunk)]
        order = np.argsort(g, kind="stable")  # this chunk's pairs grouped, ascending within
        here = np.bincount(g, minlength=n_groups)
        first = np.cumsum(here) - here  # start of each group's run in `order`
        g_sorted = g[order]
        members[cursor[g_sorted] + np.arange(len(order)) - first[g_sorted]] = order + lo
        cursor += here
    return LengthGroups(members, ends, present // span)


def cut_points(widths: np.ndarray, ends: np.ndarray, max_tokens: int,
               max_sentences: int | None = None) -> np.ndarray:
    """Batch boundaries over pairs in runs of non-decreasing width (run r: positions
    [ends[r - 1], ends[r]) of width widths[r]): the greedy largest batches with
    size * widest <= max_tokens (and size <= max_sentences when given). Returns starts + [n], so
    batch j is [b[j], b[j + 1]). A width > max_tokens gets a batch of its own (callers reject it
    first when not allowed)."""
    n = int(ends[-1]) if len(ends) else 0
    if n == 0:
        return np.zeros(1, np.int64)
    vals = np.asarray(widths, np.int64)  # int32 widths: max_tokens may not fit int32
    end = np.asarray(ends, np.int64)
    cap = np.maximum(max_tokens // vals, 1)
    if max_sentences is not None:
        cap = np.minimum(cap, max_sentences)
    # A batch from i whose widest member is in run r holds at most cap[r] pairs and at most the
    # pairs from i to the end of run r: the batch is the best such r. Caps fall as widths grow,
    # so while run r has cap[r] pairs left from i, the batch is exactly cap[r] pairs: those
    # batches are taken all at once, and the loop runs a few times per run, not per batch.
    starts = [np.zeros(1, np.int64)]
    i, r = 0, 0
    while i < n:
        while end[r] <= i:
            r += 1
        full = (int(end[r]) - i) // int(cap[r])
        if full:
            starts.append(i + cap[r] * np.arange(1, full + 1, dtype=np.int64))
            i += full * int(cap[r])
            continue
        i += int(np.max(np.minimum(end[r:] - i, cap[r:])))
        starts.append(np.array([i], np.int64))
    return np.concatenate(starts)


def split_for_ranks(bounds: np.ndarray, widths: np.ndarray, ends: np.ndarray, world_size: int
                    ) -> np.ndarray:
    """Split the largest batches (by padded tokens) in two until the count divides by world_size."""
    b = [int(x) for x in bounds]
    while (len(b) - 1) % world_size:
        sizes = np.diff(b)
        widest = np.asarray(widths)[np.searchsorted(ends, np.asarray(b[1:]) - 1, side="right")]
        padded = sizes * widest  # each batch's last pair is its widest
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


class _EpochPlan:
    """One epoch's batches, made on demand from (seed, epoch). The pairs in key order, each
    group's members in the epoch's random order (`rng([seed, epoch, group])`), are cut at the
    sampler's fixed `bounds`; the batches come in the order `rng([seed, epoch])` draws. Without
    shuffling: members in index order, batches shortest first. Each group is shuffled once, when
    a batch first needs it, and kept for the rest of the epoch (at most 4 bytes a pair)."""

    def __init__(self, groups: LengthGroups, bounds: np.ndarray, seed: int, epoch: int,
                 shuffle: bool):
        self.groups, self.bounds, self.seed, self.epoch = groups, bounds, seed, epoch
        self.shuffle = shuffle
        n_batches = len(bounds) - 1
        self.order = (np.random.default_rng([seed, epoch]).permutation(n_batches) if shuffle
                      else np.arange(n_batches))
        self._shuffled: dict[int, np.ndarray] = {}

    def _group(self, g: int) -> np.ndarray:
        if not self.shuffle:
            return self.groups.group(g)
        if g not in self._shuffled:
            rng = np.random.default_rng([self.seed, self.epoch, g])
            self._shuffled[g] = rng.permutation(self.groups.group(g))
        return self._shuffled[g]

    def batch(self, j: int) -> np.ndarray:
        """Batch j of the cut (positions bounds[j]..bounds[j + 1] of the key order), int64."""
        lo, hi = int(self.bounds[j]), int(self.bounds[j + 1])
        ends = self.groups.ends
        first, last = np.searchsorted(ends, [lo, hi - 1], side="right")
        parts = []
        for g in range(int(first), int(last) + 1):
            start = self.groups.start(g)
            parts.append(self._group(g)[max(lo, start) - start : min(hi, int(ends[g])) - start])
        return np.concatenate(parts).astype(np.int64)


class TokenBatchSampler:
    """Batches (numpy arrays of pair indices) for one rank, epoch after epoch.

    Iterating yields the rest of the current epoch from `position`; a new `iter()` after a finished
    epoch starts the next one. `len()` is the number of batches per epoch for this rank (the same
    for every rank and every epoch). `state_dict()` counts the batches handed out: with a
    prefetching loader, save the number the trainer consumed instead.

    `pad_multiple` rounds each batch's width up to a multiple (`collate` pads to it) and charges
    the budget that width: fewer distinct tensor shapes. `max_sentences` caps a batch's pairs.

    Start-up does no per-epoch work: an epoch's plan is its batch order (one number a batch) and,
    made when a batch first needs it, each length group's shuffled copy; so the first batch comes
    as fast at 10M pairs as at 0.3M (docs/experiments/wmt.md).
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
        self.groups = length_groups(src, tgt)
        # pairs stay grouped by their own widths; the budget charges each batch its rounded width
        widths = round_up(self.groups.widths, self.pad_multiple)
        too_big = np.flatnonzero(widths > self.max_tokens)
        if len(too_big) and not allow_oversize:
            members = np.concatenate([self.groups.group(int(g)) for g in too_big])
            i = int(members.min())
            raise UserError(
                f"pair {i} has {src[i] + 1} source / {tgt[i] + 1} target tokens with EOS/BOS, more "
                f"than max_tokens={self.max_tokens} ({len(members)} such pairs); raise max_tokens or "
                f"re-run aiayn prepare with --max-len {self.max_tokens - 1}"
            )
        ends = self.groups.ends
        self.bounds = split_for_ranks(cut_points(widths, ends, self.max_tokens, max_sentences),
                                      widths, ends, world_size)
        self._plan: _EpochPlan | None = None

    # --- one epoch ------------------------------------------------------------------------------

    def _epoch_plan(self, epoch: int) -> _EpochPlan:
        if self._plan is None or self._plan.epoch != epoch:
            self._plan = _EpochPlan(self.groups, self.bounds, self.seed, epoch, self.shuffle)
        return self._plan

    def epoch_batches(self, epoch: int | None = None, all_ranks: bool = False) -> list[np.ndarray]:
        """The batches of `epoch` (default: the current one) in iteration order, for this rank or,
        with `all_ranks`, for all ranks interleaved (batch b belongs to rank b % world_size).
        Without `shuffle`: every epoch the same batches, shortest first."""
        plan = self._epoch_plan(self.epoch if epoch is None else epoch)
        order = plan.order if all_ranks else plan.order[self.rank :: self.world_size]
        return [plan.batch(int(j)) for j in order]

    def __len__(self) -> int:
        """Batches per rank in every epoch."""
        return (len(self.bounds) - 1) // self.world_size

    def __iter__(self) -> Iterator[np.ndarray]:
        if self.position >= len(self):
            self.set_epoch(self.epoch + 1)
        plan = self._epoch_plan(self.epoch)
        while self.position < len(self):
            self.position += 1
            yield plan.batch(int(plan.order[self.rank + (self.position - 1) * self.world_size]))

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
