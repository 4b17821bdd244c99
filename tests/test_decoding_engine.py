"""The decoding engine (aiayn/decoding/engine.py) and what it rests on: a cache whose rows sit at
different positions (`KVCache.extend`, `lengths`), a beam search that sentences join at any step
(`BeamSearch.add`). Every sentence's result must equal decoding it alone, whoever shares its steps
and whenever it joined: checked on the hand-built table model (exact scores) and on a briefly
trained model (greedy, beam, n-best, both stopping rules, fp32, bf16, int8), with the slow path
(`beam_search` / `greedy_search` of tests/helpers.py on the sentence alone) as the reference."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from aiayn.decoding import Hypothesis, source_batch
from aiayn.decoding.beam import BeamSearch
from aiayn.decoding.engine import SearchEngine
from aiayn.decoding.precision import convert
from aiayn.decoding.search import resolve_search
from aiayn.decoding.translate import SearchOptions, search_batched
from aiayn.model import Transformer
from aiayn.model.rnn import RNNSearch
from aiayn.precision import cpu_has_native_bf16
from aiayn.special import BOS_ID

from helpers import (
    MICRO,
    TABLES,
    TableModel,
    beam_search,
    greedy_search,
    needs_int8,
    search_settings,
    summary,
    train_reverser,
)


def _random_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(replace(MICRO, vocab_size=30, n_layers=2, d_model=32, d_ff=64,
                               **overrides)).eval()


def _feed(model, cache, tokens: list[list[int]]) -> list[torch.Tensor]:
    """Logits of each step as the rows of `cache` are fed tokens[i] at step i: (B, V) each."""
    return [model.decode_step(torch.tensor(row)[:, None], cache) for row in tokens]


@pytest.mark.parametrize("overrides", [{}, {"attn_window": 2}, {"positions": "learned"},
                                       {"norm": "pre"}])
@torch.inference_mode()
def test_rows_that_join_later_decode_as_they_would_alone(overrides):
    # Sentences a (2 rows) decode 3 steps, then b (3 rows, another source length) joins; every
    # row's logits equal those of its sentence decoded alone, and after the rows that started
    # first leave, the cache goes back to one position for all rows.
    model = _random_model(**overrides)
    src_a, mask_a = source_batch([[5, 6, 7], [8, 9]])
    src_b, mask_b = source_batch([[10, 11, 12, 13, 14], [15], [16, 17]])
    toks_a = [[BOS_ID, BOS_ID], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13]]
    toks_b = [[BOS_ID] * 3, [20, 21, 22], [23, 24, 25]]
    alone_a = _feed(model, model.new_cache(model.encode(src_a, mask_a), mask_a), toks_a)
    alone_b = _feed(model, model.new_cache(model.encode(src_b, mask_b), mask_b), toks_b)
    cache = model.new_cache(model.encode(src_a, mask_a), mask_a)
    first = _feed(model, cache, toks_a[:3])
    cache = cache.extend(model.new_cache(model.encode(src_b, mask_b), mask_b))
    assert [p.length for p in cache.parts] == [3, 0] and cache.batch_size == 5
    both = _feed(model, cache, [a + b for a, b in zip(toks_a[3:], toks_b)])
    for got, want in zip(first, alone_a[:3]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for i, got in enumerate(both):
        torch.testing.assert_close(got[:2], alone_a[3 + i], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[2:], alone_b[i], atol=1e-5, rtol=1e-5)
    cache.reorder(torch.tensor([1, 4, 2]), cross_index=torch.tensor([1, 4, 2]))  # a's 1st leaves
    assert [p.length for p in cache.parts] == [6, 3] and cache.batch_size == 3
    last = _feed(model, cache, [[14, 26, 27]])[0]  # b's rows 2 and 0, in that order
    torch.testing.assert_close(last[1:], _feed(model, _alone_cache(model, src_b, mask_b, toks_b,
                                                                    [2, 0]), [[26, 27]])[0],
                               atol=1e-5, rtol=1e-5)
    cache.reorder(torch.tensor([1, 2]), cross_index=torch.tensor([1, 2]))  # a's other leaves
    assert [p.length for p in cache.parts] == [4]


def _alone_cache(model, src, mask, toks, rows):
    """A cache of `src` fed `toks`, then reordered to `rows`."""
    cache = model.new_cache(model.encode(src, mask), mask)
    _feed(model, cache, toks)
    index = torch.tensor(rows)
    cache.reorder(index, cross_index=index)
    return cache


@torch.inference_mode()
def test_an_rnn_state_extends_too():
    torch.manual_seed(0)
    model = RNNSearch(replace(MICRO, arch="rnn", vocab_size=30, rnn_emb=16, rnn_hidden=16,
                              rnn_attn=16)).eval()
    src_a, mask_a = source_batch([[5, 6, 7]])
    src_b, mask_b = source_batch([[10, 11, 12, 13, 14]])
    alone_b = _feed(model, model.new_cache(model.encode(src_b, mask_b), mask_b), [[BOS_ID], [9]])
    cache = model.new_cache(model.encode(src_a, mask_a), mask_a)
    _feed(model, cache, [[BOS_ID], [4]])
    cache = cache.extend(model.new_cache(model.encode(src_b, mask_b), mask_b))
    both = _feed(model, cache, [[5, BOS_ID], [6, 9]])
    for got, want in zip(both, alone_b):
        torch.testing.assert_close(got[1:], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rule", ["exact", "current"])
def test_table_model_sentences_joining_at_every_step_get_their_own_results(rule):
    # Keys 10-13 (tests/test_decoding_search.py): chosen by length penalty, a long chain, a
    # short one, a sentence that never ends. One joins after each step of the others.
    kw = dict(beam_size=2, alpha=1.0, max_len_a=0.0, max_len_b=30, nbest=2, early_stop=rule)
    alone = {key: beam_search(TableModel(TABLES), *source_batch([[key]]), **kw)[0]
             for key in (10, 11, 12, 13)}
    model = TableModel(TABLES)
    search = BeamSearch(model, search_settings(model, **kw))
    waiting, got = [11, 12, 10, 13, 12], {}
    while waiting or search.sentences:
        if waiting:
            key = waiting.pop(0)
            search.add(*source_batch([[key]]), keys=[(key, len(waiting))])
        for (key, _), hyps in search.step():
            got.setdefault(key, []).append(hyps)
    assert sorted(got) == [10, 11, 12, 13] and len(got[12]) == 2
    for key, runs in got.items():
        for hyps in runs:
            assert summary(hyps) == summary(alone[key])


@pytest.fixture(scope="module")
def reverser():
    cfg = replace(MICRO, vocab_size=40, n_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0,
                  max_len_b=6)
    return train_reverser(cfg, steps=150)


def _sources(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 40, (int(m),), generator=g).tolist()
            for m in torch.randint(1, 10, (n,), generator=g)]


def _alone(model, ids, options: SearchOptions):
    src, mask = source_batch([ids])
    if options.greedy:
        return [greedy_search(model, src, mask, options.max_len_a, options.max_len_b)[0]]
    return beam_search(model, src, mask, options.beam_size, options.alpha, options.max_len_a,
                       options.max_len_b, options.nbest, early_stop=options.early_stop)[0]


def _same(got, want, tol: float) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want]
    for g, w in zip(got, want):
        assert g.complete == w.complete and g.score == pytest.approx(w.score, abs=tol)
        assert g.logprob == pytest.approx(w.logprob, abs=tol)


SEARCHES = [SearchOptions(greedy=True), SearchOptions(beam_size=4, alpha=0.6),
            SearchOptions(beam_size=3, alpha=1.5, nbest=3),
            SearchOptions(beam_size=4, alpha=1.0, early_stop="current")]


@pytest.mark.slow
@pytest.mark.parametrize("options", SEARCHES, ids=["greedy", "beam", "nbest", "current"])
@pytest.mark.parametrize("room", [3, 30], ids=["joins", "one-batch"])
def test_every_sentence_equals_decoding_it_alone(reverser, options, room):
    # batch_size 3: sentences join as others finish, at every few steps; 30: all at once
    sources = _sources(24)
    got = search_batched(reverser, sources, replace(options, batch_size=room))
    for ids, hyps in zip(sources, got):
        _same(hyps, _alone(reverser, ids, options), 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", pytest.param("int8", marks=needs_int8)])
def test_reduced_precision_results_do_not_depend_on_the_neighbours(reverser, precision):
    model = convert(copy.deepcopy(reverser), precision)
    sources = _sources(16, seed=1)
    # int8 quantizes each row on its own, so its neighbours change nothing. bf16 rounds every
    # product, and attention kernels sum keys in blocks that follow the key count: sources padded
    # to a multiple of `SOURCE_MULTIPLE` keys (and products' rows to a multiple of
    # `ROW_MULTIPLE`) give a sentence the same numbers in any batch with oneDNN's native bf16
    # kernels (AVX512-BF16 measured), so the same hypotheses and scores as alone, not merely
    # close ones. Emulated bf16 (a CPU without it) was seen within 0.004 nats a token before the
    # padding, never measured bit for bit since: there the same hypotheses within 0.01 a token.
    native = precision == "bf16" and cpu_has_native_bf16()
    for options in (SearchOptions(beam_size=4, alpha=0.6, nbest=2), SearchOptions(greedy=True)):
        together = search_batched(model, sources, replace(options, batch_size=3))
        for ids, hyps in zip(sources, together):
            tol = 1e-4 if precision == "int8" else 1e-6 if native else 0.01 * (max(len(h.tokens) for h in hyps) + 1)
            _same(hyps, _alone(model, ids, options), tol)


def test_the_engine_holds_no_more_than_its_room(reverser):
    sources = _sources(40, seed=2)
    sources += [[5] * 20, [6] * 17]  # wider than one multiple of the source padding
    for room in (dict(batch_size=5), dict(batch_tokens=70)):
        engine = SearchEngine(reverser, resolve_search(reverser, SearchOptions(beam_size=4, **room)))
        for i, ids in enumerate(sources):
            engine.submit(i, ids)
        seen, live_rows = set(), []
        while engine.busy:
            seen |= {i for i, _ in engine.step()}
            live_rows.append(engine.search.rows)
            n = engine.live
            # the source positions the cache holds: each cohort's sentences x its padded width
            parts = [] if engine.search.cache is None else engine.search.cache.parts
            held = sum(p.src_mask.numel() for p in parts)
            assert held == sum(engine.search.src_widths)
            assert n * max(engine.search.src_widths, default=0) <= room.get("batch_tokens", 10**9)
            assert n <= room.get("batch_size", n) and held <= room.get("batch_tokens", 10**9)
        assert seen == set(range(len(sources)))
        assert max(live_rows) <= 4 * engine.peak_sentences and engine.peak_sentences > 1
    engine.submit("blank", [])  # a blank line: no model, one empty hypothesis at the next step
    assert engine.busy and engine.step() == [("blank", [Hypothesis([], 0.0, 0.0)])]
    assert not engine.busy


def test_what_joinable_admits_is_what_joins(reverser):
    # `aiayn serve` hands the engine the requests `joinable` admits: they all join at the next
    # step, and the next request would not have fitted the room (live sentences x the widest
    # padded source) or the join fraction, computed here apart from the engine
    from aiayn.decoding.common import source_width
    from aiayn.decoding.engine import JOIN_FRACTION

    g = torch.Generator().manual_seed(5)
    requests = [_sources(int(n), seed=10 + i) for i, n in
                enumerate(torch.randint(1, 4, (30,), generator=g))]
    requests.insert(7, [[]])  # a blank line needs no room
    for room in (dict(batch_tokens=100), dict(batch_size=6)):
        engine = SearchEngine(reverser, resolve_search(reverser, SearchOptions(beam_size=2, **room)))
        queue, done = list(requests), 0
        while queue or engine.busy:
            n = engine.joinable(queue)
            live, widths = engine.live, list(engine.search.src_widths)
            assert n or live  # an empty search takes the first request
            if n < len(queue):  # the first request left out would break the room or the fraction
                joining = [ids for r in queue[: n + 1] for ids in r if ids]
                width = max(widths + [source_width(len(ids) + 1) for ids in joining])
                total = live + len(joining)
                assert (total * width > room.get("batch_tokens", 10**9)
                        or total > room.get("batch_size", 10**9)
                        or len(joining) < JOIN_FRACTION * total)
            for i, request in enumerate(queue[:n]):
                for j, ids in enumerate(request):
                    engine.submit((i, j, done), ids)
            queue = queue[n:]
            done += 1
            engine.step()
            assert not engine.waiting  # every sentence handed over joined


def test_kept_attention_is_each_sentences_own_when_sentences_join_and_leave(reverser):
    # the longest sources go first and leave while shorter ones decode: each hypothesis keeps
    # the weights it had alone, over its own source
    from aiayn.decoding.common import AttentionRequest

    sources = _sources(12, seed=3)
    request = AttentionRequest(layers=(-1,), mean_heads=True)
    options = SearchOptions(beam_size=3, alpha=0.6, attention=request, batch_size=3)
    got = search_batched(reverser, sources, options)
    for ids, hyps in zip(sources, got):
        src, mask = source_batch([ids])
        (alone,) = beam_search(reverser, src, mask, 3, 0.6, attention=request)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert hyps[0].attention.shape == alone[0].attention.shape == (1, 1, len(alone[0].token_logprobs), len(ids) + 1)
        torch.testing.assert_close(hyps[0].attention, alone[0].attention, atol=1e-5, rtol=1e-5)


def test_an_ensemble_of_models_lets_sentences_join_too(reverser):
    from aiayn.decoding.ensemble import Ensemble

    torch.manual_seed(1)
    other = Transformer(reverser.cfg).eval()  # a second member, random: the mean differs from each
    both = Ensemble([reverser, other])
    sources = _sources(10, seed=4)
    got = search_batched(both, sources, SearchOptions(beam_size=3, alpha=0.6, batch_size=2))
    for ids, hyps in zip(sources, got):
        src, mask = source_batch([ids])
        _same(hyps, beam_search(both, src, mask, 3, 0.6)[0], 1e-4)
