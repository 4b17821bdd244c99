"""One optimizer update (§5): gradient accumulation over micro-batches, data-parallel all-reduce,
normalisation by target tokens, optional clipping, and skipping of non-finite updates.

Normalisation: the objective of an update is the label-smoothed loss summed over every target
token of the whole batch (all micro-batches on all ranks) divided by that batch's number of target
tokens. Each micro-batch's summed loss is therefore scaled by world_size / total_tokens before its
backward pass: DDP averages gradients over ranks (a division by world_size), so the accumulated
gradient is exactly d(sum of losses) / total_tokens, whatever the split into micro-batches and ranks.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import torch
from torch import nn

from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.special import PAD_ID
from aiayn.training.distributed import DistEnv, all_reduce
from aiayn.training.loss import LossSums
from aiayn.training.precision import Precision
from aiayn.training.schedule import lr_at, set_lr
from aiayn.training.seq2seq import seq2seq_loss


@dataclass
class UpdateResult:
    """What happened in one update; loss figures are per target token over all ranks."""

    loss: float  # label-smoothed loss per target token
    nll: float  # plain NLL per target token (log of the training perplexity)
    tgt_tokens: int  # target tokens in the update, all ranks
    src_tokens: int
    grad_norm: float  # before clipping
    lr: float
    applied: bool  # False: the update was skipped
    reason: str = ""  # why it was skipped: "non-finite loss", "non-finite gradients", "fp16 overflow"


def batch_tokens(batch: Any) -> tuple[int, int]:
    """(source, target) non-padding tokens of a collated batch."""
    n_tgt = getattr(batch, "n_tgt_tokens", None)
    n_src = getattr(batch, "n_src_tokens", None)
    if n_tgt is None:
        n_tgt = (batch.tgt_out != PAD_ID).sum()
    if n_src is None:
        n_src = (batch.src != PAD_ID).sum()
    return int(n_src), int(n_tgt)


def grad_norm(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """Global L2 norm of the gradients (a 0-dim tensor)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


def clip_to_norm(params: Sequence[nn.Parameter], max_norm: float, total: torch.Tensor) -> None:
    """Scale gradients so their global norm is at most `max_norm` (no-op when already below)."""
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)


def compile_layers(model: nn.Module, kinds: tuple[type, ...]) -> int:
    """torch.compile, in place and with dynamic shapes, every submodule of `model` that is one of
    `kinds` (regional compilation: modules of one class share one compiled graph). Returns how
    many were compiled."""
    layers = [m for m in model.modules() if isinstance(m, kinds)]
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def compile_for_training(model: nn.Module) -> nn.Module:
    """`aiayn train --compile`: torch.compile each encoder and decoder layer in place
    (`compile_layers`) where the model has them, else the whole model. The layers of a stack share
    one class and so one compiled graph: the compiler traces one encoder and one decoder layer
    instead of the whole unrolled model, and reaches its first step sooner
    (`benchmarks/train_systems.py --config tiny --compile`; docs/experiments/wmt.md). dynamic: batches change
    shape every step, so one graph with symbolic (B, T) instead of a recompile per shape. In
    place, so parameter names and checkpoints are unchanged; evaluation runs the same compiled
    layers. Returns the module the update should call."""
    if compile_layers(model, (EncoderLayer, DecoderLayer)) == 0:
        return torch.compile(model, dynamic=True)
    return model


class Updater:
    """Runs updates of `model` (compiled or not, or DDP around it) with `optimizer`. `loss(model,
    micro_batch) -> LossSums` is the task's (aiayn/training/task.py); by default the label-smoothed
    loss (§5.4) of a sequence-to-sequence model on a `Batch` of aiayn.data.batching."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Any,
                 precision: Precision, env: DistEnv,
                 loss: Callable[[nn.Module, Any], LossSums] | None = None):
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.precision, self.env = precision, env
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        self.loss = loss or partial(seq2seq_loss, cfg=cfg, autocast=precision.autocast)

    def update(self, micro_batches: Sequence[Any], step: int, lr_factor: float = 1.0) -> UpdateResult:
        """Forward/backward every micro-batch of this rank, then one optimizer step at schedule
        step `step` (>= 1), at Eq. 3's rate times `lr_factor` (the cooldown's), unless the loss or
        the gradients are not finite. Every rank must call this with the same number of
        micro-batches (>= 1) and the same `lr_factor`."""
        env, prec = self.env, self.precision
        counts = [batch_tokens(b) for b in micro_batches]  # host integers: no read from the device
        n_src, n_tgt = sum(c[0] for c in counts), sum(c[1] for c in counts)
        if env.distributed:  # the whole update's counts, over every rank
            totals = torch.tensor([n_src, n_tgt], dtype=torch.float64, device=env.device)
            all_reduce(totals, env)
            n_src, n_tgt = (int(x) for x in totals.tolist())
        scale = env.world_size / max(n_tgt, 1)

        self.model.train()
        sums = torch.zeros(2, dtype=torch.float64, device=env.device)  # smoothed, nll on this rank
        for i, b in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            sync = contextlib.nullcontext() if (last or not self.is_ddp) else self.model.no_sync()
            with sync:
                out = self.loss(self.model, b)
                loss = out.smoothed * scale
                if prec.scaler is not None:
                    loss = prec.scaler.scale(loss)
                loss.backward()
            sums += torch.stack([out.smoothed.detach(), out.nll.detach()]).double()
        all_reduce(sums, env)
        if prec.scaler is not None:
            prec.scaler.unscale_(self.optimizer)
        norm = grad_norm(self.params)
        # the update's one read from the device (each read waits for every kernel queued before it)
        loss_tok, nll_tok, norm_f = torch.cat([sums / max(n_tgt, 1),
                                               norm.detach().double().reshape(1).to(sums.device)]).tolist()
        lr = lr_at(self.cfg, step) * lr_factor
        reason = ""
        if not math.isfinite(loss_tok):
            reason = "non-finite loss"
        elif not math.isfinite(norm_f):
            reason = "fp16 overflow" if prec.scaler is not None else "non-finite gradients"
        if reason:
            if prec.scaler is not None:
                prec.scaler.update()  # records the overflow: the loss scale shrinks
            self.optimizer.zero_grad(set_to_none=True)
            return UpdateResult(loss_tok, nll_tok, n_tgt, n_src, norm_f, lr, False, reason)

        if self.cfg.clip_norm > 0:
            clip_to_norm(self.params, self.cfg.clip_norm, norm)
        set_lr(self.optimizer, lr)  # Eq. 3
        if prec.scaler is not None:
            prec.scaler.step(self.optimizer)
            prec.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return UpdateResult(loss_tok, nll_tok, n_tgt, n_src, norm_f, lr, True)
