"""The arithmetic decoding runs in (`aiayn translate --precision`, `Translator(precision=...)`).

- fp32: the model as trained, the paper's arithmetic.
- bf16: the weights cast to bfloat16 once (on a CPU each product's rows padded to a multiple of
  32: `RowPaddedLinear`); log-softmax and beam scores stay float32. Fast only where the CPU
  multiplies bf16 natively (AVX512-BF16, AMX) or on a GPU; emulated, and slow, on an AVX2-only
  CPU.
- int8: int8 weights and per-row int8 activations in every linear layer and the pre-softmax
  projection, as CTranslate2's int8 on CPU, plus two refinements (`aiayn.decoding.int8`): a ReLU's
  output gets twice the steps and each row's best logits are recomputed in float32; x86 CPUs
  with AVX2 or newer, the Transformer only (the RNN baseline is refused). Not the paper's
  arithmetic, so never the default: outputs may differ from fp32's where two hypotheses score
  within the quantization error (tests/test_decoding_int8.py states the tolerance).
- auto (the default of every command and of `Translator`): `aiayn.precision.auto_precision`:
  bf16 on a GPU or a CPU with native bf16 (AMX, AVX512-BF16), faster than fp32 in the peer
  harness and end to end on every such kind measured; else fp32. int8 is never auto's choice:
  not the paper's arithmetic, and on an AVX2-only CPU faster than fp32 in the harness's small
  batches but not end to end, where the default room's ~1,200 beams run fp32's products near
  the machine's peak (docs/guides/decoding.md, "--precision auto", has the measurements).

Conversion is in place: a model converted once (to bf16 or int8) serves every `Translator` built
on it afterwards, and cannot go back to fp32 (load it again).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.decoding import DECODE_PRECISIONS
from aiayn.decoding.common import ROW_MULTIPLE, model_device
from aiayn.decoding.int8 import (
    activation_levels,
    cpu_flags,
    int8_supported,
    projection_kernel,
    quantize_model,
    replace_linears,
)
from aiayn.model.transformer import Transformer
from aiayn.precision import auto_precision


def resolve(precision: str, device: torch.device | str) -> str:
    """`precision` checked for `device` ("auto" chosen for it): ValueError (one line) for an
    unknown name or for int8 where fbgemm's int8 kernels cannot run."""
    device = torch.device(device)
    if precision not in DECODE_PRECISIONS:
        raise ValueError(f"unknown decoding precision {precision!r}; decoding runs in "
                         f"{', '.join(DECODE_PRECISIONS)}")
    if precision == "auto":
        return auto_precision(device)
    if precision == "int8":
        if device.type != "cpu":
            raise ValueError(f"int8 decoding runs on x86 CPUs only, not {device.type}; "
                             "use precision bf16 or fp32 there")
        if not int8_supported():
            raise ValueError("int8 decoding needs an x86 CPU with AVX2 and a torch built with "
                             "fbgemm; use precision fp32")
    return precision


def current(model: Any) -> str:
    """The precision a model was converted to: "int8", "bf16", or "fp32" (as loaded)."""
    explicit = getattr(model, "decode_precision", None)
    if explicit is not None:
        return explicit
    p = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return "bf16" if p is not None and p.dtype == torch.bfloat16 else "fp32"


def convert(model: Any, precision: str) -> Any:
    """The model in `precision` (fp32, bf16 or int8), converted in place when needed;
    ValueError when it was converted to another precision already, or int8 for a model other
    than the Transformer (the RNN baseline's LSTMs have no int8 path here). An ensemble's
    members are converted one by one."""
    from aiayn.decoding.ensemble import Ensemble

    if isinstance(model, Ensemble):
        return Ensemble([convert(m, precision) for m in model.members])
    have = current(model)
    if have == precision:
        return model
    if have != "fp32":
        raise ValueError(f"this model was converted for {have} decoding; load it again to "
                         f"decode in {precision}")
    if precision == "bf16":
        # Cast once, in place (half the memory, no per-step casts); log-softmax and scores stay
        # float32 in the search.
        model = model.to(torch.bfloat16)
        if model_device(model).type == "cpu":
            pad_product_rows(model)
        return model
    if precision == "int8":
        if not isinstance(model, Transformer):
            arch = getattr(getattr(model, "cfg", None), "arch", type(model).__name__)
            raise ValueError(f"int8 decoding supports the Transformer only, not arch {arch!r}; "
                             "use precision fp32")
        flags = cpu_flags()
        return quantize_model(model, activation_levels(flags), projection_kernel(flags))
    return model


class RowPaddedLinear(nn.Module):
    """A linear layer (y = x W^T + b, the same parameters) whose input rows are padded with zeros
    to a multiple of `ROW_MULTIPLE` for the product and cut off after it: fewer distinct product
    shapes for oneDNN's bf16 kernels (above). Each row's result is computed as without padding,
    the same arithmetic on the same row; rows do not mix."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None):
        super().__init__()
        self.weight, self.bias = weight, bias  # shared with the layer it replaces

    def forward(self, x: Tensor) -> Tensor:
        d_in = x.size(-1)
        rows = x.numel() // d_in
        extra = -rows % ROW_MULTIPLE
        if not extra:
            return F.linear(x, self.weight, self.bias)
        flat = F.pad(x.reshape(rows, d_in), (0, 0, 0, extra))  # (rows + extra, d_in)
        y = F.linear(flat, self.weight, self.bias)[:rows]  # (rows, d_out)
        return y.reshape(*x.shape[:-1], y.size(-1))  # (..., d_out)


def pad_product_rows(model: nn.Module) -> nn.Module:
    """Make every linear layer of `model` a `RowPaddedLinear`, in place, and the Transformer's
    tied pre-softmax projection (§3.4) one too, reading the target embedding matrix as before.
    For decoding only (the module tree changes; the parameters are the same objects)."""
    replace_linears(model, lambda linear: RowPaddedLinear(linear.weight, linear.bias))
    if isinstance(model, Transformer) and model.out_proj is None:
        model.out_proj = RowPaddedLinear(model.target_embedding.weight, None)
    return model
