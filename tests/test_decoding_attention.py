"""Attention from the decoding that happened: the weights the KV-cached decoder returns step by
step, and those greedy and beam search keep per hypothesis, equal the weights of a teacher-forced
pass over the same output (the slow, independent reference); asking for them changes no result."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aiayn.config import BASE
from aiayn.decoding import source_batch
from aiayn.decoding.common import AttentionRequest, check_index
from aiayn.special import BOS_ID

from helpers import beam_search, greedy_search, train_reverser

VOCAB = 30


@pytest.fixture(scope="module")
def model():
    """Trained briefly to reverse its source: outputs of varied lengths that end with EOS."""
    cfg = replace(BASE, vocab_size=VOCAB, n_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0,
                  max_len_b=12)
    return train_reverser(cfg, steps=80)


@pytest.fixture(scope="module")
def sources():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(4, VOCAB, (int(n),), generator=g).tolist() for n in [2, 7, 4, 8, 3, 6]]


def teacher_forced(model, src: list[int], tokens: list[int], steps: int) -> dict:
    """Every attention weight of a teacher-forced pass over `tokens` (the first `steps` decoder
    positions: [BOS] + tokens[:steps-1])."""
    s, m = source_batch([src], multiple=1)  # no PAD keys: the weights over the source alone
    tgt_in = torch.tensor([[BOS_ID] + tokens[: steps - 1]])
    with torch.no_grad():
        _, w = model(s, tgt_in, m, return_attention=True)
    return w


@pytest.mark.slow
@pytest.mark.parametrize("unfused", [True, False], ids=["eq1-written-out", "fused-kernel"])
def test_decode_step_weights_equal_teacher_forced(model, sources, unfused, monkeypatch):
    # both attention kernels a decoding step may use (`attention.unfused_decoding` picks one)
    monkeypatch.setattr("aiayn.model.layers.unfused_decoding", lambda q: unfused)
    src, mask = source_batch(sources)  # (B, S), padded
    b, t_len = src.size(0), 6
    tgt = torch.randint(4, VOCAB, (b, t_len), generator=torch.Generator().manual_seed(2))
    tgt[:, 0] = BOS_ID
    with torch.no_grad():
        logits_tf, ref = model(src, tgt, mask, return_attention=True)
        cache = model.new_cache(model.encode(src, mask), mask)
        plain_cache = model.new_cache(model.encode(src, mask), mask)
        for t in range(t_len):
            logits, w = model.decode_step(tgt[:, t : t + 1], cache, return_attention=True)
            # Asking for the weights leaves the step's result exactly as it was.
            assert torch.equal(model.decode_step(tgt[:, t : t + 1], plain_cache), logits)
            assert torch.allclose(logits, logits_tf[:, t], atol=1e-5)
            for layer in range(2):
                self_w, cross_w = w["self"][layer], w["cross"][layer]
                assert self_w.shape == (b, 4, 1, t + 1) and cross_w.shape == (b, 4, 1, src.size(1))
                want = ref["self"][layer][:, :, t, : t + 1]
                assert torch.allclose(self_w[:, :, 0], want, atol=1e-6)
                assert torch.allclose(cross_w[:, :, 0], ref["cross"][layer][:, :, t], atol=1e-6)
                assert torch.allclose(cross_w.sum(-1), torch.ones(()), atol=1e-5)
                assert (cross_w.transpose(1, 3)[~mask] == 0).all()  # padded keys get nothing
    # The teacher-forced decoder self-attention is causal: zero above the diagonal.
    for w in ref["self"]:
        assert (w.triu(diagonal=1) == 0).all()


def _check_hypothesis_attention(model, src, h, request):
    steps = len(h.tokens) + int(h.complete)
    assert h.attention is not None and h.attention.shape[2:] == (steps, len(src) + 1)
    ref = teacher_forced(model, src, h.tokens, steps)["cross"]  # per layer (1, h, steps, S)
    full = torch.stack([w[0] for w in ref])  # (L, h, steps, S)
    layers = range(2) if request.layers is None else [check_index(i, 2, "l") for i in request.layers]
    want = full[list(layers)]
    if request.heads is not None:
        want = want[:, list(request.heads)]
    if request.mean_heads:
        want = want.mean(dim=1, keepdim=True)
    assert h.attention.shape == want.shape
    assert torch.allclose(h.attention, want, atol=1e-5)
    assert torch.allclose(h.attention.sum(-1), torch.ones(()), atol=1e-5)


REQUESTS = [AttentionRequest(), AttentionRequest(layers=(-1,), mean_heads=True),
            AttentionRequest(layers=(0,), heads=(2, 1))]


@pytest.mark.parametrize("request_", REQUESTS)
def test_beam_search_keeps_the_attention_it_used(model, sources, request_):
    src, mask = source_batch(sources)
    for kwargs in [dict(nbest=3), dict(nbest=2, max_len_a=0.0, max_len_b=3)]:  # second: cut off
        plain = beam_search(model, src, mask, beam_size=4, **kwargs)
        kept = beam_search(model, src, mask, beam_size=4, attention=request_, **kwargs)
        assert [[(h.tokens, h.score, h.complete) for h in hs] for hs in kept] == \
               [[(h.tokens, h.score, h.complete) for h in hs] for hs in plain]
        assert all(h.attention is None for hs in plain for h in hs)
        lengths = {len(h.tokens) for hs in kept for h in hs}
        assert len(lengths) >= 3  # sentences left the batch at different steps
        for s, hyps in zip(sources, kept):
            for h in hyps:
                _check_hypothesis_attention(model, s, h, request_)
    assert any(not h.complete for hs in kept for h in hs)


def test_greedy_search_keeps_the_attention_it_used(model, sources):
    src, mask = source_batch(sources)
    request = AttentionRequest()
    plain = greedy_search(model, src, mask)
    kept = greedy_search(model, src, mask, attention=request)
    assert [(h.tokens, h.score) for h in kept] == [(h.tokens, h.score) for h in plain]
    for s, h in zip(sources, kept):
        _check_hypothesis_attention(model, s, h, request)


def test_attention_request_select():
    cross = [torch.rand(3, 4, 1, 5).softmax(-1) for _ in range(2)]  # per layer (B, h, 1, S)
    assert AttentionRequest().select(cross).shape == (3, 2, 4, 5)
    w = AttentionRequest(layers=(-1,), heads=(3, 0), mean_heads=True).select(cross)
    assert torch.allclose(w[:, 0, 0], (cross[1][:, 3, 0] + cross[1][:, 0, 0]) / 2)
    with pytest.raises(ValueError, match="layer 2 does not exist"):
        AttentionRequest(layers=(2,)).select(cross)
    with pytest.raises(ValueError, match="head -5"):
        AttentionRequest(heads=(-5,)).select(cross)
