"""Int8 weights for decoding on x86 CPUs (`aiayn translate --precision int8`): dynamic
quantization as CTranslate2's int8 does it on CPU (int8 weights, activations quantized per row at
run time, int32 sums), off by default (fp32 is the paper's arithmetic).

Why hand-written: PyTorch's ready-made dynamic quantization (`torch.ao.quantization.
quantize_dynamic`, `quantized::linear_dynamic`) takes one activation scale per tensor, so a
sentence's output would depend on the other sentences of its batch; and it does not quantize the
tied embedding / output projection. The layer below calls fbgemm's int8 GEMM directly with a
scale per row. (PyTorch marks its quantized tensor types deprecated; fbgemm's packing still takes
them in the torch this project pins, and tests/test_decoding_int8.py fails where it no longer does.)

Weights. Every linear layer's W (N, K) becomes int8 with one float32 scale per output row,
symmetric (W ~ Q diag(scale), Q in [-127, 127]), packed once, at conversion, into fbgemm's blocked
layout (`torch.ops.quantized.linear_prepack`). A product then streams a quarter of the fp32 bytes
and runs on integer multiply-adds; no fp32 copy of the weight is kept (the pre-softmax
projection's excepted, below).

Activations are quantized at each call, one scale per row (a row is one position of one
hypothesis): x_i / max|x_i| lies in [-1, 1] and is rounded to `levels` steps either side of zero
by fbgemm's fused quantize-and-pack, with fixed quantization parameters
(`quantized::linear_with_input_q_dq_qweight_dq_output_fp32`); the int32 sums come back as float32,
are multiplied by max|x_i| and the bias is added. One scale per row makes a row's result
independent of the other rows of its batch, so a sentence translates the same alone as in any
batch (which PyTorch's one scale per tensor, above, would not).

Why 63 levels, not 127, on most CPUs: fbgemm's AVX2 and plain AVX-512 kernels multiply uint8
activations by int8 weights with `vpmaddubsw`, which adds pairs of products in int16 and saturates
above 32767. With activations in [0, 127] (zero point 64) a pair stays below 2 * 127 * 127 = 32258,
exact; with [0, 255] it could overflow. CPUs with AVX512-VNNI accumulate in int32 (`vpdpbusd`),
and there 127 levels are exact (`activation_levels`).

Non-negative inputs. The feed-forward network's second product reads max(0, x W1 + b1) (§3.3,
Eq. 2), never below zero: there x / max|x| lies in [0, 1] and takes all 2 * levels + 1 unsigned
steps, zero point 0 (`Int8Linear(nonnegative=True)`), one bit more than a signed row gets. The
pair sums stay exact: 2 * 126 * 127 < 32767 on AVX2, 254 * 127 in int32 with VNNI.

The pre-softmax projection (§3.4) is the one product whose few largest outputs decide the
search: `Int8Projection` computes every logit in int8, then recomputes each row's `RESCORED`
largest in float32 from the unquantized matrix (the candidates the beam picks among). With the
ReLU rows' extra bit, that moves the model's most likely next token less often than int8
everywhere, about as often as bf16 does (`benchmarks/precision_fidelity.py`, measured in
docs/experiments/decoding.md). The embedding lookups stay
float32 (a tied model's read that same matrix): a lookup is a copy with no arithmetic to save,
and an int8 copy of the table would add its own error (float32 costs 3 bytes a weight more).

Two kernels, one arithmetic. fbgemm's fused op above quantizes the activations itself; oneDNN's
int8 matmul (`torch.ops.onednn.qlinear_pointwise`, the kernel of PyTorch's own x86 int8
inference, on AMX tiles where the CPU has them) takes activations quantized here by the same rule,
uint8 with the same zero point and step. Both sum the integer products exactly, so they differ
only in the float32 rounding of the scaling. oneDNN is the pre-softmax projection's kernel where
the CPU has AVX512-VNNI (`projection_kernel`): it costs more per call than fbgemm, which only
the projection's wide output (V columns) repays; on the narrow products of the layers (d_model
or d_ff columns) fbgemm was faster, and they stay on it (`tools/int8_kernels.py` times both
kernels on every call; measured in docs/experiments/decoding.md). On AVX2 alone the projection
stays on fbgemm, the kernel measured there. oneDNN's rows are padded to a multiple of
`ROW_MULTIPLE` above that many, as bf16's are, since it keeps a kernel for every row count it meets.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.decoding.common import ROW_MULTIPLE, row_topk
from aiayn.model.layers import FeedForward

WEIGHT_LEVELS = 127  # int8 weights: [-127, 127], symmetric


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def int8_supported() -> bool:
    """fbgemm's int8 kernels are built into this torch and the CPU runs them (AVX2 or newer)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def onednn_int8_supported() -> bool:
    """oneDNN's int8 matmul is built into this torch (`Int8Linear(kernel="onednn")`)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def projection_kernel(flags: frozenset[str]) -> str:
    """The pre-softmax projection's int8 kernel: oneDNN's where the CPU has AVX512-VNNI (and
    oneDNN is built in), else fbgemm's (module doc)."""
    return "onednn" if "avx512_vnni" in flags and onednn_int8_supported() else "fbgemm"


def activation_levels(flags: frozenset[str]) -> int:
    """Quantization steps either side of zero for activations: 127 where fbgemm accumulates in
    int32 (AVX512-VNNI), else 63 so that AVX2's int16 pair sums cannot saturate (module doc)."""
    return 127 if "avx512_vnni" in flags else 63


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 per row: w (N, K) ~ q * scale[:, None], q int8 in [-127, 127], scale
    float32 (N,). A row of zeros gets scale 1 (and q = 0)."""
    w = w.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / WEIGHT_LEVELS, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS).to(torch.int8)
    return q, scale


def _pack(q: Tensor, scale: Tensor):
    """fbgemm's packed form of an int8 (N, K) weight with per-row scales. The quantized engine
    is fbgemm for the packing (the product below is fbgemm's), then back to what it was."""
    with warnings.catch_warnings():
        # PyTorch marks its quantized tensor types deprecated; they are still how fbgemm's packed
        # weights are made, and the warning would reach every `aiayn translate --precision int8`
        warnings.filterwarnings("ignore", message=".*quantized tensor creation",
                                category=UserWarning)
        qw = torch._make_per_channel_quantized_tensor(
            q, scale.double(), torch.zeros(q.size(0), dtype=torch.long), 0)
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        return torch.ops.quantized.linear_prepack(qw, None)
    finally:
        torch.backends.quantized.engine = engine


def row_absmax(x: Tensor) -> Tensor:
    """max |x| over the last dimension, keepdim, at least the smallest normal float32 (a row of
    zeros then stays zeros instead of becoming NaN): (..., K) -> (..., 1).

    `abs` then `amax`, not `torch.linalg.vector_norm(x, inf)`, the same value: on CPU the norm
    takes several times as long, a noticeable share of an int8 beam search (measured in
    docs/experiments/decoding.md)."""
    s = x.abs().amax(dim=-1, keepdim=True)
    return s.clamp_(min=torch.finfo(torch.float32).tiny)


KERNELS = ("fbgemm", "onednn")


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 per output row and x quantized per row (module doc).
    x: (..., K) float32 -> (..., N) float32. The bias stays float32. `nonnegative`: the caller
    guarantees x >= 0 (a ReLU's output), which then gets twice the steps (module doc). `kernel`:
    fbgemm's fused op or oneDNN's matmul, the same integer sums (module doc)."""

    def __init__(self, q: Tensor, scale: Tensor, bias: Tensor | None, levels: int,
                 nonnegative: bool = False, kernel: str = "fbgemm"):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"int8 kernel must be one of {KERNELS}, got {kernel!r}")
        self.in_features, self.out_features = q.size(1), q.size(0)
        self.levels = levels
        self.nonnegative = nonnegative
        self.kernel = kernel
        if nonnegative:  # x / s in [0, 1] onto [0, 2 * levels]
            self._step, self._zero = 1.0 / (2 * levels), 0
        else:  # x / s in [-1, 1] onto [1, 2 * levels + 1]
            self._step, self._zero = 1.0 / levels, levels + 1
        if kernel == "fbgemm":
            self._packed = _pack(q, scale)
        else:
            self._packed = torch.ops.onednn.qlinear_prepack(q, None)
            self._w_scale = scale.float()
            self._w_zero = torch.zeros(q.size(0), dtype=torch.long)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, levels: int, nonnegative: bool = False,
                    kernel: str = "fbgemm") -> "Int8Linear":
        q, scale = quantize_rows(linear.weight)
        return cls(q, scale, linear.bias, levels, nonnegative, kernel)

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        s = row_absmax(x)  # (..., 1)
        if self.kernel == "fbgemm":
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
                x / s, self._step, self._zero, self._packed)  # (..., N)
        else:  # quantized as fbgemm does it: round half to even, saturate to uint8
            u = torch.div(x, s).mul_(1.0 / self._step).round_().add_(self._zero)
            u = u.clamp_(0, 255).to(torch.uint8).reshape(-1, self.in_features)  # (M, K)
            rows = u.size(0)
            # oneDNN keeps a kernel for every row count it meets, as for bf16: above
            # `ROW_MULTIPLE` rows, padded to a multiple of it (rows of their own, cut off
            # below); a few rows (a lone sentence's beams) would pay more for padding
            if rows > ROW_MULTIPLE:
                u = F.pad(u, (0, 0, 0, -rows % ROW_MULTIPLE), value=self._zero)
            y = torch.ops.onednn.qlinear_pointwise(
                u, self._step, self._zero, self._packed, self._w_scale, self._w_zero, None,
                1.0, 0, torch.float32, "none", [], "")[:rows]  # (M, N)
            y = y.view(*x.shape[:-1], self.out_features)
        if self.bias is None:
            return y.mul_(s)
        return torch.addcmul(self.bias, y, s, out=y)  # y * s + b in one pass over y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, activation levels={self.levels}, "
                f"nonnegative={self.nonnegative}, kernel={self.kernel}")


# Each row's logits recomputed in float32 by `Int8Projection`: a beam of k takes each step's
# candidates from every row's 2k best tokens (aiayn/decoding/beam.py), 8 for the paper's k = 4;
# greedy search reads the first.
RESCORED = 8


class Int8Projection(nn.Module):
    """The pre-softmax projection (§3.4) for int8 decoding, logits = y W^T without bias: every
    logit from the int8 product (`Int8Linear`), then each row's `top` largest recomputed in
    float32 from `weight` (module doc). y: (..., d_model) -> (..., V) float32. Rows do not mix:
    a row's logits are the same in any batch.

    `weight` (V, d_model) is kept as given, not copied: in a tied model (§3.4) the embedding
    matrix, which the lookups keep reading in float32. `kernel`: the int8 product's
    (`projection_kernel`)."""

    def __init__(self, weight: Tensor, levels: int, top: int = RESCORED, kernel: str = "fbgemm"):
        super().__init__()
        self.int8 = Int8Linear(*quantize_rows(weight), None, levels, kernel=kernel)
        self.weight = weight  # shared with a tied embedding, so not registered here
        self.top = min(top, weight.size(0))

    def forward(self, y: Tensor) -> Tensor:
        z = self.int8(y)  # (..., V)
        flat = z.view(-1, z.size(-1))  # (N, V)
        x = y.reshape(-1, y.size(-1)).float()  # (N, d)
        _, cols = row_topk(flat, self.top)  # (N, top)
        exact = torch.bmm(self.weight[cols], x.unsqueeze(-1)).squeeze(-1)  # (N, top)
        flat.scatter_(1, cols, exact)
        return z

    def extra_repr(self) -> str:
        return f"vocabulary={self.weight.size(0)}, rescored={self.top}"


def replace_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> None:
    """Every `nn.Linear` under `module` replaced by `make(linear)`, in place: int8 quantization
    here, and bf16 decoding's row padding (aiayn/decoding/precision.py)."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, make(child))
        else:
            replace_linears(child, make)


def quantize_model(model: nn.Module, levels: int, projection: str = "fbgemm") -> nn.Module:
    """Convert a `Transformer` for int8 decoding, in place, and return it: every linear layer
    becomes an `Int8Linear` (the feed-forward network's second one `nonnegative`) and the
    pre-softmax projection an `Int8Projection` on the kernel `projection` (`projection_kernel`
    picks it for a CPU); the embedding lookups, LayerNorm and learned
    positions stay float32. The float32 weights of the replaced layers are released (unless
    referenced elsewhere). The result decodes only (no training, no state_dict round trip)."""
    model.eval()
    untied = model.out_proj  # an nn.Linear when the projection has its own matrix, else None
    weight = model.target_embedding.weight if untied is None else untied.weight
    model.out_proj = Int8Projection(weight.detach(), levels, kernel=projection)
    for ffn in model.modules():
        if isinstance(ffn, FeedForward):  # w2 reads ReLU's output (§3.3, Eq. 2)
            ffn.w2 = Int8Linear.from_linear(ffn.w2, levels, nonnegative=True)
    replace_linears(model, lambda linear: Int8Linear.from_linear(linear, levels))
    model.decode_precision = "int8"
    return model
