"""The attention kernels aiayn chooses (aiayn/kernels/attention.py) against the definition of
Eq. 1 (`aiayn.model.attention.explicit_attention`, torch's softmax and autograd) and against
PyTorch's fused kernel: the training step's choice, its written-out attention and float32 softmax."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aiayn.kernels.attention import MATH_MAX_KEYS_FP32, training_attention, unfused_training
from aiayn.model.attention import MultiHeadAttention, causal_mask, explicit_attention

from helpers import MICRO

MICRO = replace(MICRO, vocab_size=40, p_drop=0.0)


def test_training_kernel_choice_follows_key_length_and_grad_mode():
    q = torch.randn(2, 2, 5, 4)
    short, long_ = torch.randn(2, 2, MATH_MAX_KEYS_FP32, 4), torch.randn(2, 2, MATH_MAX_KEYS_FP32 + 1, 4)
    assert unfused_training(q, short) and not unfused_training(q, long_)
    with torch.no_grad():  # decoding and evaluation keep PyTorch's choice
        assert not unfused_training(q, short)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert unfused_training(q, long_)


@pytest.mark.parametrize("s", [9, MATH_MAX_KEYS_FP32 + 3])
def test_training_attention_gradients_equal_the_fused_kernels(s, monkeypatch):
    """The kernel `attend` picks for a float32 CPU training step (unfused at short keys) gives the
    forward and gradients of PyTorch's own choice (the fused flash kernel on CPU)."""
    import aiayn.model.attention as attention

    cfg = replace(MICRO, d_model=16, n_heads=2)
    torch.manual_seed(0)
    mha = MultiHeadAttention(cfg, self_attention=False)
    x, mem = torch.randn(3, 6, 16), torch.randn(3, s, 16)
    key_ok = torch.ones(3, s, dtype=torch.bool)
    key_ok[1, s // 2:] = False

    def run():
        mha.zero_grad()
        q = mha.project_q(x)
        k, v = mha.project_kv(mem)
        out, _ = mha.attend(q, k, v, key_ok[:, None, None, :])
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return out.detach(), [p.grad.clone() for p in mha.parameters()]

    out_a, grads_a = run()
    monkeypatch.setattr(attention, "unfused_training", lambda q, k: False)
    out_b, grads_b = run()
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-5)


def _attention_inputs(seed=0, b=3, h=2, t=5, s=7, d=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, requires_grad=True) for n in (t, s, s)]


@pytest.mark.parametrize("masking", ["padding", "causal", "none"])
def test_training_attention_equals_eq1_written_with_torch_softmax(masking):
    """The training step's attention (its own float32 softmax and backward) against
    `explicit_attention` (torch's softmax and autograd): outputs and the gradients of q, k, v."""
    t, s = (6, 6) if masking == "causal" else (5, 7)  # causal: as many keys as queries
    q, k, v = _attention_inputs(t=t, s=s)
    mask, is_causal = None, masking == "causal"
    if masking == "padding":
        mask = torch.ones(3, 1, 1, k.size(-2), dtype=torch.bool)
        mask[1, ..., 3:] = False
    grad_out = torch.randn(q.size(0), q.size(1), q.size(2), v.size(-1))

    def run(f):
        for x in (q, k, v):
            x.grad = None
        out = f()
        (out * grad_out).sum().backward()
        return out.detach(), [x.grad.clone() for x in (q, k, v)]

    out_a, grads_a = run(lambda: training_attention(q, k, v, mask, is_causal, 0.0))
    ref_mask = causal_mask(q.size(-2)) if is_causal else mask
    out_b, grads_b = run(lambda: explicit_attention(q, k, v, ref_mask)[0])
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-6)


def test_training_attention_gives_a_fully_masked_row_zero_weights():
    """No NaN from a query that may attend to nothing: output 0 and finite gradients there, the
    other rows as if it were not in the batch."""
    q, k, v = _attention_inputs()
    mask = torch.ones(3, 1, 5, 7, dtype=torch.bool)
    mask[0, 0, 2] = False  # query 2 of sentence 0 sees no key
    out = training_attention(q, k, v, mask, False, 0.0)
    out.sum().backward()
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    alone = explicit_attention(q[1:], k[1:], v[1:], mask[1:])[0]
    torch.testing.assert_close(out[1:], alone, rtol=1e-5, atol=1e-6)


def test_training_attention_in_bf16_autocast_is_close_to_float32():
    """Under bf16 autocast (the products in bf16, the softmax computed in float32): output and
    gradients within bf16's rounding of the float32 reference's."""
    q, k, v = _attention_inputs(s=12)
    mask = torch.ones(3, 1, 1, 12, dtype=torch.bool)
    mask[2, ..., 4:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = training_attention(q, k, v, mask, False, 0.0)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref = explicit_attention(q, k, v, mask)[0]
    ref.sum().backward()
    torch.testing.assert_close(out.float(), ref.detach(), rtol=0.05, atol=0.05)
    for g, x in zip(grads, (q, k, v)):
        assert g.dtype == torch.float32  # the leaves' own dtype, through autocast's casts
        torch.testing.assert_close(g, x.grad, rtol=0.05, atol=0.05)


def test_training_attention_dropout_keeps_the_expected_value():
    """Dropout on the weights (P_attn_drop) zeroes some and rescales the rest: averaged over many
    draws the output is the undropped one."""
    q, k, v = (x.detach() for x in _attention_inputs())
    torch.manual_seed(3)
    plain = training_attention(q, k, v, None, False, 0.0)
    draws = torch.stack([training_attention(q, k, v, None, False, 0.5) for _ in range(3000)])
    assert not torch.equal(draws[0], plain)
    torch.testing.assert_close(draws.mean(0), plain, rtol=0.0, atol=0.1)
