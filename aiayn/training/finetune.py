"""Fine-tuning defaults: what `aiayn train --init-from MODEL` changes in a new run's recipe, unless
the user gives the field (`--set`, `--config`) or the option (`--save-every`, `--save-minutes`).

A model's recipe is made to train from random weights: Eq. 3 (§5.3) rises over thousands of
updates to a peak that moves weights far. Started again from trained weights with a fresh
schedule, that rate first throws away part of what the model knew (the in-domain run reported
in docs/experiments/multi30k.md, "Fine-tuning with `train --init-from`'s defaults", lost BLEU at
the recipe's rate). So:

- `warmup_steps`: the model's, at most `WARMUP` (200, what the worked example of
  docs/guides/reuse.md used: reached after about 3 of its 5 minutes, 310 updates, on 2 CPU
  cores), and at most a tenth of `--max-steps` when that is given: a short run reaches its peak
  early and spends the rest decaying from it.
- `lr_scale`: whatever puts Eq. 3's peak at `PEAK_FRACTION` (one half) of the peak the model was
  trained with. The peak is lr_scale x d_model^-0.5 x warmup_steps^-0.5, so a shorter warmup
  alone would raise it (1,000 -> 200 updates: 2.2x); the scale makes up for that and halves it.
  For `translation-tiny-v2` (lr_scale 2, warmup 1,000) this gives 0.45 over 200 updates, near the
  0.5 the worked example used; for `base` (1.0, 4,000) 0.11. Chosen, not tuned: the measured
  gain on held-out in-domain data is pending (docs/experiments/multi30k.md).
- length: at most `MAX_EPOCHS` (10) passes over the new data unless `--max-epochs` or
  `--max-steps` says otherwise (a time budget still stops it sooner). Small data overfits fast
  from trained weights: the recipe's Multi30k model fine-tuned on 814 unseen pairs of its own
  domain for a 5-minute budget (1,000 updates, 200 epochs) fell from test sacreBLEU 39.76 to 27.94,
  after 20 epochs to 35.77, after 5 to 38.91 (docs/experiments/multi30k.md); 10 passes over
  Multi30k's 29,000 pairs is more than 14 minutes on 2 CPU cores, so a larger set is not held
  back by it in a short run.
- checkpoints: a time budget already saves `n_average` + 1 times when the paper's 10-minute
  interval would not fit (`TrainOptions.fit_saves_to_budget`); with a step or epoch limit and
  neither `--save-every` nor `--save-minutes`, every 1 / (n_average + 1) of its updates, so that
  `aiayn average` finds its `n_average` checkpoints.

The run records the fields it set (run.json, the trainer state) and a resumed run keeps them.
"""

from __future__ import annotations

import math
from typing import Any

WARMUP = 200  # updates, at most
PEAK_FRACTION = 0.5  # of the model's own peak rate
MAX_EPOCHS = 10  # passes over the new data, unless a step or epoch limit is given


def peak_rate(cfg: Any) -> float:
    """Eq. 3's maximum, at step = warmup_steps: lr_scale x d_model^-0.5 x warmup_steps^-0.5."""
    return cfg.lr_scale * cfg.d_model ** -0.5 * cfg.warmup_steps ** -0.5


def _two_digits(x: float) -> float:
    """`x` rounded to two significant digits (a value a person can read and type back)."""
    return round(x, 1 - math.floor(math.log10(abs(x)))) if x else x


def recipe_defaults(model: Any, run: Any, given: set[str] | frozenset[str],
                    max_steps: int | None) -> dict[str, Any]:
    """The config fields the fine-tuning defaults set over `run` (the run's config before them),
    leaving out those in `given`. `model` is the config the weights were trained with. Empty for
    a config without Eq. 3's fields (a task's own model)."""
    if not all(hasattr(c, f) for c in (model, run) for f in ("warmup_steps", "lr_scale", "d_model")):
        return {}
    out: dict[str, Any] = {}
    warmup = run.warmup_steps
    if "warmup_steps" not in given:
        warmup = min(model.warmup_steps, WARMUP)
        if max_steps is not None:
            warmup = min(warmup, max(1, max_steps // 10))
        out["warmup_steps"] = warmup
    if "lr_scale" not in given:
        # peak(run) = PEAK_FRACTION x peak(model), solved for lr_scale
        scale = PEAK_FRACTION * peak_rate(model) * run.d_model ** 0.5 * warmup ** 0.5
        out["lr_scale"] = _two_digits(scale)
    return out


def max_epochs(options: Any) -> int | None:
    """The epoch limit of a fine-tuning run: the one given, else `MAX_EPOCHS` unless a step
    limit is given (module doc)."""
    if options.max_epochs is not None or options.max_steps is not None:
        return options.max_epochs
    return MAX_EPOCHS


def save_every(options: Any, n_average: int, updates_per_epoch: int) -> int | None:
    """Updates between checkpoints for a fine-tuning run with a step limit (`--max-steps N`) or
    an epoch limit (N = epochs x `updates_per_epoch`) that named neither `--save-every` nor
    `--save-minutes` (None otherwise): N // (n_average + 1), at least 1."""
    total = options.max_steps
    if total is None and options.max_epochs is not None:
        total = options.max_epochs * updates_per_epoch
    if total is None or options.save_every is not None or not options.fit_saves_to_budget:
        return None
    return max(1, total // (max(n_average, 1) + 1))


def describe(fields: dict[str, Any], model: Any, run: Any, every: int | None,
             epochs: int | None = None) -> str:
    """The one line a run prints when the defaults applied: what, why, how to override."""
    parts = [f"{k}={v}" for k, v in fields.items()]
    if epochs is not None:
        parts.append(f"at most {epochs} epochs")
    if every is not None:
        parts.append(f"a checkpoint every {every} updates")
    why = ""
    if "lr_scale" in fields or "warmup_steps" in fields:
        why = (f" (Eq. 3 peaks at {peak_rate(run):.2g}, the model's own peak was "
               f"{peak_rate(model):.2g})")
    return (f"fine-tuning defaults (--init-from): {', '.join(parts)}{why}; override with --set "
            f"warmup_steps=N lr_scale=X, --max-epochs, --max-steps, --save-every or --save-minutes")
