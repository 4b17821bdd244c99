"""bf16 decoding on a CPU pads the rows of its products (aiayn.decoding.precision.RowPaddedLinear):
the same results as the layer it replaces, row by row, and the same model outputs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from aiayn.decoding import source_batch
from aiayn.decoding.precision import ROW_MULTIPLE, RowPaddedLinear, convert, current, pad_product_rows
from aiayn.model import Transformer
from aiayn.special import BOS_ID

from helpers import MICRO


def layer(dtype: torch.dtype, bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(24, 40, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_padded_layer_computes_each_row_as_the_plain_layer(dtype, bias):
    plain = layer(dtype, bias)
    padded = RowPaddedLinear(plain.weight, plain.bias)
    assert padded.weight is plain.weight and padded.bias is plain.bias
    g = torch.Generator().manual_seed(1)
    for shape in [(1, 24), (3, 24), (ROW_MULTIPLE, 24), (ROW_MULTIPLE + 1, 24), (5, 1, 24), (2, 7, 24)]:
        x = torch.randn(*shape, generator=g).to(dtype)
        with torch.no_grad():
            got = padded(x)
            alone = torch.stack([plain(r) for r in x.reshape(-1, 24)]).reshape(*shape[:-1], 40)
            ref = F.linear(x.float(), plain.weight.float(),
                           None if plain.bias is None else plain.bias.float())
        assert got.shape == ref.shape and got.dtype == dtype
        # each row as the same layer computes it alone (bf16: up to the kernel's rounding)
        tol = dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.02, atol=0.02)
        torch.testing.assert_close(got, alone, **tol)
        torch.testing.assert_close(got.float(), ref, **tol)


def micro(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = replace(MICRO, vocab_size=40, n_layers=2, d_model=32, d_ff=64, n_heads=4, max_len_b=10,
                  **overrides)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "tgt_vocab_size": 30},
                                       {"tie_embeddings": False, "tie_output": False}])
def test_bf16_conversion_pads_every_product_and_keeps_the_outputs(overrides):
    plain = micro(**overrides).to(torch.bfloat16)
    model = convert(micro(**overrides), "bf16")  # on the CPU: padded
    assert current(model) == "bf16"
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert isinstance(model.out_proj, RowPaddedLinear)
    tied = overrides.get("tie_output", True)
    if tied:  # the projection reads the target embedding matrix itself, not a copy
        assert model.out_proj.weight is model.target_embedding.weight
    g = torch.Generator().manual_seed(5)
    src, mask = source_batch([torch.randint(4, 30, (n,), generator=g).tolist() for n in (3, 7, 5)])
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 30, (3, 6), generator=g)], 1)
    with torch.no_grad():
        ref = plain(src, tgt_in, mask).float().log_softmax(-1)
        full = model(src, tgt_in, mask).float().log_softmax(-1)
        cache = model.new_cache(model.encode(src, mask), mask)  # the cached path pads too
        steps = torch.stack([model.decode_step(tgt_in[:, t : t + 1], cache)
                             for t in range(tgt_in.size(1))], 1).float().log_softmax(-1)
    # bf16 products rounded at other shapes: equal up to bf16's rounding
    torch.testing.assert_close(full, ref, rtol=0, atol=0.05)
    torch.testing.assert_close(steps, ref, rtol=0, atol=0.05)


def test_padding_is_idempotent_and_leaves_fp32_alone():
    fp32 = convert(micro(), "fp32")
    assert any(isinstance(m, torch.nn.Linear) for m in fp32.modules())
    model = pad_product_rows(micro().to(torch.bfloat16))
    n = sum(isinstance(m, RowPaddedLinear) for m in model.modules())
    assert n == sum(isinstance(m, RowPaddedLinear) for m in pad_product_rows(model).modules())
