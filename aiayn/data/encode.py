"""Encoding a parallel corpus at scale (what `aiayn.data.prepare` runs): a seeded sample of pairs to
learn the vocabulary from, and subword encoding of chunks of pairs over worker processes.

Why our own sample rather than sentencepiece's `input_sentence_size`: the sample is drawn while
the corpus is checked anyway (no extra pass), it is seeded, it keeps both sides of a pair
together (one shared vocabulary learns from the same pairs in both languages), and it is held in
memory once, in Python, instead of sentencepiece loading and shuffling every sentence.

Why processes: sentencepiece encodes in C++ with its own threads, but turning its Python lists of
ids into numpy arrays holds the interpreter lock; worker processes do both in parallel, one chunk
each, and send back compact arrays.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from aiayn.data.corpus import empty_pairs, length_filters, nul_pairs
from aiayn.data.dataset import token_dtype
from aiayn.data.tokenizer import Tokenizer

SAMPLE_SEED = 20170612  # the reservoir's seed: one fixed sample for given inputs and size
FILTERS = ("empty", "nul", "too_long", "length_ratio")  # why `clean` drops a training pair


# --- the vocabulary sample ----------------------------------------------------------------------


class PairReservoir:
    """A uniform random sample of at most `size` pairs from a stream of unknown length
    (reservoir sampling, Algorithm R), seeded; `size` None keeps every pair. `pairs()` returns the
    sample in corpus order, so a corpus no larger than `size` comes back whole and in order."""

    def __init__(self, size: int | None, seed: int = SAMPLE_SEED):
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.seen = 0
        self.src: list[str] = []
        self.tgt: list[str] = []
        self.index: list[int] = []  # corpus position of each kept pair

    def add(self, src: list[str], tgt: list[str]) -> None:
        """Offer the next pairs of the stream."""
        n = len(src)
        room = n if self.size is None else max(0, min(n, self.size - len(self.src)))
        self.src += src[:room]
        self.tgt += tgt[:room]
        self.index += range(self.seen, self.seen + room)
        if room < n:
            # Algorithm R: pair number i (0-based) replaces slot r ~ U{0..i} when r < size; drawn
            # for the whole chunk at once, applied in stream order
            # (one double per pair: the same draws however the stream is chunked)
            position = np.arange(self.seen + room, self.seen + n)
            slot = (self.rng.random(len(position)) * (position + 1)).astype(np.int64)
            for j in np.flatnonzero(slot < self.size):
                r, k = int(slot[j]), room + int(j)
                self.src[r], self.tgt[r], self.index[r] = src[k], tgt[k], int(position[j])
        self.seen += n

    def pairs(self) -> tuple[list[str], list[str]]:
        order = np.argsort(np.asarray(self.index, np.int64), kind="stable")
        return [self.src[i] for i in order], [self.tgt[i] for i in order]


# --- encoding -----------------------------------------------------------------------------------


@dataclass
class EncodedChunk:
    """Subword ids of a chunk of pairs: per side the ids concatenated and the length of each
    sentence (int32); `empty` marks pairs with a blank side, `nul` the others with a NUL byte
    (both dropped from training data)."""

    src_ids: np.ndarray
    src_len: np.ndarray
    tgt_ids: np.ndarray
    tgt_len: np.ndarray
    empty: np.ndarray
    nul: np.ndarray

    def __len__(self) -> int:
        return len(self.src_len)

    def select(self, keep: np.ndarray) -> "EncodedChunk":
        """The pairs where `keep` is True, in order."""
        return EncodedChunk(self.src_ids[np.repeat(keep, self.src_len)], self.src_len[keep],
                            self.tgt_ids[np.repeat(keep, self.tgt_len)], self.tgt_len[keep],
                            self.empty[keep], self.nul[keep])

    @staticmethod
    def concatenate(chunks: list["EncodedChunk"], src_dtype: np.dtype, tgt_dtype: np.dtype) -> "EncodedChunk":
        def cat(arrays, dtype):
            return np.concatenate(arrays) if arrays else np.zeros(0, dtype)

        return EncodedChunk(cat([c.src_ids for c in chunks], src_dtype),
                            cat([c.src_len for c in chunks], np.int32),
                            cat([c.tgt_ids for c in chunks], tgt_dtype),
                            cat([c.tgt_len for c in chunks], np.int32),
                            cat([c.empty for c in chunks], bool),
                            cat([c.nul for c in chunks], bool))


def encode_side(tok: Tokenizer, lines: list[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(ids concatenated in the vocabulary's token dtype, int32 length per line) of `lines`."""
    enc = tok.encode_batch(lines, num_threads=num_threads)
    lengths = np.fromiter(map(len, enc), np.int32, count=len(enc))
    flat = np.fromiter(itertools.chain.from_iterable(enc), token_dtype(tok.vocab_size),
                       count=int(lengths.sum(dtype=np.int64)))
    return flat, lengths


def encode_chunk(src_tok: Tokenizer, tgt_tok: Tokenizer, src: list[str], tgt: list[str],
                 num_threads: int = 1) -> EncodedChunk:
    empty = empty_pairs(src, tgt)
    return EncodedChunk(*encode_side(src_tok, src, num_threads), *encode_side(tgt_tok, tgt, num_threads),
                        empty, nul_pairs(src, tgt) & ~empty)


def clean(enc: EncodedChunk, max_len: int, max_ratio: float) -> tuple[EncodedChunk, dict[str, int]]:
    """Drop training pairs with an empty side or a NUL byte, then those too long or too lopsided in
    subword tokens (`length_filters`); (kept pairs, counts by `FILTERS`), each pair counted under
    its first reason."""
    junk = enc.empty | enc.nul
    too_long, bad_ratio = length_filters(enc.src_len, enc.tgt_len, max_len, max_ratio)
    too_long &= ~junk
    bad_ratio &= ~(junk | too_long)
    keep = ~(junk | too_long | bad_ratio)
    counts = {"empty": int(enc.empty.sum()), "nul": int(enc.nul.sum()), "too_long": int(too_long.sum()),
              "length_ratio": int(bad_ratio.sum())}
    return enc.select(keep), counts


_WORKER_TOKENIZERS: tuple[Tokenizer, Tokenizer] | None = None


def _start_worker(src_proto: bytes, tgt_proto: bytes | None) -> None:
    global _WORKER_TOKENIZERS
    src = Tokenizer(src_proto)
    _WORKER_TOKENIZERS = (src, src if tgt_proto is None else Tokenizer(tgt_proto))


def _encode_in_worker(chunk: tuple[list[str], list[str]]) -> EncodedChunk:
    assert _WORKER_TOKENIZERS is not None
    return encode_chunk(*_WORKER_TOKENIZERS, *chunk)


class ChunkEncoder:
    """`map(chunks)`: the `EncodedChunk` of each (source lines, target lines) chunk, in order.
    With `workers` >= 1, encoded in that many worker processes, at most two chunks per worker in
    flight (memory stays bounded however fast the chunks are read); with 0, in this process."""

    def __init__(self, src_tok: Tokenizer, tgt_tok: Tokenizer, workers: int):
        self.src_tok, self.tgt_tok, self.workers = src_tok, tgt_tok, workers
        self._pool = None

    def __enter__(self) -> "ChunkEncoder":
        if self.workers > 0:
            # fork where there is one: workers start at once and need not import aiayn again
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            tgt = None if self.tgt_tok is self.src_tok else self.tgt_tok.model_proto
            self._pool = ctx.Pool(self.workers, initializer=_start_worker,
                                  initargs=(self.src_tok.model_proto, tgt))
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.terminate() if exc[0] is not None else self._pool.close()
            self._pool.join()
            self._pool = None

    def map(self, chunks: Iterable[tuple[list[str], list[str]]]) -> Iterator[EncodedChunk]:
        if self._pool is None:
            for src, tgt in chunks:
                yield encode_chunk(self.src_tok, self.tgt_tok, src, tgt)
            return
        pending: collections.deque = collections.deque()
        for chunk in chunks:
            pending.append(self._pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
