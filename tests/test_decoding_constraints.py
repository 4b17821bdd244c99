"""Lexically constrained beam search (aiayn/decoding/constraints.py) on hand-built models: the
phrase bookkeeping against a plain re-count, the search against an exhaustive search over every
constrained output, the paper's search untouched without phrases, batch invariance."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from aiayn.decoding.beam import BeamSearch
from aiayn.decoding.common import source_batch
from aiayn.decoding.constraints import PhraseState, round_robin
from aiayn.decoding.engine import SearchEngine
from aiayn.special import EOS_ID

from helpers import TABLES, A, B, C, D, TableModel, V, search_settings

WORDS = (A, B, C, D)


def lp(n: int, alpha: float) -> float:
    return ((5 + n) / 6) ** alpha


def recount(phrases, prefix):
    """Post and Vilar's count, written as a loop over the prefix: (pieces met, phrase in
    progress and its next position)."""
    met = [0] * len(phrases)  # pieces written of each phrase (whole, or in progress)
    cur = None
    for tok in prefix:
        if cur is not None:
            if phrases[cur][met[cur]] == tok:
                met[cur] += 1
                if met[cur] == len(phrases[cur]):
                    cur = None
                continue
            met[cur], cur = 0, None
        for j, p in enumerate(phrases):
            if met[j] == 0 and p[0] == tok:
                met[j] = 1
                cur = j if len(p) > 1 else None
                break
    return sum(met)


@pytest.mark.parametrize("seed", range(20))
def test_phrase_state_counts_as_the_loop_does(seed):
    rng = random.Random(seed)
    phrases = [[rng.choice(WORDS) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
    prefixes = [[rng.choice(WORDS) for _ in range(8)] for _ in range(6)]
    state = PhraseState.build([phrases] * len(prefixes), torch.device("cpu"))
    for t in range(8):
        tokens = torch.tensor([p[t] for p in prefixes])
        gains = state.gains(torch.tensor(WORDS).expand(len(prefixes), -1))  # every next word
        for r, p in enumerate(prefixes):
            for j, w in enumerate(WORDS):
                assert gains[r, j] == recount(phrases, p[:t] + [w])
        state.advance(tokens)
        assert state.met_count().tolist() == [recount(phrases, p[: t + 1]) for p in prefixes]


def test_eos_waits_for_every_phrase():
    state = PhraseState.build([[[A, B]], []], torch.device("cpu"))
    assert state.allowed(V)[:, EOS_ID].tolist() == [False, True]
    state.advance(torch.tensor([A, A]))
    assert state.allowed(V)[:, EOS_ID].tolist() == [False, True]
    state.advance(torch.tensor([B, B]))
    assert state.allowed(V)[:, EOS_ID].tolist() == [True, True]


def test_round_robin_deals_each_bank_its_share():
    raw = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, float("-inf")]])
    bank = torch.tensor([[0, 0, 0, 1, 2, 2]])
    # round 1: bank 2's best (4), bank 1's (3), bank 0's (0); round 2: bank 0's second (1) ...
    order, rank = round_robin(raw, bank, 3)
    assert order.tolist() == [[4, 3, 0, 1, 2, 5]]
    assert rank.tolist() == [[0, 1, 2, 0, 0, 1]]


def random_table(seed: int, words=WORDS[:3]):
    """A model over three words and EOS whose next-piece probabilities are a seeded function
    of the prefix, EOS likelier the longer the prefix (as a translation model's)."""
    def table(prefix):
        rng = random.Random(hash((seed,) + tuple(prefix)))
        weights = [rng.random() + 0.05 for _ in range(len(words) + 1)]
        weights[-1] *= 1 + len(prefix)
        total = sum(weights)
        return dict(zip(words + (EOS_ID,), (w / total for w in weights)))
    return table


def contains(seq, phrase):
    return any(tuple(seq[i : i + len(phrase)]) == tuple(phrase) for i in range(len(seq)))


def exhaustive(table, phrases, max_len, alpha, words=WORDS[:3]):
    """The best complete output holding every phrase: every word sequence shorter than the
    maximum length, then EOS, scored as the search scores (logprob / lp(|Y|), EOS counted)."""
    best = None
    for n in range(max_len):
        for seq in itertools.product(words, repeat=n):
            if not all(contains(seq, p) for p in phrases):
                continue
            logp = sum(math.log(table(seq[:i])[tok]) for i, tok in enumerate(seq + (EOS_ID,)))
            score = logp / lp(n + 1, alpha)
            if best is None or score > best[0]:
                best = (score, list(seq))
    return best


def constrained(model, keys, phrases, beam_size, max_len, alpha=0.6, nbest=1):
    settings = search_settings(model, beam_size=beam_size, alpha=alpha, max_len_a=0.0,
                               max_len_b=float(max_len), nbest=nbest)
    search = BeamSearch(model, settings)
    src, mask = source_batch([[k] for k in keys])
    search.add(src, mask, range(len(keys)), phrases=phrases)
    out = {}
    while search.sentences:
        out.update(search.step())
    return [out[i] for i in range(len(keys))]


# phrases over disjoint pieces, none repeating one, where Post and Vilar's count is exact
PHRASE_SETS = [[[A]], [[B, C]], [[C], [A]], [[A, B], [C]], [[C, B, A]]]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("phrases", PHRASE_SETS)
def test_wide_beam_equals_exhaustive_search(seed, phrases):
    """A beam wide enough to keep every prefix (3 words: 27 at length 3) must find the best
    constrained output exactly, early stopping included."""
    max_len = 5
    table = random_table(seed)
    model = TableModel({20: table})
    hyp = constrained(model, [20], [phrases], beam_size=64, max_len=max_len)[0][0]
    score, seq = exhaustive(table, phrases, max_len, 0.6)
    assert hyp.complete and hyp.tokens == seq
    assert hyp.score == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("seed", range(8))
def test_every_phrase_appears_with_a_narrow_beam(seed, beam_size):
    rng = random.Random(seed)
    phrases = rng.choice(PHRASE_SETS)
    table = random_table(100 + seed)
    hyp = constrained(TableModel({20: table}), [20], [phrases], beam_size, max_len=8)[0][0]
    # a beam of one may never meet EOS as its best piece, constrained or not: then it is cut off
    assert hyp.complete or beam_size == 1
    if hyp.complete:
            assert all(contains(hyp.tokens, p) for p in phrases), (hyp.tokens, phrases)


def test_a_phrase_the_model_would_not_choose_is_forced_in():
    """The length-penalty table: unconstrained, beam 1 answers [A]; asked for B it must take
    the one path through B, [B, B, B]; asked for D, [A, D] (p .12) beats [A, C, D, D...]."""
    model = TableModel(TABLES)
    free = constrained(model, [10], [[]], beam_size=1, max_len=6)[0][0]
    assert free.tokens == [A]
    assert constrained(model, [10], [[[B]]], 1, 6)[0][0].tokens == [B, B, B]
    assert constrained(model, [10], [[[D]]], 4, 6)[0][0].tokens == [A, D]


def test_no_phrases_ranks_as_the_papers_search():
    """A constrained search whose sentences have no phrases gives the paper's hypotheses (one
    bank: candidates by score), n-best included."""
    model = TableModel({20 + s: random_table(s) for s in range(5)})
    keys = list(range(20, 25))
    plain = constrained_free(model, keys)
    lexical = constrained(model, keys, [[] for _ in keys], beam_size=3, max_len=6, nbest=3)
    assert [[(h.tokens, h.score) for h in hs] for hs in lexical] == \
        [[(h.tokens, h.score) for h in hs] for hs in plain]


def constrained_free(model, keys):
    settings = search_settings(model, beam_size=3, alpha=0.6, max_len_a=0.0, max_len_b=6.0,
                               nbest=3)
    search = BeamSearch(model, settings)
    src, mask = source_batch([[k] for k in keys])
    search.add(src, mask, range(len(keys)))
    out = {}
    while search.sentences:
        out.update(search.step())
    return [out[i] for i in range(len(keys))]


def test_phrases_batch_invariant_in_the_engine():
    """Sentences with different phrases (and none) decoded together, joining as others finish,
    equal each decoded alone."""
    tables = {20 + s: random_table(s) for s in range(6)}
    phrases = [[[A]], [], [[B, C]], [[C], [A]], [[A, B], [C]], [[C, B, A]]]
    keys = list(tables)
    settings = search_settings(TableModel(tables), beam_size=2, alpha=0.6, max_len_a=0.0,
                               max_len_b=8.0, batch_size=3)
    engine = SearchEngine(TableModel(tables), settings, lexical=True)
    for key, ps in zip(keys, phrases):
        engine.submit(key, [key], ps)
    together = {}
    while engine.busy:
        together.update(engine.step())
    for key, ps in zip(keys, phrases):
        alone = constrained(TableModel(tables), [key], [ps], beam_size=2, max_len=8)[0]
        assert [(h.tokens, h.score) for h in together[key]] == [(h.tokens, h.score) for h in alone]
        assert all(contains(together[key][0].tokens, p) for p in ps)


def test_a_search_is_constrained_from_its_first_sentence_or_never():
    model = TableModel(TABLES)
    search = BeamSearch(model, search_settings(model, beam_size=2))
    src, mask = source_batch([[10]])
    search.add(src, mask, ["a"], phrases=[[[A]]])
    with pytest.raises(ValueError, match="phrases"):
        search.add(src, mask, ["b"])
    engine = SearchEngine(model, search_settings(model, beam_size=2))
    with pytest.raises(ValueError, match="lexical"):
        engine.submit("a", [10], [[A]])


def test_a_phrase_ends_its_word():
    """Right after a phrase's last piece, a piece that continues a word is not allowed (the
    term "park" must not become "parking"); elsewhere it is."""
    continues = torch.zeros(V, dtype=torch.bool)
    continues[C] = True  # C plays a word-continuation piece
    state = PhraseState.build([[[A, B]], [[A, B]]], torch.device("cpu"), continues)
    state.advance(torch.tensor([A, A]))
    assert state.allowed(V)[:, C].tolist() == [True, True]  # in the middle of the phrase
    state.advance(torch.tensor([B, D]))
    assert state.allowed(V)[:, C].tolist() == [False, True]  # row 0 just ended it
    state.advance(torch.tensor([D, D]))
    assert state.allowed(V)[:, C].tolist() == [True, True]


def test_the_search_never_continues_a_phrases_word():
    """A model that would always follow A with C: asked for A, with C a continuation piece,
    the search writes A and then something else."""
    table = {(): {A: 0.5, B: 0.5}, (A,): {C: 0.9, EOS_ID: 0.1}, (B,): {A: 1.0},
             (B, A): {C: 0.9, EOS_ID: 0.1}}
    continues = torch.zeros(V, dtype=torch.bool)
    continues[C] = True
    model = TableModel({20: table})
    settings = search_settings(model, beam_size=2, max_len_a=0.0, max_len_b=5.0)
    free = BeamSearch(model, settings, continues)
    src, mask = source_batch([[20]])
    free.add(src, mask, [0], phrases=[[]])
    plain = {k: h for k, h in free.step() or []}
    while free.sentences:
        plain.update(free.step())
    assert C in plain[0][0].tokens  # unconstrained, A (or B A) is followed by C
    search = BeamSearch(model, settings, continues)
    search.add(src, mask, [0], phrases=[[[A]]])
    out = {}
    while search.sentences:
        out.update(search.step())
    tokens = out[0][0].tokens
    i = tokens.index(A)
    assert out[0][0].complete and (i + 1 == len(tokens) or tokens[i + 1] != C)
