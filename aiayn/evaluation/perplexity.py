"""Reference perplexity: how well a model predicts the reference translations (teacher forcing).

The paper's Table 3 reports per-wordpiece perplexity on the development set; this is that number
for any model mapping `(src, tgt_in) -> logits (B, T, V)`: exp of the mean negative
log-likelihood of the target tokens, padding excluded. It is per subword token, so it is only
comparable between models that share a vocabulary. The one dev-loss computation of the project:
`aiayn evaluate --model` and the trainer's dev evaluation both call `reference_perplexity`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any, Callable

import torch

from aiayn.special import PAD_ID
from aiayn.training.loss import label_smoothed_loss


def _device_of(model: Any):
    """The device of the model's first parameter, or None for parameter-free callables."""
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    p = next(iter(params()), None)
    return None if p is None else p.device


def reference_perplexity(model: Any, batches: Iterable[Any], pad_id: int = PAD_ID, eps_ls: float = 0.0,
                         autocast: Callable[[], Any] = nullcontext,
                         forward: Callable[[Any], Any] | None = None) -> dict[str, float]:
    """Perplexity of `batch.tgt_out` under `model(batch.src, batch.tgt_in)`.

    Shapes: src (B, S), tgt_in (B, T), tgt_out (B, T), all int64, padded with `pad_id`; logits
    (B, T, V). Returns `{"nll_per_token", "ppl", "n_tokens", "smoothed_per_token"}` (natural log;
    the last is the label-smoothed training objective with `eps_ls`, §5.4). The model runs in eval
    mode (no dropout) without gradients under `autocast()`, and its previous mode is restored
    afterwards. `forward(batch) -> logits` replaces `model(batch.src, batch.tgt_in)` for models
    with another calling convention (benchmarks score other systems this way); the batch is then
    passed as it is. Raises ValueError when the batches hold no target token.
    """
    device = _device_of(model)
    was_training = getattr(model, "training", None)
    if was_training:
        model.eval()
    total_nll = total_smoothed = 0.0  # Python floats (double): long corpora lose no precision
    n_tokens = 0
    try:
        with torch.no_grad():
            for batch in batches:
                src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
                if device is not None and forward is None:
                    src, tgt_in, tgt_out = (t.to(device) for t in (src, tgt_in, tgt_out))
                with autocast():
                    logits = model(src, tgt_in) if forward is None else forward(batch)  # (B, T, V)
                sums = label_smoothed_loss(logits, tgt_out, eps_ls, pad_id)  # float32 inside
                total_nll += float(sums.nll)
                total_smoothed += float(sums.smoothed)
                n_tokens += int(sums.n_tokens)
    finally:
        if was_training:
            model.train()
    if n_tokens == 0:
        raise ValueError("no target tokens to score (every batch is empty or all padding)")
    mean = total_nll / n_tokens
    ppl = math.exp(mean) if mean < 700 else math.inf  # an untrained model can overflow exp
    return {"nll_per_token": mean, "ppl": ppl, "n_tokens": n_tokens,
            "smoothed_per_token": total_smoothed / n_tokens}
