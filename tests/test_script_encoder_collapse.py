"""tools/encoder_collapse.py: a model that reads its source against the same model with its
encoder forced to collapse (every position mapped to one vector)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiayn.data.batching import collate
from aiayn.decoding.common import source_batch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import encoder_collapse as collapse  # noqa: E402

from helpers import MICRO, reverser_model_dir, train_reverser  # noqa: E402


@pytest.fixture(scope="module")
def reverser():
    cfg = replace(MICRO, vocab_size=40, n_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0)
    return train_reverser(cfg, steps=150)


def batch(vocab: int = 40):
    g = torch.Generator().manual_seed(1)
    srcs = [torch.randint(4, vocab, (n,), generator=g).tolist() for n in (3, 6, 8, 5)]
    return srcs, *source_batch(srcs)


def test_position_similarity_by_hand():
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [5.0, 5.0]]])  # (1, 4, 2)
    mask = torch.tensor([[True, True, True, False]])
    # pairs (0,1): 0, (0,2) and (1,2): 1/sqrt(2), each counted both ways; position 3 is padding
    assert collapse.position_similarity(x, mask) == pytest.approx((0 + 2 * 2 ** -0.5) / 3)
    same = torch.ones(2, 3, 4)
    assert collapse.position_similarity(same, torch.ones(2, 3, dtype=torch.bool)) == pytest.approx(1.0)


def test_a_reading_model_is_told_apart_from_a_collapsed_one(reverser):
    srcs, src, mask = batch()
    tgts = [[4 + (x - 4) % 36 for x in reversed(s)] for s in srcs]
    reading = collapse.encoder_stats(reverser, src, mask)
    assert [s.layer for s in reading] == [0, 1, 2]
    assert reading[-1].similarity < 0.9
    pairs = collate(list(zip(srcs, tgts)), range(len(srcs)))
    shares = collapse.cross_entropy_share(reverser, pairs)
    assert len(shares) == 2 and min(shares) < 0.8  # the reverser looks at particular words

    # a huge constant added by each FFN swamps the residual stream under post-norm
    with torch.no_grad():
        for layer in reverser.encoder:
            layer.ffn.w2.bias.copy_(torch.linspace(-1, 1, 32) * 1e4)
    broken = collapse.encoder_stats(reverser, src, mask)
    assert broken[-1].similarity > 0.999
    assert broken[-1].ffn_norm > 100 * broken[-1].residual_norm
    assert min(collapse.cross_entropy_share(reverser, pairs)) > 0.99


def test_cli_prints_the_table_and_rejects_a_missing_file(tmp_path, capsys):
    model = reverser_model_dir(tmp_path / "m")
    src = tmp_path / "src.txt"
    src.write_text("hello world\nthe cat sat\n", encoding="utf-8")
    assert collapse.main(["--model", str(model), "--src", str(src), "--ref", str(src)]) == 0
    out = capsys.readouterr().out
    assert "position similarity" in out and "entropy / uniform" in out
    assert collapse.main(["--model", str(model), "--src", str(tmp_path / "nope.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "nope.txt" in err and "Traceback" not in err
