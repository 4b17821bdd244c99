"""BPE-dropout: the training text segmented anew every epoch (Provilkov et al. 2020). Not in the
paper; off unless `Config.p_bpe_drop > 0`.

The paper trains on one fixed BPE segmentation (§5.1). BPE-dropout skips each merge with
probability p while segmenting, so a word is seen in many spellings over the epochs ("▁buses" also
as "▁bus" "es", "▁b" "us" "es"); on small corpora this regularises like data augmentation.
sentencepiece implements it (`Tokenizer.sample_batch`); this module applies it per epoch:

- `Resegmenter` decodes the prepared training ids back to text once (the tokenizer round-trips
  exactly) and, for epoch e, segments every sentence again with a seed derived from (seed, e, side):
  epoch e's pieces are a pure function of the run's seed, so a resumed run sees the same batches.
  A pair whose sampled segmentation exceeds `max_pieces` on either side keeps its prepared one.
- `ResegmentingSampler` is the token-budget sampler (§5.1) planned on each epoch's lengths; the
  number of batches per epoch varies a little from epoch to epoch. `epoch_data()` is what to
  collate that epoch's batches from.

Only training pairs are re-segmented: dev/test scoring and decoding use the prepared (deterministic)
segmentation, as in the BPE-dropout paper.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from aiayn.data.batching import EpochLayout, TokenBatchSampler
from aiayn.data.prepare import offsets_of
from aiayn.data.tokenizer import Tokenizer


@dataclass(frozen=True)
class SegmentedPairs:
    """One epoch's segmentation of all pairs, in the layout `collate`'s fast path reads:
    sentence i of a side is ids[offsets[i]:offsets[i+1]] (subword ids, no specials)."""

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src_ids[self.src_offsets[i]:self.src_offsets[i + 1]],
                self.tgt_ids[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])


def _flatten(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = offsets_of(np.fromiter(map(len, rows), np.int64, count=len(rows)))
    return np.fromiter(itertools.chain.from_iterable(rows), np.int64, count=int(offsets[-1])), offsets


class Resegmenter:
    """Epoch-by-epoch BPE-dropout segmentations of a prepared training split.

    `dataset` is a `ParallelDataset` (or anything with src_ids/src_offsets/tgt_ids/tgt_offsets,
    `src_tokenizer` and `tgt_tokenizer`); `p` the probability of skipping a merge; `max_pieces`
    the longest sampled sentence accepted (longer ones keep the prepared segmentation)."""

    def __init__(self, dataset: Any, p: float, seed: int, max_pieces: int):
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must be in (0, 1), got {p}")
        self.p, self.seed, self.max_pieces = float(p), int(seed), int(max_pieces)
        self.tokenizers: tuple[Tokenizer, Tokenizer] = (dataset.src_tokenizer, dataset.tgt_tokenizer)
        self.prepared = SegmentedPairs(np.asarray(dataset.src_ids, np.int64), np.asarray(dataset.src_offsets),
                                       np.asarray(dataset.tgt_ids, np.int64), np.asarray(dataset.tgt_offsets))
        self.texts = tuple(
            tok.decode_batch([ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)])
            for tok, ids, offsets in ((self.tokenizers[0], self.prepared.src_ids, self.prepared.src_offsets),
                                      (self.tokenizers[1], self.prepared.tgt_ids, self.prepared.tgt_offsets)))
        self._cache: tuple[int, SegmentedPairs] | None = None

    def side_seed(self, epoch: int, side: int) -> int:
        return int(np.random.SeedSequence([self.seed, epoch, side, 29]).generate_state(1)[0])

    def epoch(self, epoch: int) -> SegmentedPairs:
        """The pairs as segmented for `epoch` (the last one is cached)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        sides = []
        for side, (tok, texts) in enumerate(zip(self.tokenizers, self.texts)):
            sides.append(tok.sample_batch(texts, self.p, self.side_seed(epoch, side)))
        src_rows, tgt_rows = sides
        too_long = [i for i, (s, t) in enumerate(zip(src_rows, tgt_rows))
                    if max(len(s), len(t)) > self.max_pieces]
        for i in too_long:
            s, t = self.prepared[i]
            src_rows[i], tgt_rows[i] = s.tolist(), t.tolist()
        pairs = SegmentedPairs(*_flatten(src_rows), *_flatten(tgt_rows))
        self._cache = (epoch, pairs)
        return pairs


class ResegmentingSampler(TokenBatchSampler):
    """`TokenBatchSampler` over a new BPE-dropout segmentation every epoch. Collate the batches of
    the current epoch from `epoch_data()`. Resuming needs only (epoch, position), as for the
    parent: the segmentation of an epoch is a function of the seed."""

    def __init__(self, resegmenter: Resegmenter, max_tokens: int, **kwargs: Any):
        if resegmenter.max_pieces > max_tokens - 1:
            raise ValueError("resegmenter.max_pieces must leave room for EOS/BOS within max_tokens")
        self.resegmenter = resegmenter
        self._planned: tuple[int, EpochLayout] | None = None
        prepared = resegmenter.prepared
        super().__init__(prepared.src_lengths, prepared.tgt_lengths, max_tokens, **kwargs)

    def layout(self, epoch: int) -> EpochLayout:
        if self._planned is None or self._planned[0] != epoch:
            pairs = self.resegmenter.epoch(epoch)
            self._planned = (epoch, self._plan(pairs.src_lengths, pairs.tgt_lengths))
        return self._planned[1]

    def epoch_data(self) -> SegmentedPairs:
        """The current epoch's segmentation, which its batches index."""
        return self.resegmenter.epoch(self.epoch)
