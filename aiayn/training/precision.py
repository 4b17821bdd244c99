"""Numeric precision of training: fp32 (the paper's), bf16 autocast (CPU and GPU), or fp16 autocast
with dynamic loss scaling (GPU only).

Under bf16 autocast the parameters, optimizer state, LayerNorm, softmax and the loss stay float32;
only the matrix products run in bf16, on copies of the weights and activations made at each use.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from aiayn.errors import UserError
from aiayn.training import PRECISIONS


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matrix products several times faster than fp32 (2.5x with
    AVX512-BF16, about 10x with AMX, measured); without them bf16 is emulated and slower."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve(precision: str, device: torch.device) -> str:
    """"auto" is bf16 autocast on a GPU that supports it (else fp16), and on a CPU with native
    bf16 instructions (else fp32). The paper trained in fp32; bf16 autocast keeps fp32 weights,
    optimizer state, softmax and loss, so only products run at lower precision."""
    if precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    if precision == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if cpu_has_native_bf16() else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise UserError("--precision fp16 needs a CUDA device (loss scaling); use bf16 or fp32 on CPU")
    return precision


@dataclass
class Precision:
    """Autocast context and (fp16 only) a GradScaler, for `device`."""

    name: str
    device: torch.device

    def __post_init__(self) -> None:
        self.name = resolve(self.name, self.device)
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]
        self.scaler = torch.amp.GradScaler("cuda") if self.name == "fp16" else None

    def autocast(self):
        """The context a forward pass runs in, in training and in evaluation."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
