"""Reference perplexity: how well a model predicts the reference translations (teacher forcing).

The paper's Table 3 reports per-wordpiece perplexity on the development set; this is that number
for any model mapping `(src, tgt_in) -> logits (B, T, V)`: exp of the mean negative
log-likelihood of the target tokens, padding excluded. It is per subword token, so it is only
comparable between models that share a vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def _device_of(model: Any):
    """The device of the model's first parameter, or None for parameter-free callables."""
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    p = next(iter(params()), None)
    return None if p is None else p.device


def reference_perplexity(model: Any, batches: Iterable[Any], pad_id: int = 0) -> dict[str, float]:
    """Perplexity of `batch.tgt_out` under `model(batch.src, batch.tgt_in)`.

    Shapes: src (B, S), tgt_in (B, T), tgt_out (B, T), all int64, padded with `pad_id`; logits
    (B, T, V). Returns `{"nll_per_token", "ppl", "n_tokens"}` (natural log). The model runs in
    eval mode (no dropout) without gradients, and its previous mode is restored afterwards.
    Raises ValueError when the batches hold no target token.
    """
    import torch
    import torch.nn.functional as F

    device = _device_of(model)
    was_training = getattr(model, "training", None)
    if was_training:
        model.eval()
    total_nll = 0.0  # a Python float (double) so long corpora do not lose precision
    n_tokens = 0
    try:
        with torch.no_grad():
            for batch in batches:
                src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
                if device is not None:
                    src, tgt_in, tgt_out = (t.to(device) for t in (src, tgt_in, tgt_out))
                logits = model(src, tgt_in)  # (B, T, V)
                nll = F.cross_entropy(
                    logits.flatten(0, 1).float(),  # (B*T, V); float32 even under half precision
                    tgt_out.flatten(),  # (B*T,)
                    ignore_index=pad_id,
                    reduction="sum",
                )
                total_nll += nll.item()
                n_tokens += int((tgt_out != pad_id).sum().item())
    finally:
        if was_training:
            model.train()
    if n_tokens == 0:
        raise ValueError("no target tokens to score (every batch is empty or all padding)")
    mean = total_nll / n_tokens
    ppl = math.exp(mean) if mean < 700 else math.inf  # an untrained model can overflow exp
    return {"nll_per_token": mean, "ppl": ppl, "n_tokens": n_tokens}
