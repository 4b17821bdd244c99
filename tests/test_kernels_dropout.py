"""The CPU dropout mask (aiayn/kernels/dropout.py) against the definition of inverted dropout."""

import pytest
import torch
import torch.nn.functional as F

from aiayn.kernels.dropout import dropout, keep_threshold


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_and_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1000)
    y = dropout(x, p, training=True)
    kept = y != 0
    _, keep = keep_threshold(p)
    assert abs(keep - (1 - p)) < 1e-5
    # 1e6 Bernoulli draws: the kept fraction is within 5 standard deviations of 1 - p
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * (p * (1 - p) / 1e6) ** 0.5
    assert torch.all(y[kept] == 1 / keep)  # inverted dropout: E[y] = x exactly
    assert y.mean().item() == pytest.approx(1.0, abs=3e-3)


def test_mask_is_random_per_element_and_seeded():
    torch.manual_seed(1)
    a = dropout(torch.ones(64, 257), 0.3, True)
    torch.manual_seed(1)
    b = dropout(torch.ones(64, 257), 0.3, True)
    c = dropout(torch.ones(64, 257), 0.3, True)
    assert torch.equal(a, b) and not torch.equal(a, c)
    # neighbouring elements (which share one 64-bit draw) are not correlated
    m = (a != 0).float().flatten()
    corr = torch.corrcoef(torch.stack([m[:-1], m[1:]]))[0, 1].item()
    assert abs(corr) < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_uses_the_forward_mask(dtype):
    torch.manual_seed(2)
    x = torch.randn(33, 17, dtype=dtype, requires_grad=True)
    y = dropout(x, 0.3, True)
    g = torch.randn_like(y)
    y.backward(g)
    scale = torch.where(y != 0, y / x.detach(), torch.zeros_like(y))  # mask / keep per element
    assert y.dtype == dtype
    assert torch.allclose(x.grad.float(), (g * scale).float(), rtol=1e-2, atol=1e-3)


def test_identity_when_not_training_or_p_zero_and_p_one_drops_all():
    x = torch.randn(5, 7)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, True), F.dropout(x, 1.0, True))
