"""Greedy and beam search on a hand-built model whose next-token probabilities are a table, so
every expected hypothesis and score below is computed by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from aiayn.decoding import length_penalty, max_output_lengths
from aiayn.decoding.common import (
    LOGPROB_ROWS,
    SOURCE_MULTIPLE,
    TOPK_BLOCK,
    ban_early_eos,
    best_next_tokens,
    decoder_length_cap,
    next_token_logprobs,
    row_topk,
    source_batch,
    source_width,
)
from aiayn.model import Transformer
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

from helpers import (  # the table model and its tables: tests/helpers.py
    MICRO,
    TABLES,
    A,
    B,
    C,
    TableModel,
    V,
    beam_search,
    greedy_search,
    summary,
)


def lp(n: int, alpha: float) -> float:
    """GNMT length penalty, written out independently of the module."""
    return ((5 + n) / 6) ** alpha




def src_of(*keys: int, length: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    return source_batch([[k] * length for k in keys])


def run_beam(keys, **kw):
    model = TableModel(TABLES)
    src, mask = src_of(*keys)
    kw.setdefault("max_len_a", 0.0)
    return beam_search(model, src, mask, **kw), model.steps


# --- helpers ---------------------------------------------------------------------------------

def test_length_penalty_and_max_lengths():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert length_penalty(12, 0.0) == 1.0
    mask = torch.tensor([[True, True, True, False], [True] * 4, [True, False, False, False]])
    assert max_output_lengths(mask, 1.0, 50).tolist() == [53, 54, 51]  # S counts EOS
    assert max_output_lengths(mask, 1.5, 0).tolist() == [4, 6, 1]
    assert max_output_lengths(mask, 0.0, 0).tolist() == [1, 1, 1]  # at least one step
    assert max_output_lengths(mask, 1.0, 50, cap=52).tolist() == [52, 52, 51]


def test_source_batch_appends_eos_and_pads():
    src, mask = source_batch([[5, 6], [7], [8, 9, 4]], multiple=1)
    assert src.tolist() == [[5, 6, EOS_ID, PAD_ID], [7, EOS_ID, PAD_ID, PAD_ID], [8, 9, 4, EOS_ID]]
    assert mask.tolist() == (src != PAD_ID).tolist()
    # by default the positions are a multiple of SOURCE_MULTIPLE, never past a limit given
    padded, padded_mask = source_batch([[5, 6], [7], [8, 9, 4]])
    assert padded.shape == (3, SOURCE_MULTIPLE) and torch.equal(padded[:, :4], src)
    assert (padded[:, 4:] == PAD_ID).all() and padded_mask.tolist() == (padded != PAD_ID).tolist()
    assert source_batch([[5, 6], [7], [8, 9, 4]], limit=6)[0].shape == (3, 6)
    assert source_batch([list(range(4, 12))], limit=6)[0].shape == (1, 9)  # never cuts a source
    # the room's measure (`source_width`) is the width source_batch gives, for any longest row
    for longest in (1, 2, 15, 16, 17, 33):
        for limit in (None, 6, 20, 40):
            width = source_batch([[5] * (longest - 1), [6]], limit=limit)[0].shape[1]
            assert source_width(longest, limit=limit) == width


def test_log_probs_are_float32_and_never_pad_or_bos():
    logits = torch.randn(3, V, dtype=torch.bfloat16)
    logp = next_token_logprobs(logits)
    assert logp.dtype == torch.float32
    assert torch.isinf(logp[:, [PAD_ID, BOS_ID]]).all()
    ref = torch.log_softmax(logits.float(), -1)
    keep = [i for i in range(V) if i not in (PAD_ID, BOS_ID)]
    torch.testing.assert_close(logp[:, keep], ref[:, keep])


# --- hand-computed searches ------------------------------------------------------------------

def test_alpha_changes_the_winner_and_nbest_is_ordered():
    # alpha = 0: plain log-probability, the short [A] (.3) beats [B, B, B] (.25).
    (hyps,), _ = run_beam([10], beam_size=2, alpha=0.0, max_len_b=6, nbest=2)
    assert summary(hyps) == summary_expected([([A], 0.3, 2), ([B, B, B], 0.25, 4)], alpha=0.0)
    # alpha = 1: lp(2) = 7/6, lp(4) = 9/6; log(.25)/1.5 = -0.924 > log(.3)/(7/6) = -1.032.
    (hyps,), _ = run_beam([10], beam_size=2, alpha=1.0, max_len_b=6, nbest=2)
    assert summary(hyps) == summary_expected([([B, B, B], 0.25, 4), ([A], 0.3, 2)], alpha=1.0)
    assert hyps[0].token_logprobs == pytest.approx([math.log(0.4), 0.0, 0.0, math.log(0.625)])
    assert hyps[0].score > hyps[1].score
    # nbest=1 gives the head of the list.
    (one,), _ = run_beam([10], beam_size=2, alpha=1.0, max_len_b=6, nbest=1)
    assert summary(one) == summary(hyps[:1])


def summary_expected(rows, alpha):
    return [(toks, round(math.log(p) / lp(n, alpha), 5), round(math.log(p), 5), True)
            for toks, p, n in rows]


def test_early_stop_must_not_stop_on_a_longer_winner():
    # alpha = 1, L = 30. After step 2, [C] EOS scores log(.7)/lp(2) = -0.306. The live [C, A]
    # has raw log(.3): a bound using its current length, log(.3)/lp(2) = -1.03, would stop here;
    # the correct bound log(.3)/lp(30) = -0.206 does not, and the chain ends at |Y| = 22 with
    # log(.3)/lp(22) = -0.2675, the winner.
    (hyps,), steps = run_beam([11], beam_size=2, alpha=1.0, max_len_b=30, nbest=2)
    expected = summary_expected([([C] + [A] * 20, 0.3, 22), ([C], 0.7, 2)], alpha=1.0)
    assert summary(hyps) == expected
    assert steps == 22
    (full,), _ = run_beam([11], beam_size=2, alpha=1.0, max_len_b=30, nbest=2, early_stop=False)
    assert summary(full) == expected


def test_early_stop_must_stop():
    # alpha = 0: the live [C, A] (log .3) can never beat the finished [C] (log .7): stop at step 2.
    (hyps,), steps = run_beam([11], beam_size=2, alpha=0.0, max_len_b=30)
    assert summary(hyps) == summary_expected([([C], 0.7, 2)], alpha=0.0)
    assert steps == 2
    (full,), full_steps = run_beam([11], beam_size=2, alpha=0.0, max_len_b=30, early_stop=False)
    assert summary(full) == summary(hyps) and full_steps == 22
    # alpha = 1 too: log(.1)/lp(30) = -0.395 < log(.9)/lp(2) = -0.090.
    (hyps,), steps = run_beam([12], beam_size=2, alpha=1.0, max_len_b=30)
    assert summary(hyps) == summary_expected([([C], 0.9, 2)], alpha=1.0)
    assert steps == 2
    # With nbest=2 the second place is still open after step 2, so the search goes on.
    (hyps,), steps = run_beam([12], beam_size=2, alpha=1.0, max_len_b=30, nbest=2)
    assert summary(hyps) == summary_expected([([C], 0.9, 2), ([C] + [A] * 20, 0.1, 22)], 1.0)
    assert steps == 22


def test_current_length_early_stop_is_the_heuristic_worked_out_above():
    # Key 11, alpha = 1: after step 2 the live [C, A] (raw log .3) ending at the next step would
    # score log(.3)/lp(3) = -0.903 < log(.7)/lp(2) = -0.306 for the finished [C]: the "current"
    # rule stops there and returns [C], missing the chain the exact bound waits for (above).
    (hyps,), steps = run_beam([11], beam_size=2, alpha=1.0, max_len_b=30, early_stop="current")
    assert summary(hyps) == summary_expected([([C], 0.7, 2)], alpha=1.0)
    assert steps == 2
    # with alpha = 0 the two rules are one: the same hypotheses after the same steps
    for key in (10, 11, 12):
        exact, exact_steps = run_beam([key], beam_size=2, alpha=0.0, max_len_b=30, nbest=2)
        current, current_steps = run_beam([key], beam_size=2, alpha=0.0, max_len_b=30, nbest=2,
                                          early_stop="current")
        assert summary(current[0]) == summary(exact[0]) and current_steps == exact_steps
    with pytest.raises(ValueError, match="early_stop"):
        run_beam([11], beam_size=2, early_stop="sometimes")


def test_current_length_early_stop_on_a_real_model_is_a_prefix_of_the_exact_search():
    # The search is the same until "current" stops a sentence, so its steps are no more, and its
    # best score is no better than the exact search's (which equals the search run to the end).
    torch.manual_seed(3)
    model = Transformer(replace(MICRO, vocab_size=20)).eval()
    src, mask = source_batch([[(7 * i + j) % 16 + 4 for j in range(3 + i % 5)] for i in range(12)])
    counts = {}

    def counting(tag):
        def step(tokens, cache, **kw):
            counts[tag] = counts.get(tag, 0) + 1
            return Transformer.decode_step(model, tokens, cache, **kw)
        return step

    with torch.no_grad():
        model.decode_step = counting("exact")
        exact = beam_search(model, src, mask, beam_size=3, alpha=1.5, max_len_b=12)
        model.decode_step = counting("current")
        current = beam_search(model, src, mask, beam_size=3, alpha=1.5, max_len_b=12, early_stop="current")
    assert counts["current"] <= counts["exact"]
    for e, c in zip(exact, current):
        assert c[0].score <= e[0].score + 1e-5


@pytest.mark.parametrize("vocab", [8000, 40 * TOPK_BLOCK + 13, 50])
def test_row_topk_equals_topk(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(37, vocab, generator=g)
    x[:, :5] = float("-inf")  # banned tokens
    x[3] = float("-inf")
    x[3, -1] = 0.5  # a row with one finite value, in the partial last block
    if vocab > 8 * TOPK_BLOCK:  # a row whose k best share one block
        x[4, 7 * TOPK_BLOCK : 8 * TOPK_BLOCK] = 10 + torch.arange(TOPK_BLOCK, dtype=torch.float32)
    for k in (1, 8):
        values, cols = row_topk(x, k)
        want_values, want_cols = x.topk(k, dim=1)
        assert torch.equal(values, want_values)
        finite = torch.isfinite(want_values)  # -inf ties may come from any column
        assert torch.equal(cols[finite], want_cols[finite])
        assert torch.equal(x.gather(1, cols), values)


def test_row_topk_among_equal_values_returns_their_values():
    x = torch.zeros(4, 3000)
    x[:, 100] = 1.0
    values, cols = row_topk(x, 8)
    assert torch.equal(values, x.topk(8, dim=1).values)
    assert (cols[:, 0] == 100).all() and torch.equal(x.gather(1, cols), values)
    assert all(len(set(row)) == 8 for row in cols.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_best_next_tokens_block_by_block_equal_the_whole_matrix(dtype):
    # More rows than one block, a partial last block, EOS banned for some rows, a mask: the same
    # values and ids as the log-probabilities of the whole matrix, masked, then torch's top-k
    g = torch.Generator().manual_seed(3)
    n, vocab, c = 2 * LOGPROB_ROWS + 37, 3000, 8
    logits = (3 * torch.randn(n, vocab, generator=g)).to(dtype)
    steps = torch.randint(1, 6, (n,), generator=g)
    allowed = torch.rand(n, vocab, generator=g) > 0.3
    values, tokens = best_next_tokens(logits, c, steps, 4, allowed)
    whole = ban_early_eos(next_token_logprobs(logits), steps, 4).masked_fill(~allowed, float("-inf"))
    want_values, want_tokens = whole.topk(c, dim=1)
    assert values.dtype == torch.float32 and values.shape == (n, c)
    assert torch.equal(values, want_values)
    # bf16 logits tie often: among equal values the ids may differ, as `topk` leaves them
    assert torch.equal(whole.gather(1, tokens), values)
    assert all(len(set(row)) == c for row in tokens.tolist())
    if dtype == torch.float32:
        assert torch.equal(tokens, want_tokens)
    assert torch.isinf(values[(steps < 4)[:, None] & (tokens == EOS_ID)]).all()
    # without a mask or a minimum length, fewer rows than a block
    values, tokens = best_next_tokens(logits[:5], c, steps[:5])
    assert torch.equal(values, next_token_logprobs(logits[:5]).topk(c, dim=1).values)


def test_beam_search_on_a_large_vocabulary_equals_plain_topk(monkeypatch):
    # Multi30k's vocabulary size: the search's top-k takes `row_topk`'s two rounds
    torch.manual_seed(5)
    model = Transformer(replace(MICRO, vocab_size=8000)).eval()
    src, mask = source_batch([[(37 * i + 11 * j) % 7990 + 4 for j in range(2 + i % 4)] for i in range(6)])
    fast = beam_search(model, src, mask, beam_size=4, nbest=4, max_len_b=6)
    monkeypatch.setattr("aiayn.decoding.common.row_topk", lambda x, k: x.topk(k, dim=1))
    plain = beam_search(model, src, mask, beam_size=4, nbest=4, max_len_b=6)
    assert [summary(h) for h in fast] == [summary(h) for h in plain]


def test_rows_are_k_per_live_sentence_and_leave_with_it():
    # k rows per sentence from its first step (only beam 0 alive there); key 12's sentence ends
    # at step 2 (EOS .9 after [C]), the two endless ones run to their maximum length, 4
    model = TableModel(TABLES)
    rows = []
    step = model.decode_step
    model.decode_step = lambda tokens, cache: rows.append(tokens.size(0)) or step(tokens, cache)
    src, mask = src_of(13, 12, 13)
    beam_search(model, src, mask, beam_size=3, alpha=0.0, max_len_a=0.0, max_len_b=4)
    assert rows == [9, 9, 6, 6]


def test_sentences_finishing_at_different_times_in_one_batch():
    alone = [run_beam([k], beam_size=2, alpha=1.0, max_len_b=30, nbest=1)[0][0] for k in (10, 11, 12)]
    together, steps = run_beam([12, 10, 11], beam_size=2, alpha=1.0, max_len_b=30, nbest=1)
    assert [summary(h) for h in together] == [summary(alone[2]), summary(alone[0]), summary(alone[1])]
    assert steps == 22  # the batch runs as long as its longest sentence, no longer


def test_max_length_is_honoured():
    model = TableModel(TABLES)
    src, mask = source_batch([[13, 4], [13, 4, 4, 4]])  # S = 3 and 5 with EOS
    greedy = greedy_search(model, src, mask, max_len_a=1.5, max_len_b=2)
    lengths = [6, 9]  # floor(1.5 * 3 + 2), floor(1.5 * 5 + 2)
    assert [h.tokens for h in greedy] == [[A] * n for n in lengths]
    assert [h.complete for h in greedy] == [False, False]
    assert [h.logprob for h in greedy] == pytest.approx([n * math.log(0.7) for n in lengths])
    assert model.steps == 9
    model.steps = 0
    beams = beam_search(model, src, mask, beam_size=3, alpha=0.6, max_len_a=1.5, max_len_b=2, nbest=3)
    for hyps, n in zip(beams, lengths):
        assert hyps[0].tokens == [A] * n and not hyps[0].complete
        assert hyps[0].score == pytest.approx(n * math.log(0.7) / lp(n, 0.6))
        for h in hyps[1:]:  # next best (tied): one B anywhere
            assert sorted(h.tokens) == [A] * (n - 1) + [B]
            assert h.score == pytest.approx(((n - 1) * math.log(0.7) + math.log(0.3)) / lp(n, 0.6))
        assert [len(h.tokens) for h in hyps] == [n] * 3
        assert hyps[0].score >= hyps[1].score >= hyps[2].score
    assert model.steps == 9
    # The config defaults (a = 1, b = 50) for a model without a config: L = S + 50.
    model.steps = 0
    (h,) = greedy_search(model, *source_batch([[13, 4, 4]]))
    assert len(h.tokens) == 4 + 50 and model.steps == 54


def test_cut_off_hypotheses_rank_below_complete_ones():
    # [] EOS (p .1) is complete; [A, A, A] (p .9, cut off at L = 3) scores higher but never ended.
    tables = {14: lambda prefix: {EOS_ID: 0.1, A: 0.9} if prefix == () else {A: 1.0}}
    src, mask = source_batch([[14]])
    (hyps,) = beam_search(TableModel(tables), src, mask, beam_size=2, alpha=0.0, max_len_a=0,
                          max_len_b=3, nbest=2)
    assert [(h.tokens, h.complete) for h in hyps] == [([], True), ([A, A, A], False)]
    assert hyps[0].score == pytest.approx(math.log(0.1))
    assert hyps[1].score == pytest.approx(math.log(0.9))


def test_greedy_on_the_table():
    model = TableModel(TABLES)
    hyps = greedy_search(model, *src_of(10, 11, 12), max_len_a=0, max_len_b=30)
    # key 10: A (.6), then EOS (.5); key 11: C, EOS (.7); key 12: C, EOS (.9).
    assert [(h.tokens, h.complete) for h in hyps] == [([A], True), ([C], True), ([C], True)]
    assert [h.score for h in hyps] == pytest.approx([math.log(0.3), math.log(0.7), math.log(0.9)])
    assert hyps[0].token_logprobs == pytest.approx([math.log(0.6), math.log(0.5)])
    assert model.steps == 2


def test_invalid_arguments():
    src, mask = src_of(10)
    with pytest.raises(ValueError):
        beam_search(TableModel(TABLES), src, mask, beam_size=2, nbest=3)
    with pytest.raises(ValueError):
        beam_search(TableModel(TABLES), src, mask, beam_size=2, alpha=-1.0)
    assert beam_search(TableModel(TABLES), src[:0], mask[:0]) == []
    assert greedy_search(TableModel(TABLES), src[:0], mask[:0]) == []


class NoEos(Transformer):
    """A real model that can never end a sentence."""

    def decode_step(self, tokens, cache):
        out = super().decode_step(tokens, cache).clone()
        out[:, EOS_ID] = float("-inf")
        return out


def test_learned_positions_cap_the_output_length():
    cfg = replace(MICRO, vocab_size=16, positions="learned", max_positions=8,
                  n_layers=1, d_model=16, d_ff=32, n_heads=2)
    torch.manual_seed(0)
    model = NoEos(cfg).eval()
    src, mask = source_batch([[4, 5, 6]], limit=decoder_length_cap(model))  # 8, not 16, positions
    for hyps in (greedy_search(model, src, mask), beam_search(model, src, mask)[0]):
        # S + 50 = 54, but the decoder has 8 positions: no crash, cut off at 8.
        assert len(hyps[0].tokens) == 8 and not hyps[0].complete
