"""Lexically constrained beam search: target phrases every translation must contain (not in the
paper; `aiayn translate --glossary`, `aiayn serve`'s `glossary` field).

Dynamic beam allocation (Post & Vilar 2018), in the vectorised form of Hu et al. (2019): the
search is `aiayn.decoding.beam.BeamSearch`, unchanged except how a constrained step picks its k
live beams (`BeamSearch._allocate`), so what makes the paper's search (the GNMT score, the exact early-stopping
bound, cut-off hypotheses at the maximum length) holds as it is.

- State, one row per hypothesis (`PhraseState`): the sentence's phrases as one row of target
  pieces, which of them each hypothesis has written (`met`), and the phrase it is in the middle
  of (`progress`). Writing a phrase's first piece starts it, its next piece continues it, any
  other piece abandons it (its pieces count as unwritten again), as Post and Vilar count.
- Candidates of a step: each beam's 2k best next pieces, as the paper's search takes, plus every
  piece that would start or continue one of its phrases (whatever its probability: that is how a
  constraint enters a beam the model would not give it).
- Allocation: a candidate's bank is how many constraint pieces it has met. The k beams are
  dealt round-robin over the banks, the bank with more pieces met first in each round and each
  bank's candidates best first, so every bank gets its share of the beam and a bank with too
  few candidates leaves its slots to the others (Hu et al.'s "rank within bank, then bank").
- A phrase ends a word: right after its last piece, a piece that would continue that word
  (`continues`, from the target vocabulary: no word-start mark, a letter or digit first) is not
  allowed, so "park" cannot become "parking".
- EOS is allowed only once every phrase is written (`allowed`), so a complete hypothesis always
  holds them all. As the paper's search ends a hypothesis whose EOS ranks among the k best
  candidates, a constrained one ends where its EOS ranks among the k best of its bank (all its
  phrases written), taking no beam: with one slot a round for that bank, EOS would otherwise have
  to beat every other continuation of every finished-phrase hypothesis to end any. A hypothesis
  cut off at the maximum length may lack a phrase (it ranks below every complete one, as in the
  paper's search); of the live beams cut off there, only those with the most phrase pieces
  written are kept.

A sentence with no phrases has one bank: the candidates rank by score alone, which is the
paper's choice. Without any glossary the search never builds this state and runs exactly the
paper's code path (bit-identical, tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from aiayn.special import EOS_ID

NO_TOKEN = -1  # a padding column of the phrase row: equals no piece


@dataclass
class PhraseState:
    """The phrases of each hypothesis's sentence and how far it has written them: R rows (k per
    live sentence once the search has them), C columns (the most constraint pieces of any
    sentence; shorter rows padded with `NO_TOKEN`).

    tok: (R, C) the pieces of the sentence's phrases, one after another;
    start: (R, C) the column where each column's phrase starts; last: (R, C) whether it ends it;
    met: (R, C) which pieces the hypothesis has written; progress: (R,) the next column of the
    phrase it is writing, -1 when none; closed: (R,) whether its last piece ended a phrase;
    continues: (V,) bool, the pieces that continue a word (None: no such rule)."""

    tok: Tensor
    start: Tensor
    last: Tensor
    met: Tensor
    progress: Tensor
    closed: Tensor
    continues: Tensor | None = None

    @classmethod
    def build(cls, phrases: Sequence[Sequence[Sequence[int]]], device: torch.device,
              continues: Tensor | None = None) -> "PhraseState":
        """One row per sentence: `phrases[i]` the target phrases (non-empty lists of piece ids)
        sentence i must contain (an empty list: none); `continues` (V,) bool the pieces that
        continue a word, banned right after a phrase."""
        width = max([sum(len(p) for p in ps) for ps in phrases] + [1])
        n = len(phrases)
        tok = torch.full((n, width), NO_TOKEN, dtype=torch.long)
        start = torch.zeros(n, width, dtype=torch.long)
        last = torch.zeros(n, width, dtype=torch.bool)
        for i, ps in enumerate(phrases):
            col = 0
            for p in ps:
                if not len(p):
                    raise ValueError("a constraint phrase needs at least one piece")
                tok[i, col : col + len(p)] = torch.tensor(list(p))
                start[i, col : col + len(p)] = col
                last[i, col + len(p) - 1] = True
                col += len(p)
            start[i, col:] = torch.arange(col, width)  # padding: each its own "phrase"
        return cls(tok.to(device), start.to(device), last.to(device),
                   torch.zeros(n, width, dtype=torch.bool, device=device),
                   torch.full((n,), -1, dtype=torch.long, device=device),
                   torch.zeros(n, dtype=torch.bool, device=device),
                   None if continues is None else continues.to(device))

    @property
    def width(self) -> int:
        return self.tok.size(1)

    def _fields(self) -> tuple[str, ...]:
        return ("tok", "start", "last", "met", "progress", "closed")

    def reorder(self, index: Tensor) -> None:
        """Row i becomes old row index[i]."""
        for name in self._fields():
            setattr(self, name, getattr(self, name)[index])

    def extend(self, other: "PhraseState") -> None:
        """Append `other`'s rows (sentences joining the search), padding the narrower to the
        wider's columns."""
        w = max(self.width, other.width)
        a, b = self._widened(w), other._widened(w)
        for name in self._fields():
            setattr(self, name, torch.cat([getattr(a, name), getattr(b, name)]))

    def _widened(self, w: int) -> "PhraseState":
        pad = w - self.width
        if not pad:
            return self
        r, dev = self.tok.size(0), self.tok.device
        cols = torch.arange(self.width, w, device=dev).expand(r, -1)
        return PhraseState(
            torch.cat([self.tok, torch.full((r, pad), NO_TOKEN, dtype=torch.long, device=dev)], 1),
            torch.cat([self.start, cols], 1),
            torch.cat([self.last, torch.zeros(r, pad, dtype=torch.bool, device=dev)], 1),
            torch.cat([self.met, torch.zeros(r, pad, dtype=torch.bool, device=dev)], 1),
            self.progress, self.closed, self.continues)

    @property
    def real(self) -> Tensor:
        """(R, C) the columns that hold a piece."""
        return self.tok != NO_TOKEN

    @property
    def first(self) -> Tensor:
        """(R, C) the columns that hold a phrase's first piece."""
        return (self.start == torch.arange(self.width, device=self.tok.device)) & self.real

    def unmet(self) -> Tensor:
        """(R,) the constraint pieces each row has still to write."""
        return (self.real & ~self.met).sum(dim=1)

    def met_count(self) -> Tensor:
        """(R,) the constraint pieces each row has written: its bank."""
        return self.met.sum(dim=1)

    def allowed(self, vocab: int) -> Tensor:
        """(R, V) bool: EOS only where every phrase is written; no piece that continues a word
        right after a phrase."""
        mask = torch.ones(self.tok.size(0), vocab, dtype=torch.bool, device=self.tok.device)
        if self.continues is not None:
            c = self.continues[:vocab]
            c = torch.cat([c, c.new_zeros(vocab - c.numel())])  # pieces past the vocabulary
            mask[self.closed] = ~c
        mask[:, EOS_ID] = self.unmet() == 0
        return mask

    def wanted(self) -> Tensor:
        """(R, C) bool: the columns whose piece would start or continue a phrase: the next piece
        of the phrase in progress, else the first piece of every phrase not yet written."""
        cols = torch.arange(self.width, device=self.tok.device)
        writing = self.progress >= 0
        return torch.where(writing[:, None], cols == self.progress[:, None],
                           self.first & ~self.met)

    def _in_progress(self) -> Tensor:
        """(R, C) the columns of the phrase each row is writing (none when progress is -1)."""
        p = self.progress.clamp(min=0)[:, None]
        return (self.progress >= 0)[:, None] & (self.start == self.start.gather(1, p))

    def gains(self, tokens: Tensor) -> Tensor:
        """(R, m) the bank each row would be in after writing each of `tokens` (R, m)."""
        r = torch.arange(self.tok.size(0), device=self.tok.device)
        p = self.progress.clamp(min=0)
        count = self.met_count()[:, None]  # (R, 1)
        writing = (self.progress >= 0)[:, None]  # (R, 1)
        cont = writing & (tokens == self.tok[r, p][:, None])  # (R, m)
        phrase = self._in_progress()  # (R, C)
        done_here = (phrase & self.met).sum(dim=1, keepdim=True)  # (R, 1) undone on abandoning
        free = self.first & (~self.met | phrase)  # (R, C) phrases a fresh piece may start
        starts = (free[:, None, :] & (tokens[:, :, None] == self.tok[:, None, :])).any(dim=2)
        after_abandon = count - torch.where(writing, done_here, 0) + starts.long()
        return torch.where(cont, count + 1, after_abandon)

    def advance(self, tokens: Tensor) -> None:
        """Each row wrote tokens[r] (R,)."""
        r = torch.arange(self.tok.size(0), device=self.tok.device)
        p = self.progress.clamp(min=0)
        writing = self.progress >= 0
        cont = writing & (tokens == self.tok[r, p])
        met = self.met.clone()
        met[r[cont], p[cont]] = True
        progress = torch.where(cont & ~self.last[r, p], self.progress + 1,
                               torch.full_like(self.progress, -1))
        # abandoned: the phrase's pieces count as unwritten; the piece may start a phrase
        abandon = writing & ~cont
        met &= ~(abandon[:, None] & self._in_progress())
        hit = self.first & ~met & (tokens[:, None] == self.tok) & ~cont[:, None]  # (R, C)
        found = hit.any(dim=1)
        first = hit.to(torch.int8).argmax(dim=1)  # the first phrase the piece starts
        met[r[found], first[found]] = True
        progress = torch.where(found & ~self.last[r, first], first + 1, progress)
        self.closed = (cont & self.last[r, p]) | (found & self.last[r, first])
        self.met, self.progress = met, progress


def round_robin(raw: Tensor, bank: Tensor, banks: int) -> tuple[Tensor, Tensor]:
    """The order in which a constrained step deals its beams (module doc): raw (n, M) candidate
    scores (-inf: no candidate), bank (n, M) int64 in [0, banks) -> (n, M) candidate indices,
    first the best candidate of each bank (more pieces met first), then the second best of each,
    and so on, candidates with score -inf last; and (n, M) each candidate's rank in its bank
    (0: its best)."""
    n, m = raw.shape
    by_score = raw.argsort(dim=1, descending=True, stable=True)  # (n, M)
    sorted_bank = bank.gather(1, by_score)
    onehot = torch.nn.functional.one_hot(sorted_bank, banks)  # (n, M, B)
    rank = (onehot.cumsum(dim=1) * onehot).sum(dim=2) - 1  # (n, M) rank within its bank
    key = rank * banks + (banks - 1 - sorted_bank)
    key = key.masked_fill(~torch.isfinite(raw.gather(1, by_score)), m * banks)
    return (by_score.gather(1, key.argsort(dim=1, stable=True)),
            torch.empty_like(rank).scatter_(1, by_score, rank))
