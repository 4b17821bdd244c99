"""Reference perplexity under tiny hand-built models whose probabilities are known."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from aiayn.evaluation.perplexity import reference_perplexity

PAD = 0


class Uniform(nn.Module):
    """Equal logits everywhere: every token has probability 1/V, so perplexity is exactly V."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.scale = nn.Parameter(torch.ones(()))  # gives the module a device

    def forward(self, src, tgt_in):
        return self.scale * torch.zeros(*tgt_in.shape, self.vocab)  # (B, T, V)


class Bigram(nn.Module):
    """p(next | previous decoder input) from a fixed table; with dropout, to test eval mode."""

    def __init__(self, probs: torch.Tensor):
        super().__init__()
        self.log_probs = nn.Parameter(probs.log())  # (V, V)
        self.dropout = nn.Dropout(0.9)

    def forward(self, src, tgt_in):
        return self.dropout(self.log_probs[tgt_in])  # (B, T, V)


def batch(tgt: list[list[int]]) -> SimpleNamespace:
    """Decoder input = [BOS=2] + pieces, target = pieces + [EOS=3], both PAD-padded."""
    t = max(len(s) for s in tgt) + 1
    tin = torch.tensor([[2] + s + [PAD] * (t - 1 - len(s)) for s in tgt])
    tout = torch.tensor([s + [3] + [PAD] * (t - 1 - len(s)) for s in tgt])
    return SimpleNamespace(src=torch.ones(len(tgt), 3, dtype=torch.long), tgt_in=tin, tgt_out=tout)


def test_uniform_model_has_perplexity_equal_to_vocabulary_size():
    r = reference_perplexity(Uniform(37), [batch([[5, 6, 7], [8]]), batch([[9, 9]])], pad_id=PAD)
    assert r["n_tokens"] == 4 + 2 + 3  # pieces + EOS per sentence, padding excluded
    assert r["ppl"] == pytest.approx(37.0, rel=1e-6)
    assert r["nll_per_token"] == pytest.approx(math.log(37.0), rel=1e-6)


def test_known_probabilities_give_the_hand_computed_perplexity():
    torch.manual_seed(0)
    v = 6
    probs = torch.softmax(torch.randn(v, v, dtype=torch.float64), -1).float()
    model = Bigram(probs)
    model.train()  # reference_perplexity must switch dropout off and restore the mode
    sents = [[4, 5, 4], [5], [1, 4, 5, 5, 4]]
    r = reference_perplexity(model, [batch(sents[:2]), batch(sents[2:])], pad_id=PAD)

    nll, n = 0.0, 0
    for s in sents:
        for prev, nxt in zip([2] + s, s + [3]):
            nll -= math.log(probs[prev, nxt].item())
            n += 1
    assert r["n_tokens"] == n
    assert r["nll_per_token"] == pytest.approx(nll / n, rel=1e-5)
    assert r["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert model.training


def test_batching_and_padding_do_not_change_the_result():
    torch.manual_seed(1)
    model = Bigram(torch.softmax(torch.randn(7, 7), -1))
    sents = [[4, 5, 6, 4], [5], [6, 6], [1]]
    one = reference_perplexity(model, [batch(sents)], pad_id=PAD)
    each = reference_perplexity(model, [batch([s]) for s in sents], pad_id=PAD)
    assert one["n_tokens"] == each["n_tokens"]
    assert one["ppl"] == pytest.approx(each["ppl"], rel=1e-6)


def test_no_gradients_and_empty_input():
    seen = []

    class Spy(Uniform):
        def forward(self, src, tgt_in):
            seen.append(torch.is_grad_enabled())
            return super().forward(src, tgt_in)

    model = Spy(5)
    reference_perplexity(model, [batch([[4]])], pad_id=PAD)
    assert seen == [False]
    with pytest.raises(ValueError):
        reference_perplexity(model, [], pad_id=PAD)
