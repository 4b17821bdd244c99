"""The label-smoothed loss's fast paths (aiayn/kernels/loss.py) against each other: a CPU's
256-row blocks, a GPU's one block, the compiled whole-tensor kernels a GPU runs (compiled here for
the CPU through the same code) and their fallback to the eager path when compiling fails. The
definition itself is tested against a one-hot target matrix in tests/test_training_recipe.py."""

from __future__ import annotations

import pytest
import torch

from aiayn.kernels import loss as loss_kernel
from aiayn.special import EOS_ID, PAD_ID
from aiayn.training.loss import label_smoothed_loss


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_gpus_one_block_loss_equals_the_cpus_blocked_one(monkeypatch, eps):
    """A GPU takes every row in one block (`loss.block_rows`); on a CPU the same computation in
    one block gives the loss and gradients of 256-row blocks, to float32 rounding."""
    assert loss_kernel.block_rows(torch.zeros(5, 3)) == loss_kernel._CHUNK_ROWS  # CPU: blocks
    g = torch.Generator().manual_seed(2)
    n, v = loss_kernel._CHUNK_ROWS * 3 + 11, 64
    logits = torch.randn(n, v, generator=g) * 3
    target = torch.randint(4, v, (n,), generator=g)
    target[::5] = PAD_ID

    def run(rows):
        monkeypatch.setattr(loss_kernel, "block_rows", lambda _: rows)
        x = logits.clone().requires_grad_()
        out = label_smoothed_loss(x, target, eps)
        (0.6 * out.smoothed + 0.3 * out.nll).backward()
        return out, x.grad

    (blocked, g_blocked), (whole, g_whole) = run(loss_kernel._CHUNK_ROWS), run(n)
    assert whole.smoothed.item() == pytest.approx(blocked.smoothed.item(), rel=1e-6)
    assert whole.nll.item() == pytest.approx(blocked.nll.item(), rel=1e-6)
    assert torch.allclose(g_whole, g_blocked, atol=1e-7, rtol=1e-6)


def _loss_and_grads(logits, target, eps):
    x = logits.clone().requires_grad_()
    out = label_smoothed_loss(x, target, eps)
    (0.6 * out.smoothed + 0.3 * out.nll).backward()
    return out, x.grad


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gpus_compiled_loss_equals_the_cpus_blocked_one(monkeypatch, dtype):
    """On a GPU the loss runs `_whole_terms` and `_whole_grad` compiled (torch.compile, dynamic
    rows); here the same functions compiled for the CPU, through the code that makes them, give
    the blocked path's loss and gradients, batch after batch of new row counts (one graph)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(loss_kernel, "fused_on", lambda _: True)
    monkeypatch.setattr(loss_kernel, "_compiled", None)
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(3)
    v = 70
    for n in (300, 517):  # a second row count: the dynamic graph, no new compile needed
        logits = (torch.randn(n, v, generator=g) * 3).to(dtype)
        target = torch.randint(2, v, (n,), generator=g)
        target[::6] = PAD_ID
        target[1::9] = EOS_ID
        fused, g_fused = _loss_and_grads(logits, target, 0.1)
        assert isinstance(loss_kernel._compiled, tuple)  # the compiled path ran, not the fallback
        with monkeypatch.context() as m:
            m.setattr(loss_kernel, "fused_on", lambda _: False)
            blocked, g_blocked = _loss_and_grads(logits, target, 0.1)
        assert fused.smoothed.item() == pytest.approx(blocked.smoothed.item(), rel=1e-5)
        assert fused.nll.item() == pytest.approx(blocked.nll.item(), rel=1e-5)
        assert g_fused.dtype == dtype
        tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16 gradients: 8 mantissa bits
        assert torch.allclose(g_fused.float(), g_blocked.float(), atol=tol, rtol=tol)
        assert g_fused[target == PAD_ID].abs().max().item() == 0.0
        # the per-token terms of evaluation (perplexity) take the same compiled path
        per_token = loss_kernel.token_losses(logits, target, 0.1)
        with monkeypatch.context() as m:
            m.setattr(loss_kernel, "fused_on", lambda _: False)
            per_token_blocked = loss_kernel.token_losses(logits, target, 0.1)
        for a, b in zip(per_token, per_token_blocked):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    # one graph per function for every row count, with and without gradients
    assert counters["stats"]["unique_graphs"] == 2


def test_the_gpu_loss_falls_back_to_eager_when_compiling_fails(monkeypatch, caplog):
    monkeypatch.setattr(loss_kernel, "fused_on", lambda _: True)
    monkeypatch.setattr(loss_kernel, "_compiled", None)

    def broken(*_a, **_k):
        raise RuntimeError("Cannot find a working triton installation\nmore text")

    monkeypatch.setattr(torch, "compile", broken)
    g = torch.Generator().manual_seed(4)
    logits, target = torch.randn(40, 30, generator=g), torch.randint(2, 30, (40,), generator=g)
    with caplog.at_level("WARNING"):
        out, grad = _loss_and_grads(logits, target, 0.1)
    assert loss_kernel._compiled is False
    assert "did not compile (Cannot find a working triton installation)" in caplog.text
    monkeypatch.setattr(loss_kernel, "fused_on", lambda _: False)
    ref, g_ref = _loss_and_grads(logits, target, 0.1)
    assert out.smoothed.item() == ref.smoothed.item() and torch.equal(grad, g_ref)
