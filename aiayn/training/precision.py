"""Numeric precision of training: fp32, bf16 autocast (CPU and GPU), fp16 autocast with dynamic
loss scaling (GPU only), or bf16 weights with float32 master weights. The paper trained in fp32.

- "bf16" (autocast): parameters, optimizer state, LayerNorm, softmax and the loss stay float32;
  only the matrix products run in bf16, on copies of the weights and activations made at each use.
- "bf16-weights" (an option, not the default): a bf16 working copy of the model runs the forward
  and backward passes, so activations, LayerNorm and the residual stream are bf16 too and nothing
  is re-cast; the float32 master weights and Adam state live in the original model (mixed precision
  with master weights, Micikevicius et al. 2018). Each micro-batch's bf16 gradients are added into
  float32 master gradients; after the optimizer step the working copy is refreshed from the master.
  Checkpoints hold the float32 master weights, as in every other mode. The loss is still computed
  in float32 from bf16 logits. Under torchrun, DDP all-reduces the working copy's bf16 gradients,
  summed over the rank's micro-batches in bf16.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field

import torch
from torch import nn

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


class WorkingCopy:
    """A bf16 copy of `master` that runs forward and backward ("bf16-weights" precision).

    Parameters shared in the master (tied embeddings, §3.4) stay shared in the copy. Buffers are
    cast too; the positional table is cast at use in either case.
    """

    def __init__(self, master: nn.Module, dtype: torch.dtype = torch.bfloat16):
        self.master = master
        self.model = copy.deepcopy(master).to(dtype)
        self.pairs = [(m, w) for m, w in zip(master.parameters(), self.model.parameters())
                      if m.requires_grad]
        for _, w in self.pairs:
            w.requires_grad_(True)

    def grads_to_master(self) -> None:
        """Add the copy's gradients (of one micro-batch) into float32 master gradients and clear
        them, so accumulation over micro-batches happens in float32."""
        for m, w in self.pairs:
            if w.grad is None:
                continue
            if m.grad is None:
                m.grad = w.grad.float()
            else:
                m.grad.add_(w.grad)
            w.grad = None

    @torch.no_grad()
    def refresh(self) -> None:
        """Round the master weights into the copy, after each optimizer step."""
        for m, w in self.pairs:
            w.copy_(m)


@dataclass
class Precision:
    """Autocast context, (fp16 only) a GradScaler and (bf16-weights only) the working copy, for
    `device`."""

    name: str
    device: torch.device
    working: WorkingCopy | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.name = resolve(self.name, self.device)
        self.dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16,
                      "bf16-weights": torch.bfloat16}[self.name]
        self.scaler = torch.amp.GradScaler("cuda") if self.name == "fp16" else None

    def autocast(self):
        """For running the (float32) master model: evaluation, and training steps unless a working
        copy does them."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def training_model(self, model: nn.Module) -> nn.Module:
        """The module the training step runs: `model`, or for bf16-weights its working copy
        (made here, from `model`'s current weights)."""
        if self.name != "bf16-weights":
            return model
        self.working = WorkingCopy(model, self.dtype)
        return self.working.model

    def step_autocast(self):
        """Autocast for the training step: none when a bf16 working copy runs it."""
        return contextlib.nullcontext() if self.working is not None else self.autocast()

    def after_backward(self) -> None:
        if self.working is not None:
            self.working.grads_to_master()

    def after_step(self) -> None:
        if self.working is not None:
            self.working.refresh()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
