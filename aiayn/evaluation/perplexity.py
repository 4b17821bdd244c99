"""Reference perplexity: how well a model predicts the reference translations (teacher forcing).

The paper's Table 3 reports per-wordpiece perplexity on the development set; this is that number
for any model mapping `(src, tgt_in) -> logits (B, T, V)`: exp of the mean negative
log-likelihood of the target tokens, padding excluded. It is per subword token, so it is only
comparable between models that share a vocabulary. The one teacher-forced scoring of the project:
`aiayn evaluate --model` and the trainer's dev evaluation call `reference_perplexity`, `aiayn
score` writes `sentence_scores`, the per-sentence figures it sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from aiayn.data.batching import collate, length_batches
from aiayn.kernels.loss import token_losses
from aiayn.special import PAD_ID


def _device_of(model: Any):
    """The device of the model's first parameter, or None for parameter-free callables."""
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    p = next(iter(params()), None)
    return None if p is None else p.device


@dataclass
class SentenceScores:
    """Teacher-forced figures of a batch's rows, in the batch's order: the reference's summed
    NLL (natural log, -log p(reference | source)), its summed label-smoothed loss, and its target
    tokens (EOS included, padding not)."""

    nll: list[float]
    smoothed: list[float]
    tokens: list[int]


def sentence_scores(model: Any, batches: Iterable[Any], pad_id: int = PAD_ID, eps_ls: float = 0.0,
                    autocast: Callable[[], Any] = nullcontext,
                    forward: Callable[[Any], Any] | None = None) -> Iterator[SentenceScores]:
    """Per batch, the `SentenceScores` of `batch.tgt_out` under `model(batch.src, batch.tgt_in)`:
    what `aiayn score` writes per pair, and what `reference_perplexity` sums (one computation).

    Shapes: src (B, S), tgt_in (B, T), tgt_out (B, T), all int64, padded with `pad_id`; logits
    (B, T, V). The model runs in eval mode (no dropout) without gradients under `autocast()`,
    and its previous mode is restored afterwards. `forward(batch) -> logits` replaces
    `model(batch.src, batch.tgt_in)` for models with another calling convention (benchmarks score
    other systems this way); the batch is then passed as it is."""
    device = _device_of(model)
    was_training = getattr(model, "training", None)
    if was_training:
        model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
                if device is not None and forward is None:
                    src, tgt_in, tgt_out = (t.to(device) for t in (src, tgt_in, tgt_out))
                with autocast():
                    logits = model(src, tgt_in) if forward is None else forward(batch)  # (B, T, V)
                smoothed, nll = token_losses(logits, tgt_out, eps_ls, pad_id)  # (B, T) float32
                rows = torch.stack([nll.double().sum(1), smoothed.double().sum(1),
                                    (tgt_out != pad_id).sum(1).double()]).cpu()  # (3, B)
                yield SentenceScores(rows[0].tolist(), rows[1].tolist(), rows[2].long().tolist())
    finally:
        if was_training:
            model.train()


def reference_perplexity(model: Any, batches: Iterable[Any], pad_id: int = PAD_ID, eps_ls: float = 0.0,
                         autocast: Callable[[], Any] = nullcontext,
                         forward: Callable[[Any], Any] | None = None) -> dict[str, float]:
    """Perplexity of the references: `{"nll_per_token", "ppl", "n_tokens",
    "smoothed_per_token"}` (natural log; the last is the label-smoothed training objective with
    `eps_ls`, §5.4), the sums of `sentence_scores` (arguments as there) over every sentence.
    Raises ValueError when the batches hold no target token."""
    return perplexity(sentence_scores(model, batches, pad_id, eps_ls, autocast, forward))


def perplexity(scores: Iterable[SentenceScores]) -> dict[str, float]:
    """`reference_perplexity`'s figures from sentences' scores."""
    total_nll = total_smoothed = 0.0  # Python floats (double): long corpora lose no precision
    n_tokens = 0
    for s in scores:
        total_nll += sum(s.nll)
        total_smoothed += sum(s.smoothed)
        n_tokens += sum(s.tokens)
    if n_tokens == 0:
        raise ValueError("no target tokens to score (every batch is empty or all padding)")
    mean = total_nll / n_tokens
    ppl = math.exp(mean) if mean < 700 else math.inf  # an untrained model can overflow exp
    return {"nll_per_token": mean, "ppl": ppl, "n_tokens": n_tokens,
            "smoothed_per_token": total_smoothed / n_tokens}


def score_ids(model: Any, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
              batch_tokens: int = 4000, autocast: Callable[[], Any] = nullcontext) -> SentenceScores:
    """`sentence_scores` of (source ids, reference ids) pairs (subword ids, no specials), in
    the pairs' order, computed in batches of similar lengths holding about `batch_tokens`
    tokens per side."""
    arrays = [(np.asarray(s, np.int64), np.asarray(t, np.int64)) for s, t in pairs]
    order = length_batches([len(s) for s, _ in arrays], batch_tokens, [len(t) for _, t in arrays])
    out = SentenceScores([0.0] * len(arrays), [0.0] * len(arrays), [0] * len(arrays))
    scored = sentence_scores(model, (collate(arrays, idx) for idx in order), autocast=autocast)
    for idx, s in zip(order, scored):
        for k, i in enumerate(idx):
            out.nll[i], out.smoothed[i], out.tokens[i] = s.nll[k], s.smoothed[k], s.tokens[k]
    return out
