"""Tree-constrained decoding (not in the paper, off by default: `aiayn parse --constrained`).

§6.3 decodes linearized trees with plain beam search and leaves the output's well-formedness to
the model; `delinearize` then repairs whatever comes out (missing word slots, unbalanced
brackets). With `TreeConstraint` the search itself can only write well-formed trees over exactly
the sentence's words: at every step each hypothesis may choose only tokens that keep its prefix
completable, so the model's probabilities decide the structure and nothing is left to repair.

A prefix is completable when (module tests check the masks against a reference written token by
token):
- an opening token `(X` comes only while a word is left for it, inside the root or as the root,
  and while the shortest completion after it fits in the steps left;
- a word slot comes only inside a constituent and only while words are left;
- a closing token must close the innermost open constituent with its own label, and only once
  that constituent covers a word; the root closes only after the last word;
- EOS comes only after the root has closed (one tree, every word placed).

Word slots: any slot token (`XX`, or a tag with `--slots tags`), or, for a vocabulary that
holds words (`--slots words`), the word at that position or `XX` (`slot_choices`).

The search calls `allowed(steps_left)` before each step, then `reorder(index)` and
`advance(tokens)` as its hypotheses move (`aiayn.decoding.common.StepConstraint`); the state is
a few tensors per row, so the check is vectorised over sentences and beams.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.parsing.linearize import PTB_TAGS, SLOT
from aiayn.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
WORD_MARK = "\u2581"  # sentencepiece's word-start mark
# entries of `TreeConstraint.table` that are not token ids
NO_ID = -1  # padding: fewer choices than the widest word has
ANY_SLOT = -2  # in a word's first entry: any slot token may stand for it


@dataclass(frozen=True, eq=False)
class TreeVocabulary:
    """What each target token is, as (V,) tensors: `open_label[t]` the label index of an opening
    token `(X` (-1 otherwise), `close_label[t]` that of a closing token `)X`, `slot[t]` True for a
    word slot; `close_id[l]` the token closing label l. `words` is True when some slot is
    neither XX nor a part-of-speech tag (a vocabulary of words, `--slots words`)."""

    open_label: Tensor  # (V,) int64
    close_label: Tensor  # (V,) int64
    slot: Tensor  # (V,) bool
    close_id: Tensor  # (n_labels,) int64
    piece_ids: dict[str, int]  # slot text -> id (for the words of a sentence)
    words: bool

    @classmethod
    def from_pieces(cls, pieces: Sequence[str]) -> "TreeVocabulary":
        """From the target vocabulary's pieces in id order (sentencepiece pieces: a whole token
        starts with the word mark; pieces without it continue a word and are never chosen)."""
        v = len(pieces)
        open_label = torch.full((v,), -1, dtype=torch.long)
        close_label = torch.full((v,), -1, dtype=torch.long)
        slot = torch.zeros(v, dtype=torch.bool)
        texts = {}
        for i, piece in enumerate(pieces):
            if i in SPECIAL_IDS or not piece.startswith(WORD_MARK) or len(piece) == 1:
                continue
            texts[i] = piece[1:]
        labels = sorted({t[1:] for t in texts.values() if t[:1] in "()" and len(t) > 1})
        index = {lab: n for n, lab in enumerate(labels)}
        close_id = torch.full((len(labels),), -1, dtype=torch.long)
        for i, text in texts.items():
            if text[:1] == ")" and len(text) > 1:
                close_label[i] = index[text[1:]]
                close_id[index[text[1:]]] = i
        piece_ids = {}
        for i, text in texts.items():
            if text[:1] == "(" and len(text) > 1:
                # an opening token whose label cannot be closed would trap the search
                if close_id[index[text[1:]]] >= 0:
                    open_label[i] = index[text[1:]]
            elif text[:1] not in "()":
                slot[i] = True
                piece_ids[text] = i
        words = any(text not in PTB_TAGS for text in piece_ids)
        return cls(open_label, close_label, slot, close_id, piece_ids, words)

    def to(self, device: torch.device | str) -> "TreeVocabulary":
        return replace(self, open_label=self.open_label.to(device),
                       close_label=self.close_label.to(device), slot=self.slot.to(device),
                       close_id=self.close_id.to(device))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "TreeVocabulary":
        return cls.from_pieces([tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)])

    def slot_choices(self, words: Sequence[str]) -> list[list[int]] | None:
        """Per word, the slot tokens it may take: None (any slot) for an XX or tag vocabulary;
        for a vocabulary of words the word itself when the vocabulary has it, and XX (which the
        treebank writes for rare words)."""
        if not self.words:
            return None
        xx = self.piece_ids.get(SLOT)
        out = []
        for w in words:
            ids = [i for i in (self.piece_ids.get(w), xx) if i is not None]
            out.append(sorted(set(ids)))
        return out


class TreeConstraint:
    """The state of every hypothesis of a batch, one row each (R rows), as tensors:
    `sent` (R,) the row's sentence, `placed` (R,) words placed, `depth` (R,) open constituents,
    `started` (R,) whether the root was opened, `stack` (R, D) the open labels innermost last,
    `opened_at` (R, D) how many words were placed when each opened. D bounds the depth.

    n_words: per sentence of the batch, its number of words; slots: per sentence, per word, the
    slot token ids it may take (`TreeVocabulary.slot_choices`; an empty list, or None for the
    sentence, means any slot token)."""

    def __init__(self, vocab: TreeVocabulary, n_words: Sequence[int],
                 slots: Sequence[Sequence[Sequence[int]] | None] | None = None,
                 device: torch.device | str = "cpu", max_depth: int = 64):
        if any(n < 1 for n in n_words):
            raise ValueError("every sentence needs at least one word")
        self.vocab = vocab.to(device)
        n = len(n_words)
        self.n_words = torch.tensor(list(n_words), dtype=torch.long, device=device)  # (B,)
        self.table = None  # (B, W, C) slot ids per word, NO_ID padded
        if slots is not None and any(s is not None for s in slots):
            w = max(self.n_words.tolist())
            c = max((len(ids) for s in slots if s for ids in s), default=1)
            table = torch.full((n, w, max(c, 1)), NO_ID, dtype=torch.long)
            for b, s in enumerate(slots):
                for j in range(int(self.n_words[b])):
                    ids = None if s is None else s[j]
                    if not ids:  # none named, or none in the vocabulary
                        table[b, j, 0] = ANY_SLOT
                    else:
                        table[b, j, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            self.table = table.to(device)
        self.sent = torch.arange(n, device=device)
        self.placed = torch.zeros(n, dtype=torch.long, device=device)
        self.depth = torch.zeros(n, dtype=torch.long, device=device)
        self.started = torch.zeros(n, dtype=torch.bool, device=device)
        self.max_depth = max_depth
        self.stack = torch.zeros(n, max_depth, dtype=torch.long, device=device)
        self.opened_at = torch.zeros(n, max_depth, dtype=torch.long, device=device)

    def reorder(self, index: Tensor) -> None:
        """Row i becomes old row index[i] (beams reordered, finished sentences dropped)."""
        for name in ("sent", "placed", "depth", "started", "stack", "opened_at"):
            setattr(self, name, getattr(self, name)[index])

    def extend(self, other: "TreeConstraint") -> None:
        """Add `other`'s rows after these (sentences joining a search that is already running);
        the per-sentence tables keep only the sentences a row still refers to."""
        used = torch.unique(self.sent)  # (U,) sorted
        remap = torch.zeros(self.n_words.numel(), dtype=torch.long, device=self.sent.device)
        remap[used] = torch.arange(used.numel(), device=used.device)
        tables = [None if self.table is None else self.table[used], other.table]
        if any(t is not None for t in tables):
            counts = (used.numel(), other.n_words.numel())
            tables = [self._any_table(n) if t is None else t for t, n in zip(tables, counts)]
            w = max(t.size(1) for t in tables)
            c = max(t.size(2) for t in tables)
            self.table = torch.cat([F.pad(t, (0, c - t.size(2), 0, w - t.size(1)), value=NO_ID)
                                    for t in tables])
        self.sent = torch.cat([remap[self.sent], other.sent + used.numel()])
        self.n_words = torch.cat([self.n_words[used], other.n_words])
        for name in ("placed", "depth", "started", "stack", "opened_at"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))

    def _any_table(self, n: int) -> Tensor:
        """A slot table (n, 1, 1) that lets every word of n sentences take any slot token."""
        return torch.full((n, 1, 1), ANY_SLOT, dtype=torch.long, device=self.sent.device)

    def allowed(self, steps_left: Tensor | None = None) -> Tensor:
        """(R, V) bool: the tokens each row may write next. With `steps_left` (R,), the tokens
        the row may still write (EOS included), a constituent opens only if the shortest
        completion after it (each word left, a close per open constituent, EOS) still fits, so
        every hypothesis can end within the search's maximum length."""
        voc = self.vocab
        r, v = self.sent.numel(), voc.slot.numel()
        rows = torch.arange(r, device=self.sent.device)
        n = self.n_words[self.sent]  # (R,)
        words_left = self.placed < n
        top = (self.depth - 1).clamp(min=0)  # (R,)
        top_label = self.stack[rows, top]
        top_has_word = self.placed > self.opened_at[rows, top]
        inside = self.depth > 0
        # column v takes the writes of rows that may not write a token
        mask = torch.zeros(r, v + 1, dtype=torch.bool, device=self.sent.device)

        slot_ok = inside & words_left  # (R,)
        if self.table is None:
            mask[:, :v] |= slot_ok[:, None] & voc.slot[None, :]
        else:
            ids = self.table[self.sent, self.placed.clamp(max=self.table.size(1) - 1)]  # (R, C)
            anyslot = ids[:, 0] == ANY_SLOT
            mask[:, :v] |= (slot_ok & anyslot)[:, None] & voc.slot[None, :]
            own = slot_ok & ~anyslot
            ids = torch.where((ids >= 0) & own[:, None], ids, torch.full_like(ids, v))
            mask.scatter_(1, ids, True)
        open_ok = words_left & (self.depth < self.max_depth) & (inside | ~self.started)
        if steps_left is not None:
            open_ok &= steps_left - 1 >= (n - self.placed) + (self.depth + 1) + 1
        mask[:, :v] |= open_ok[:, None] & (voc.open_label >= 0)[None, :]
        close_ok = inside & top_has_word & ((self.depth > 1) | ~words_left)
        close_tok = voc.close_id[top_label]  # (R,)
        mask[rows, torch.where(close_ok, close_tok, torch.full_like(close_tok, v))] = True
        mask[:, v] = False
        mask[:, EOS_ID] = ~inside & self.started
        return mask[:, :v]

    def advance(self, tokens: Tensor) -> None:
        """Each row appended tokens[i] (R,). A token the mask forbade (only a dead hypothesis,
        score -inf, can hold one) leaves the state consistent, not meaningful."""
        voc = self.vocab
        rows = torch.arange(tokens.numel(), device=tokens.device)
        opens = voc.open_label[tokens] >= 0
        closes = (voc.close_label[tokens] >= 0) & (self.depth > 0)
        pos = self.depth.clamp(max=self.max_depth - 1)
        self.stack[rows, pos] = torch.where(opens, voc.open_label[tokens], self.stack[rows, pos])
        self.opened_at[rows, pos] = torch.where(opens, self.placed, self.opened_at[rows, pos])
        self.depth = (self.depth + opens.long() - closes.long()).clamp(max=self.max_depth)
        self.placed = self.placed + voc.slot[tokens].long()
        self.started = self.started | opens


def tree_constraints(vocab: TreeVocabulary, lines: Sequence[str]
                     ) -> Callable[[Sequence[int], torch.device | str], TreeConstraint]:
    """A factory for `Translator.search(constraint=...)`: given indices into `lines` (a batch),
    the `TreeConstraint` of those sentences (words split on whitespace)."""
    words = [line.split() for line in lines]

    def build(batch: Sequence[int], device: torch.device | str = "cpu") -> TreeConstraint:
        ws = [words[i] for i in batch]
        return TreeConstraint(vocab, [len(w) for w in ws],
                              [vocab.slot_choices(w) for w in ws], device=device)

    return build
