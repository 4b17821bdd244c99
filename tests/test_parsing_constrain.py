"""Tree-constrained decoding: the constraint's masks against a reference written token by token,
a worked example, and searches with a random model whose every output must then be a
well-formed tree over exactly its words (no repairs), greedy = beam 1."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from aiayn.config import BASE
from aiayn.decoding.common import source_batch
from aiayn.model import Transformer
from aiayn.parsing.constrain import TreeConstraint, TreeVocabulary
from aiayn.parsing.linearize import delinearize
from aiayn.special import EOS_ID

from helpers import beam_search, greedy_search

PIECES = ["<pad>", "<unk>", "<s>", "</s>", "\u2581XX", "\u2581(S", "\u2581)S", "\u2581(NP",
          "\u2581)NP", "\u2581(VP", "\u2581)VP", "\u2581(ADJP", "sub"]
# (ADJP has no closing token: opening it would trap the search, so it is never allowed;
# "sub" (no word mark) continues a word and is never a slot
TEXT = {i: p.lstrip("\u2581") for i, p in enumerate(PIECES)}


def reference_state(tokens: list[str], n: int, slot_ok=None):
    """(stack of [label, has_word], placed, started) after `tokens`, or None when the prefix is
    already wrong. Written token by token, independently of the module."""
    stack, placed, started = [], 0, False
    for t in tokens:
        if t.startswith("("):
            if started and not stack:
                return None  # a second tree
            if t[1:] == "ADJP" or placed >= n:
                return None
            stack.append([t[1:], False])
            started = True
        elif t.startswith(")"):
            if not stack or stack[-1][0] != t[1:] or not stack[-1][1]:
                return None
            stack.pop()
            if not stack and placed < n:
                return None
        elif t == "sub":
            return None
        else:
            if not stack or placed >= n or (slot_ok is not None and t not in slot_ok[placed]):
                return None
            placed += 1
            for s in stack:
                s[1] = True
    return stack, placed, started


def reference_allowed(tokens: list[str], n: int, text: dict = TEXT, slot_ok=None) -> set[int]:
    """The ids (of `text`: id -> token text) after which `tokens` can still become a tree."""
    out = set()
    for i in range(4, len(text)):
        st = reference_state(tokens + [text[i]], n, slot_ok)
        if st is not None:
            stack, placed, _ = st
            if not stack or placed < n or stack[-1][1]:  # completable
                out.add(i)
    st = reference_state(tokens, n, slot_ok)
    if st is not None and st[2] and not st[0]:
        out.add(EOS_ID)
    return out


def test_vocabulary_classes_tokens():
    v = TreeVocabulary.from_pieces(PIECES)
    assert v.slot.nonzero().flatten().tolist() == [4]
    assert (v.open_label >= 0).nonzero().flatten().tolist() == [5, 7, 9]  # not (ADJP
    assert (v.close_label >= 0).nonzero().flatten().tolist() == [6, 8, 10]
    assert not v.words and v.slot_choices(["a", "b"]) is None
    w = TreeVocabulary.from_pieces(PIECES[:5] + ["\u2581the", "\u2581(S", "\u2581)S", "\u2581."])
    assert w.words and w.slot_choices(["the", "zebra", "."]) == [[4, 5], [4], [4, 8]]


def test_a_worked_example():
    """Two words: (S (NP XX )NP XX )S."""
    c = TreeConstraint(TreeVocabulary.from_pieces(PIECES), [2])
    names = {i: TEXT[i] for i in range(4, len(PIECES))} | {EOS_ID: "EOS"}
    steps = [("(S", {"(S", "(NP", "(VP"}),  # only a root can start
             ("(NP", {"(S", "(NP", "(VP", "XX"}),  # the root has no word yet: no )S
             ("XX", {"(S", "(NP", "(VP", "XX"}),  # NP has no word: no )NP
             (")NP", {"(S", "(NP", "(VP", "XX", ")NP"}),
             ("XX", {"(S", "(NP", "(VP", "XX"}),  # S has a word, but a word is left: no )S
             (")S", {")S"}),  # no word left: nothing opens, no slot
             (None, {"EOS"})]  # one tree: only EOS
    for tok, expected in steps:
        got = {names[i] for i in c.allowed()[0].nonzero().flatten().tolist()}
        assert got == expected, (tok, got)
        if tok is not None:
            c.advance(torch.tensor([PIECES.index("\u2581" + tok)]))


@pytest.mark.parametrize("seed", range(6))
def test_masks_match_the_reference_on_random_walks(seed):
    """Rows walk through random allowed tokens, copied and dropped between steps as beams are;
    every row's mask must be the reference's at every step."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(8):
        n_words = [rng.randint(1, 6) for _ in range(5)]
        c = TreeConstraint(TreeVocabulary.from_pieces(PIECES), n_words)
        prefixes: list[list[str]] = [[] for _ in n_words]
        sents = list(range(len(n_words)))
        while prefixes:
            mask = c.allowed()
            for r, (prefix, s) in enumerate(zip(prefixes, sents)):
                assert set(mask[r].nonzero().flatten().tolist()) == reference_allowed(prefix, n_words[s])
                checked += 1
            # finished rows (only EOS left) leave; the others are copied at random, as beams are
            live = [r for r in range(len(prefixes)) if mask[r].sum() > int(mask[r, EOS_ID])]
            index = [rng.choice(live) for _ in range(5)] if live else []
            c.reorder(torch.tensor(index, dtype=torch.long))
            prefixes, sents = [list(prefixes[i]) for i in index], [sents[i] for i in index]
            mask = mask[index]
            toks = []
            for m in mask:
                choices = [i for i in m.nonzero().flatten().tolist() if i != EOS_ID]
                others = [i for i in choices if not TEXT[i].startswith("(")]
                # opening less often keeps the trees shallow, so that walks end
                toks.append(rng.choice(others if others and rng.random() < 0.7 else choices))
            for prefix, tok in zip(prefixes, toks):
                prefix.append(TEXT[tok])
            c.advance(torch.tensor(toks, dtype=torch.long))
    assert checked > 200


def test_masks_match_the_reference_with_word_slots():
    pieces = PIECES[:4] + ["\u2581XX", "\u2581(S", "\u2581)S", "\u2581(NP", "\u2581)NP", "\u2581a",
                           "\u2581b"]
    vocab = TreeVocabulary.from_pieces(pieces)
    text = {i: p.lstrip("\u2581") for i, p in enumerate(pieces)}
    words = ["a", "zebra", "b"]
    choices = vocab.slot_choices(words)
    slot_ok = [{text[i] for i in ids} for ids in choices]
    c = TreeConstraint(vocab, [3], [choices])
    rng = random.Random(1)
    prefix: list[str] = []
    for _ in range(12):
        allowed = set(c.allowed()[0].nonzero().flatten().tolist())
        assert allowed == reference_allowed(prefix, 3, text, slot_ok), prefix
        if allowed == {EOS_ID}:
            break
        tok = rng.choice(sorted(allowed - {EOS_ID}))
        prefix.append(text[tok])
        c.advance(torch.tensor([tok]))
    assert prefix.count("a") <= 1 and "zebra" not in prefix


def test_open_needs_room_to_finish():
    c = TreeConstraint(TreeVocabulary.from_pieces(PIECES), [2])
    # a root then 2 words, a close and EOS need 5 steps: with 4 left the root cannot open
    assert not c.allowed(torch.tensor([4]))[0, 5] and c.allowed(torch.tensor([5]))[0, 5]


def _random_parser(seed: int):
    cfg = replace(BASE, n_layers=1, d_model=32, d_ff=64, n_heads=4, vocab_size=len(PIECES),
                  tgt_vocab_size=len(PIECES), max_len_a=1.0, max_len_b=6)
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("seed", range(3))
def test_every_constrained_output_is_a_tree_over_its_words(seed):
    model = _random_parser(seed)
    vocab = TreeVocabulary.from_pieces(PIECES)
    rng = random.Random(seed)
    n_words = [rng.randint(1, 5) for _ in range(7)]
    src, mask = source_batch([[rng.randrange(4, len(PIECES)) for _ in range(n)] for n in n_words])
    beams = beam_search(model, src, mask, beam_size=3, alpha=0.3, nbest=3,
                        constraint=TreeConstraint(vocab, n_words))
    greedy = greedy_search(model, src, mask, constraint=TreeConstraint(vocab, n_words))
    beam1 = beam_search(model, src, mask, beam_size=1, alpha=0.0,
                        constraint=TreeConstraint(vocab, n_words))
    free = beam_search(model, src, mask, beam_size=3, alpha=0.3)
    repaired = 0
    for n, hyps, g, b1, f in zip(n_words, beams, greedy, beam1, free):
        words = [f"w{i}" for i in range(n)]
        for h in hyps + [g]:
            assert h.complete
            _, fix = delinearize([TEXT[t] for t in h.tokens], words)
            assert fix.total == 0, (fix.counts, [TEXT[t] for t in h.tokens])
        assert b1[0].tokens == g.tokens and b1[0].logprob == pytest.approx(g.logprob, abs=1e-5)
        repaired += delinearize([TEXT[t] for t in f[0].tokens], words)[1].sentences
    assert repaired > 0  # the random model's free outputs do need repairs


def test_constrained_sentences_joining_a_running_search_get_their_own_trees():
    # room for two sentences: the others join as those finish, their constraint rows joined to
    # the running ones (`TreeConstraint.extend`); each result equals its sentence searched alone
    from aiayn.decoding.translate import SearchOptions, search_batched

    model = _random_parser(0)
    vocab = TreeVocabulary.from_pieces(PIECES)
    rng = random.Random(5)
    n_words = [rng.randint(1, 5) for _ in range(9)]
    sources = [[rng.randrange(4, len(PIECES)) for _ in range(n)] for n in n_words]
    options = SearchOptions(beam_size=3, alpha=0.3, batch_size=2)
    got = search_batched(model, sources, options,
                         constraint=lambda keys, device: TreeConstraint(vocab, [n_words[i] for i in keys]))
    for n, ids, hyps in zip(n_words, sources, got):
        (alone,) = beam_search(model, *source_batch([ids]), beam_size=3, alpha=0.3,
                               constraint=TreeConstraint(vocab, [n]))
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert hyps[0].score == pytest.approx(alone[0].score, abs=1e-5)
