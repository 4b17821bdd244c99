"""The chart parser's data: the splits of a corpus made by `aiayn treebank`, the vocabularies a
model is built on, and batches of sentences of similar lengths (aiayn/parsing/chart/__init__.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from aiayn.data.corpus import read_lines
from aiayn.errors import UserError
from aiayn.parsing.chart.model import CHAR_SPECIALS, SPECIALS, char_ids, encode, model_words, span_targets
from aiayn.parsing.chart.trees import NONE, tree_spans
from aiayn.parsing.treebank import parse_tree


@dataclass
class Sentence:
    words: list[str]  # as the model reads them (rare words as their signatures)
    spans: list[tuple[int, int, int]]  # (i, j, label id)
    spelling: list[str]  # the words as written (what the char encoder reads)
    gold: str = ""  # the tree on one line (what dev F1 scores against)

    @property
    def cells(self) -> int:
        """The spans i < j <= n the loss counts: n (n + 1) / 2."""
        n = len(self.words)
        return n * (n + 1) // 2


@dataclass
class Vocabulary:
    """What a model's ids mean: words (SPECIALS first), labels (NONE first) and characters
    (CHAR_SPECIALS first; empty for a model without the character CNN)."""

    words: list[str]
    labels: list[str]
    chars: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.word_index = {w: k for k, w in enumerate(self.words)}
        self.label_index = {lab: k for k, lab in enumerate(self.labels)}
        self.char_index = {c: k for k, c in enumerate(self.chars)}

    @classmethod
    def of_training_set(cls, words: Sequence[Sequence[str]], trees: Sequence, with_chars: bool
                        ) -> "Vocabulary":
        counts = Counter(w for ws in words for w in ws)
        labels = Counter(lab for t in trees for _, _, lab in tree_spans(t))
        chars = sorted({c for t in trees for w in t.leaves() for c in w}) if with_chars else None
        return cls(list(SPECIALS) + sorted(counts), [NONE] + sorted(labels),
                   list(CHAR_SPECIALS) + chars if chars is not None else [])

    def as_dict(self) -> dict[str, list[str]]:
        return {"words": self.words, "labels": self.labels, "chars": self.chars}


def read_split(corpus: Path, split: str) -> tuple[list[list[str]], list, list[str]]:
    """SPLIT.src (or SPLIT.words) and SPLIT.gold of an `aiayn treebank` directory, as word lists,
    nltk trees and the gold lines; a line count or word mismatch is one error line."""
    src = corpus / f"{split}.src"
    if not src.exists():
        src = corpus / f"{split}.words"
    gold = corpus / f"{split}.gold"
    for p in (src, gold):
        if not p.exists():
            raise UserError(f"{p}: no such file (a chart parser trains on a corpus made by "
                            f"`aiayn treebank --out {corpus}`)")
    words = [line.split() for line in read_lines(src)]
    lines = read_lines(gold)
    trees = [parse_tree(line, f"{gold}:{k + 1}") for k, line in enumerate(lines)]
    if len(words) != len(trees):
        raise UserError(f"{src} has {len(words)} lines but {gold} has {len(trees)}")
    for k, (w, t) in enumerate(zip(words, trees)):
        if len(w) != len(t.leaves()):
            raise UserError(f"{src}:{k + 1}: {len(w)} words, but its tree in {gold} has {len(t.leaves())}")
    return words, trees, lines


def sentences(words_list: Sequence[Sequence[str]], trees: Sequence, gold: Sequence[str],
              vocab: Vocabulary) -> list[Sentence]:
    """Sentences as the model reads them (`model_words`), with their spans' label ids (a label
    training never saw: 0, none) and their spelling (the gold tree's leaves: the words before
    signatures replaced the rare ones)."""
    return [Sentence(model_words(words, vocab.word_index),
                     [(i, j, vocab.label_index.get(lab, 0)) for i, j, lab in tree_spans(tree)],
                     tree.leaves(), line)
            for words, tree, line in zip(words_list, trees, gold)]


def length_batches(lengths: Sequence[int], max_cells: int) -> list[list[int]]:
    """Sentence indices, shortest first, grouped so that each batch's (n+1)^2 x size stays within
    max_cells (a longer sentence alone when it does not fit); ties keep their order."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    out, cur, width = [], [], 0
    for k in order:
        f = lengths[k] + 1
        if cur and max(width, f) ** 2 * (len(cur) + 1) > max_cells:
            out.append(cur)
            cur, width = [], 0
        cur.append(k)
        width = max(width, f)
    if cur:
        out.append(cur)
    return out


class ChartSampler:
    """`length_batches` of the training sentences in a new order every epoch, one rank's share,
    resumable: the interface of aiayn.data.batching.TokenBatchSampler that the trainer uses.
    Epoch e's order is a permutation seeded by (seed, e); rank r takes batches r, r + W, ...,
    and every rank `len()` of them."""

    def __init__(self, lengths: Sequence[int], max_cells: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        if world_size < 1 or not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        self.batches = length_batches(lengths, max_cells)
        if len(self.batches) < world_size:
            raise UserError(f"{len(self.batches)} batches cannot be shared among {world_size} ranks")
        self.n_sentences, self.max_cells, self.seed = len(lengths), max_cells, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return len(self.batches) // self.world_size

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.batches))

    def __iter__(self) -> Iterator[list[int]]:
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order(self.epoch)
        while self.position < len(self):
            self.position += 1
            yield self.batches[int(order[self.rank + (self.position - 1) * self.world_size])]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "max_tokens": self.max_cells, "world_size": self.world_size,
                "n_pairs": self.n_sentences, "batches_per_rank": len(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state` left off; the data and batching settings must be the same."""
        mine = self.state_dict()
        for key in ("seed", "max_tokens", "world_size", "n_pairs", "batches_per_rank"):
            if key in state and state[key] != mine[key]:
                raise UserError(f"cannot resume batches: saved with {key}={state[key]}, now {mine[key]}")
        if not 0 <= int(state["position"]) <= len(self):
            raise UserError(f"cannot resume batches: position {state['position']} outside 0..{len(self)}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


@dataclass
class ChartBatch:
    """Model inputs and span targets of B sentences: ids (B, S) = BOS w_1..w_n EOS PAD..;
    chars from `char_ids` (None without the character CNN); targets (B, F, F) label ids, -100
    where ignored; n_src_tokens words and n_tgt_tokens cells (the spans the loss counts)."""

    ids: Tensor
    chars: tuple[Tensor, Tensor] | None
    targets: Tensor
    n_src_tokens: int
    n_tgt_tokens: int

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "ChartBatch":
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "ChartBatch":
        return self._map(lambda t: t.pin_memory())

    def _map(self, f) -> "ChartBatch":
        chars = None if self.chars is None else (f(self.chars[0]), f(self.chars[1]))
        return ChartBatch(f(self.ids), chars, f(self.targets), self.n_src_tokens, self.n_tgt_tokens)


def collate(sents: Sequence[Sentence], vocab: Vocabulary, max_chars: int) -> ChartBatch:
    ids = encode([s.words for s in sents], vocab.word_index)
    chars = char_ids([s.spelling for s in sents], vocab.char_index, max_chars) if vocab.chars else None
    f = max(len(s.words) for s in sents) + 1
    targets = torch.full((len(sents), f, f), -100, dtype=torch.long)  # (B, F, F)
    for b, s in enumerate(sents):
        t = span_targets(s.spans, len(s.words))
        targets[b, : t.size(0), : t.size(1)] = t
    return ChartBatch(ids, chars, targets, sum(len(s.words) for s in sents),
                      sum(s.cells for s in sents))
