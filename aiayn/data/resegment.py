"""BPE-dropout: the training text segmented anew every epoch (Provilkov et al. 2020). Not in the
paper; off unless `Config.p_bpe_drop > 0`.

The paper trains on one fixed BPE segmentation (§5.1). BPE-dropout segments each word with the
vocabulary's merges as usual, except that at every merge step each applicable merge is dropped with
probability p (the paper's definition: a merge skipped now may still apply at a later step), so a
word is seen in many spellings over the epochs ("▁buses" also as "▁bus" "es", "▁b" "us" "es"); on
small corpora this regularises like data augmentation.

- `BpeDropout` applies a sentencepiece BPE vocabulary's merges itself: start from characters, then
  repeatedly merge the adjacent pair whose concatenation is the highest-scoring piece (leftmost on
  ties), as sentencepiece does. We do not use sentencepiece's own sampling
  (`enable_sampling=True`): its draws differ from process to process whatever the seed (measured
  with sentencepiece 0.2), so a resumed run would see other segmentations, and it drops a skipped
  merge for good, which fragments more (1.41x the pieces at p = 0.1 on Multi30k).
  A word whose prepared pieces are not what these merges give at p = 0 (a character without a
  piece of its own, spelled in byte-fallback pieces) keeps its prepared pieces.
- `Resegmenter` cuts the prepared training ids into words once (a word starts at a piece beginning
  with "▁") and, for epoch e, segments every word occurrence again with a generator seeded from
  (seed, e, side): epoch e's pieces are a pure function of the run's seed, so a resumed run sees
  the same batches. A pair whose new segmentation exceeds `max_pieces` on either side keeps its
  prepared one.
- `ResegmentingSampler` is the token-budget sampler (§5.1) planned on each epoch's lengths; the
  number of batches per epoch varies a little from epoch to epoch. `epoch_data()` is what to
  collate that epoch's batches from.

Only training pairs are re-segmented: dev/test scoring and decoding use the prepared (deterministic)
segmentation, as in the BPE-dropout paper.
"""

from __future__ import annotations

import itertools
import random
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


class BpeDropout:
    """The merges of a sentencepiece BPE vocabulary (`Tokenizer`), applied with dropout.

    `merges[(a, b)] = (score, c)`: adjacent pieces a, b may merge into piece c, whose score orders
    the merges. `chars(word)` is a word's starting symbols (character piece ids), or None when a
    character has no piece of its own. `pieces[i]` is piece i's text."""

    def __init__(self, tokenizer: Tokenizer):
        pieces = tokenizer.pieces()
        self.pieces = [piece for piece, _, _ in pieces]
        ids = {piece: i for i, (piece, _, normal) in enumerate(pieces) if normal}
        self.merges: dict[tuple[int, int], tuple[float, int]] = {}
        for c, (piece, score, normal) in enumerate(pieces):
            if not normal:
                continue
            for k in range(1, len(piece)):
                a, b = ids.get(piece[:k]), ids.get(piece[k:])
                if a is not None and b is not None:
                    self.merges[(a, b)] = (score, c)
        self.char_ids = {piece: i for piece, i in ids.items() if len(piece) == 1}

    def chars(self, word: str) -> list[int] | None:
        out = [self.char_ids.get(ch) for ch in word]
        return None if None in out else out  # type: ignore[return-value]

    def segment(self, symbols: list[int], p: float, draw: Any) -> list[int]:
        """Merge `symbols` (piece ids) until no merge is left: at each step every applicable merge
        is dropped with probability `p` (`draw()` gives uniforms in [0, 1)), and the best of the
        rest applied. p = 0 is plain BPE. Returns a new list."""
        syms, merges = list(symbols), self.merges
        while len(syms) > 1:
            best, best_score, at = -1, 0.0, -1
            for i in range(len(syms) - 1):
                m = merges.get((syms[i], syms[i + 1]))
                if m is not None and (best < 0 or m[0] > best_score) and (p == 0.0 or draw() >= p):
                    best, best_score, at = m[1], m[0], i
            if best < 0:
                break
            syms[at:at + 2] = [best]
        return syms


class _Words:
    """One side's training text cut into word occurrences: occurrence k is unique word
    `word_of[k]`, sentence i's occurrences are word_of[offsets[i]:offsets[i+1]]. `chars[w]` is unique
    word w's starting symbols, `prepared[w]` its prepared pieces; chars[w] is None when the merges
    do not reproduce the prepared pieces (the word is then never re-segmented)."""

    def __init__(self, ids: np.ndarray, sent_offsets: np.ndarray, bpe: BpeDropout):
        starts_word = np.array([piece.startswith("▁") for piece in bpe.pieces], bool)
        first = starts_word[ids]
        first[sent_offsets[:-1][np.diff(sent_offsets) > 0]] = True  # a sentence starts a word
        bounds = np.append(np.flatnonzero(first), len(ids))  # word k is ids[bounds[k]:bounds[k+1]]
        index: dict[tuple[int, ...], int] = {}
        self.prepared: list[tuple[int, ...]] = []
        word_of = np.empty(len(bounds) - 1, np.int64)
        flat = ids.tolist()
        for k in range(len(bounds) - 1):
            key = tuple(flat[bounds[k]:bounds[k + 1]])
            w = index.get(key)
            if w is None:
                w = index[key] = len(self.prepared)
                self.prepared.append(key)
            word_of[k] = w
        self.word_of = word_of
        # sentence i's words: those whose first piece lies in [sent_offsets[i], sent_offsets[i+1])
        self.offsets = np.searchsorted(bounds[:-1], sent_offsets).astype(np.int64)
        self.chars: list[list[int] | None] = []
        for key in self.prepared:
            c = bpe.chars("".join(bpe.pieces[i] for i in key))
            if c is not None and tuple(bpe.segment(c, 0.0, None)) != key:
                c = None
            self.chars.append(c)

    @property
    def frozen(self) -> int:
        """Unique words kept as prepared."""
        return sum(c is None for c in self.chars)


class Resegmenter:
    """Epoch-by-epoch BPE-dropout segmentations of a prepared training split.

    `dataset` is a `ParallelDataset` (or anything with src_ids/src_offsets/tgt_ids/tgt_offsets,
    `src_tokenizer` and `tgt_tokenizer`, both BPE); `p` the probability of dropping a merge;
    `max_pieces` the longest sentence accepted (longer ones keep the prepared segmentation)."""

    def __init__(self, dataset: Any, p: float, seed: int, max_pieces: int):
        if not 0.0 < p < 1.0:
            raise ValueError(f"p must be in (0, 1), got {p}")
        self.p, self.seed, self.max_pieces = float(p), int(seed), int(max_pieces)
        self.prepared = SegmentedPairs(np.asarray(dataset.src_ids, np.int64), np.asarray(dataset.src_offsets),
                                       np.asarray(dataset.tgt_ids, np.int64), np.asarray(dataset.tgt_offsets))
        toks = (dataset.src_tokenizer, dataset.tgt_tokenizer)
        bpes = [BpeDropout(toks[0])]
        bpes.append(bpes[0] if toks[1] == toks[0] else BpeDropout(toks[1]))
        self.bpe = tuple(bpes)
        self.words = (_Words(self.prepared.src_ids, self.prepared.src_offsets, bpes[0]),
                      _Words(self.prepared.tgt_ids, self.prepared.tgt_offsets, bpes[1]))
        self._cache: tuple[int, SegmentedPairs] | None = None

    def side_seed(self, epoch: int, side: int) -> int:
        return int(np.random.SeedSequence([self.seed, epoch, side, 29]).generate_state(1)[0])

    def _side(self, epoch: int, side: int) -> list[list[int]]:
        """Every sentence of one side, segmented for `epoch`."""
        words, bpe, p = self.words[side], self.bpe[side], self.p
        draw = random.Random(self.side_seed(epoch, side)).random
        segment, chars, prepared = bpe.segment, words.chars, words.prepared
        occurrences = [list(prepared[w]) if chars[w] is None else segment(chars[w], p, draw)
                       for w in words.word_of.tolist()]
        o = words.offsets.tolist()
        return [list(itertools.chain.from_iterable(occurrences[o[i]:o[i + 1]])) for i in range(len(o) - 1)]

    def epoch(self, epoch: int) -> SegmentedPairs:
        """The pairs as segmented for `epoch` (the last one is cached)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        src_rows, tgt_rows = self._side(epoch, 0), self._side(epoch, 1)
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
