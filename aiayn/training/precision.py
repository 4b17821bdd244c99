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
from aiayn.precision import auto_precision
from aiayn.training import PRECISIONS


def resolve(precision: str, device: torch.device) -> str:
    """"auto" means what it means for every command (`aiayn.precision.auto_precision`): bf16
    autocast where the device multiplies bf16 natively, else fp32. The paper trained in fp32;
    bf16 autocast keeps fp32 weights, optimizer state, softmax and loss, so only products run
    at lower precision."""
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision}: training runs in {', '.join(PRECISIONS)}")
    if precision == "auto":
        return auto_precision(device)
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
