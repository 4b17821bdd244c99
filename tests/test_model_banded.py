"""Restricted self-attention computed banded (aiayn.model.banded) equals dense attention under the
window mask, forward and gradients, in the encoder (padding) and the causal decoder, for windows
smaller and larger than the sequence; the windowed decoding cache equals the full pass."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from aiayn.config import BASE
from aiayn.model import banded as banded_module
from aiayn.model import build_model
from aiayn.model.banded import Band, band_allowed, banded_attention
from aiayn.special import PAD_ID

CFG = replace(BASE, vocab_size=40, n_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0)


def dense_reference(q, k, v, r, causal, key_mask):
    """Eq. 1 over the whole n x n score matrix, the window written out: query i may attend key j
    when |i - j| <= r, j <= i if causal, j is a real token; and always itself."""
    t = q.size(-2)
    allowed = torch.zeros(q.size(0), t, t, dtype=torch.bool)
    for b in range(q.size(0)):
        for i in range(t):
            for j in range(t):
                ok = abs(i - j) <= r and (j <= i or not causal)
                ok = ok and (key_mask is None or bool(key_mask[b, j]))
                allowed[b, i, j] = ok or i == j
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, h, T, T)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t", [1, 7, 12])
@pytest.mark.parametrize("r", [0, 1, 2, 3, 5, 11, 12, 40])
def test_banded_equals_dense_forward_and_gradients(r, t, causal):
    g = torch.Generator().manual_seed(r * 100 + t)
    q, k, v = (torch.randn(2, 3, t, d, generator=g, dtype=torch.float64, requires_grad=True)
               for d in (5, 5, 4))
    key_mask = None
    if not causal:  # encoder: the second row is padded after 60% of its length
        key_mask = torch.ones(2, t, dtype=torch.bool)
        key_mask[1, max(1, int(0.6 * t)):] = False
    out = banded_attention(q, k, v, Band(r, causal, key_mask))
    ref = dense_reference(q, k, v, r, causal, key_mask)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_band_dense_is_the_reference_mask():
    key_mask = torch.tensor([[1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    for causal in (False, True):
        dense = Band(2, causal, None if causal else key_mask).dense(6)
        q = torch.zeros(1, 1, 6, 1, dtype=torch.float64)
        v = torch.eye(6, dtype=torch.float64)[None, None]  # row j of the output: weights on key j
        w = dense_reference(q, q, v, 2, causal, None if causal else key_mask)
        assert torch.equal(dense.reshape(6, 6), w[0, 0] > 0)


def test_banded_work_grows_with_r_times_n_not_n_squared():
    # scores computed: (blocks x block size x window), at most 3 (n + r) r, against n^2 dense
    for n in (64, 1024, 4096):
        for r in (4, 32):
            allowed, b = band_allowed(n, r, causal=False, key_mask=None)
            assert allowed[0].numel() <= 3 * (n + r) * r
            causal, _ = band_allowed(n, r, causal=True, key_mask=None)
            assert causal[0].numel() <= 2 * (n + r) * r
    assert band_allowed(4096, 32, False, None)[0].numel() < 4096**2 / 20


def with_dense_kernel(monkeypatch):
    """Make every Band attention in the model run through the dense reference instead."""
    def dense(q, k, v, band, dropout_p=0.0):
        return dense_reference(q, k, v, band.r, band.causal, band.key_mask)
    monkeypatch.setattr(banded_module, "banded_attention", dense)


@pytest.mark.parametrize("r", [0, 2, 5, 30])
def test_restricted_transformer_equals_dense_masked_model(r, monkeypatch):
    torch.manual_seed(0)
    model = build_model(replace(CFG, attn_window=r)).double()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 13), generator=g)
    src[1, 9:] = PAD_ID
    src[2, 3:] = PAD_ID
    tgt = torch.randint(4, 40, (3, 11), generator=g)

    def run():
        model.zero_grad()
        logits = model(src, tgt)
        (logits * torch.linspace(-1, 1, 40, dtype=torch.float64)).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    banded, banded_grads = run()
    with monkeypatch.context() as m:
        with_dense_kernel(m)
        dense, dense_grads = run()
    torch.testing.assert_close(banded, dense, rtol=1e-9, atol=1e-9)
    for name, grad in banded_grads.items():
        torch.testing.assert_close(grad, dense_grads[name], rtol=1e-8, atol=1e-9, msg=name)


@pytest.mark.parametrize("r", [0, 1, 3])
def test_windowed_cache_keeps_r_plus_1_positions_and_equals_full_pass(r):
    torch.manual_seed(0)
    model = build_model(replace(CFG, attn_window=r)).eval()
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, 40, (3, 6), generator=g)
    tgt = torch.randint(4, 40, (3, 14), generator=g)
    mask = src != PAD_ID
    with torch.no_grad():
        full = model(src, tgt)
        cache = model.new_cache(model.encode(src, mask), mask, capacity=1)
        steps = []
        for i in range(10):  # well past the window: the ring has wrapped
            steps.append(model.decode_step(tgt[:, i:i + 1], cache))
            assert cache.capacity <= r + 1
        torch.testing.assert_close(torch.stack(steps, 1), full[:, :10], rtol=0, atol=1e-5)
        index = torch.tensor([2, 0, 0, 1])  # beam search's reorder, after wrapping
        cache.reorder(index)
        for i in range(10, 14):
            nxt = model.decode_step(tgt[index, i:i + 1], cache)
            torch.testing.assert_close(nxt, full[index, i], rtol=0, atol=1e-5)
