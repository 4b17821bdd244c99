"""The optimizer and its learning-rate schedule (§5.3).

Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9, and (Eq. 3)

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

a linear rise over the first warmup_steps updates, then decay with the inverse square root of the
step; the two branches meet at step = warmup_steps, the peak d_model^-0.5 * warmup_steps^-0.5.
`step` counts optimizer updates from 1. `Config.lr_scale` multiplies the whole curve (1.0 is the
paper). The trainer sets each update's rate itself (`set_lr`) from its own step counter, which is
saved in the trainer state, so there is no scheduler object whose state could drift.

`Config.lr_cooldown` (not in the paper, off by default) multiplies Eq. 3 by `cooldown_factor`,
which falls linearly from 1 to 0 over the last fraction of the run. The trainer measures how far
the run is (`progress`, 0 at the start, 1 at the end) in updates against max_steps, or in minutes
against the time budget, whichever is further along.
"""

from __future__ import annotations

import torch

from aiayn.config import Config


def learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Eq. 3 at update `step` (>= 1), times `scale`."""
    if step < 1:
        raise ValueError(f"the schedule counts updates from 1, got step {step}")
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def lr_at(cfg: Config, step: int) -> float:
    """Eq. 3 with the config's d_model, warmup_steps and lr_scale."""
    return learning_rate(step, cfg.d_model, cfg.warmup_steps, cfg.lr_scale)


def cooldown_factor(progress: float, fraction: float) -> float:
    """The multiplier on Eq. 3 at `progress` (share of the run done before this update, >= 0):
    1 until 1 - `fraction`, then linear down to 0 at progress 1; always 1 when `fraction` is 0."""
    if progress < 0:
        raise ValueError(f"progress must be >= 0, got {progress}")
    if fraction <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / fraction))


def peak_learning_rate(cfg: Config) -> float:
    """The schedule's maximum, reached at step = warmup_steps."""
    return lr_at(cfg, cfg.warmup_steps)


def build_optimizer(params, cfg: Config) -> torch.optim.Adam:
    """Adam(beta1, beta2, eps) of §5.3 over `params`; the rate is set per update by `set_lr`.

    PyTorch's fused kernel (one pass over each parameter, its gradient and moments) where it has
    one, CPU and CUDA: on CPU torch otherwise runs Adam as ~6 separate passes per parameter, 2.6x
    the time for the base model's 48M parameters here (76 against 29 ms per step,
    benchmarks/profile_step.py --parts)."""
    params = list(params)
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point
                                 for p in params)
    return torch.optim.Adam(params, lr=lr_at(cfg, 1), betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, fused=fused or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
