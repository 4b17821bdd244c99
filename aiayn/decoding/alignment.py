"""Word alignments from encoder-decoder attention, in Pharaoh format (`i-j`: source word i is
aligned to target word j, both 0-based).

Which attention. The weights are those the search used: decoder layer `layer` (default the
last, as fairseq's `--print-alignment` and Marian's `--alignment` take it), averaged over all its
heads (fairseq's default; OpenNMT-py also averages the heads, of the third layer from the top).
Rows are target pieces in the order they were generated (the EOS step last), columns the
source pieces then the source EOS. Every row sums to 1.

Pieces to words. sentencepiece marks the first piece of a word with "▁" (U+2581); a piece
without it continues the word before. EOS (source or target) belongs to no word.

- hard: for every target piece, the source piece it attends to most (EOS excluded), as fairseq
  extracts them; each (source word, target word) pair once, sorted by target then source word.
  A target word of several pieces may so link to several source words.
- soft: per target word, a distribution over the source words: the weights of a word's source
  pieces are summed, the rows of a word's target pieces averaged, and each row renormalised to 1
  once the source EOS column is dropped (most heads park weight on EOS; it is no word).
  Printed like Marian's soft alignments: one group per target word, its source-word weights
  separated by commas, groups by spaces.

`unit="piece"` keeps every piece a unit of its own (for characters in, phonemes out, where a
whole word is one unit and alignments between words say nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

WORD_START = "\u2581"  # sentencepiece's word-boundary marker
EOS_PIECE = "</s>"
Unit = Literal["word", "piece"]


def word_index(pieces: Sequence[str], unit: Unit = "word") -> list[int]:
    """The word each piece belongs to (0-based), -1 for EOS. `unit="piece"`: one word a piece."""
    out, word = [], -1
    for p in pieces:
        if p == EOS_PIECE:
            out.append(-1)
            continue
        if unit == "piece" or word < 0 or p.startswith(WORD_START):
            word += 1
        out.append(word)
    return out


def words_of(pieces: Sequence[str], unit: Unit = "word") -> list[str]:
    """The words the pieces spell, "▁" removed (a word of pieces only "▁" stays "▁")."""
    index = word_index(pieces, unit)
    words = [""] * (max(index, default=-1) + 1)
    for p, w in zip(pieces, index):
        if w >= 0:
            words[w] += p
    return [w.replace(WORD_START, "") or WORD_START for w in words]


def most_attended(attn: np.ndarray, src_words: Sequence[int], tgt_words: Sequence[int]
                  ) -> list[tuple[int, int]]:
    """(target piece, source piece) index pairs: for each target piece that is in a word, the
    source piece in a word it attends to most (ties go to the earlier piece). attn (T, S);
    src_words (S,), tgt_words (T,) from `word_index` (-1: EOS, left out)."""
    cols = [j for j, w in enumerate(src_words) if w >= 0]
    if not cols:
        return []
    return [(i, cols[int(np.argmax(attn[i, cols]))]) for i, w in enumerate(tgt_words) if w >= 0]


def hard_alignment(attn: np.ndarray, src_words: Sequence[int], tgt_words: Sequence[int]
                   ) -> list[tuple[int, int]]:
    """Sorted, distinct (source word, target word) pairs of the `most_attended` pieces."""
    pairs = {(src_words[j], tgt_words[i]) for i, j in most_attended(attn, src_words, tgt_words)}
    return sorted(pairs, key=lambda p: (p[1], p[0]))


def soft_alignment(attn: np.ndarray, src_words: Sequence[int], tgt_words: Sequence[int]
                   ) -> np.ndarray:
    """(target words, source words) float32: source pieces summed within a word, target pieces
    averaged within a word, EOS dropped, rows renormalised to sum to 1."""
    n_src, n_tgt = max(src_words, default=-1) + 1, max(tgt_words, default=-1) + 1
    out = np.zeros((n_tgt, n_src), dtype=np.float64)
    if n_src == 0 or n_tgt == 0:
        return out.astype(np.float32)
    to_src = np.zeros((len(src_words), n_src))  # (S, S_words): piece -> its word
    for j, w in enumerate(src_words):
        if w >= 0:
            to_src[j, w] = 1.0
    by_word = np.asarray(attn, dtype=np.float64) @ to_src  # (T, S_words)
    counts = np.zeros(n_tgt)
    for i, w in enumerate(tgt_words):
        if w >= 0:
            out[w] += by_word[i]
            counts[w] += 1
    out /= np.maximum(counts, 1)[:, None]
    total = out.sum(axis=1, keepdims=True)
    return (out / np.where(total > 0, total, 1.0)).astype(np.float32)


def format_hard(pairs: Sequence[tuple[int, int]]) -> str:
    """Pharaoh format: "0-0 1-2 ..."."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def format_soft(matrix: np.ndarray, decimals: int = 3) -> str:
    """One group per target word: its weights over the source words, comma-separated."""
    return " ".join(",".join(f"{x:.{decimals}f}" for x in row) for row in matrix)


@dataclass
class SentenceAlignment:
    """One sentence's translation with the attention behind it (`Translator.align`).

    source, translation: the texts. src_pieces: source pieces then "</s>" (S). tgt_pieces: the
    generated pieces then "</s>" when the output ended (T). attention: (T, S) float32, the
    cross-attention each generated piece was predicted with (rows sum to 1); layer: which
    decoder layer (0-based), head: which head, or None for the mean of all heads.
    src_words, tgt_words: the units alignments count in (`unit`). pairs: hard alignment,
    (source word, target word), 0-based. soft: (len(tgt_words), len(src_words)), rows sum to 1.
    An empty input line gives empty lists and (0, 0) matrices.
    """

    source: str
    translation: str
    src_pieces: list[str]
    tgt_pieces: list[str]
    attention: np.ndarray
    layer: int
    head: int | None
    unit: Unit
    src_words: list[str]
    tgt_words: list[str]
    pairs: list[tuple[int, int]]
    soft: np.ndarray

    @classmethod
    def build(cls, source: str, translation: str, src_pieces: list[str], tgt_pieces: list[str],
              attention: np.ndarray, layer: int, head: int | None, unit: Unit = "word"
              ) -> "SentenceAlignment":
        si, ti = word_index(src_pieces, unit), word_index(tgt_pieces, unit)
        return cls(source, translation, src_pieces, tgt_pieces, attention, layer, head, unit,
                   words_of(src_pieces, unit), words_of(tgt_pieces, unit),
                   hard_alignment(attention, si, ti), soft_alignment(attention, si, ti))

    def piece_links(self) -> list[tuple[int, int]]:
        """(row, column) cells of `attention` behind the hard alignment (`most_attended`)."""
        return most_attended(self.attention, word_index(self.src_pieces, "piece"),
                             word_index(self.tgt_pieces, "piece"))

    def format(self, mode: Literal["hard", "soft"]) -> str:
        return format_hard(self.pairs) if mode == "hard" else format_soft(self.soft)

    def to_dict(self) -> dict:
        """JSON-ready (lists of numbers, weights rounded to 4 decimals)."""
        return {"source": self.source, "translation": self.translation,
                "src_pieces": self.src_pieces, "tgt_pieces": self.tgt_pieces,
                "attention": np.round(self.attention, 4).tolist(), "layer": self.layer,
                "head": self.head, "unit": self.unit, "src_words": self.src_words,
                "tgt_words": self.tgt_words, "pairs": [list(p) for p in self.pairs],
                "soft": np.round(self.soft, 4).tolist()}
