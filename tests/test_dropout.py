"""The CPU dropout mask (aiayn/model/dropout.py) against the definition of inverted dropout."""

import pytest
import torch
import torch.nn.functional as F

from aiayn.model.dropout import dropout, keep_threshold


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


def test_word_dropout_rate_keeps_specials_and_is_off_in_eval():
    from aiayn.model.dropout import word_dropout
    from aiayn.special import UNK_ID

    torch.manual_seed(0)
    ids = torch.randint(4, 1000, (400, 500))
    ids[:, :4] = torch.tensor([0, 1, 2, 3])  # PAD, UNK, BOS, EOS in every row
    out = word_dropout(ids, 0.3, training=True)
    assert torch.equal(out[:, :4], ids[:, :4])
    changed = out[:, 4:] != ids[:, 4:]
    assert torch.all(out[:, 4:][changed] == UNK_ID)
    n = changed.numel()
    assert abs(changed.float().mean().item() - 0.3) < 5 * (0.3 * 0.7 / n) ** 0.5
    assert word_dropout(ids, 0.3, training=False) is ids and word_dropout(ids, 0.0, True) is ids


def test_encoder_reads_dropped_words_as_unk_in_training_only():
    from aiayn.config import Config
    from aiayn.model import Transformer
    from aiayn.model.dropout import word_dropout

    cfg = Config(vocab_size=30, n_layers=1, d_model=16, d_ff=32, n_heads=2, p_drop=0.0,
                 p_word_drop=0.5)
    torch.manual_seed(0)
    model = Transformer(cfg)
    src = torch.randint(4, 30, (3, 9))
    torch.manual_seed(5)
    dropped = word_dropout(src, 0.5, training=True)
    assert not torch.equal(dropped, src)
    torch.manual_seed(5)
    trained = model.train().encode(src)
    model.eval()
    torch.testing.assert_close(trained, model.encode(dropped))
    assert not torch.allclose(model.encode(src), trained)
    with pytest.raises(Exception, match="p_word_drop"):
        Config(vocab_size=30, arch="rnn", p_word_drop=0.1)
