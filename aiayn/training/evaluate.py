"""Development-set figures during training: loss, per-token perplexity (Table 3's "PPL (dev)")
and, optionally, sacreBLEU of greedy translations of the first sentences.

Runs on rank 0 with the unwrapped model in eval mode (no dropout) and leaves every random
generator as it found it, so evaluating never changes what training computes next.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from aiayn.training.loss import label_smoothed_loss


def dev_loss(model: torch.nn.Module, dataset: Any, batch_tokens: int, eps_ls: float,
             device: torch.device, autocast) -> dict[str, float]:
    """Label-smoothed loss and NLL per target token over the whole split, and exp(NLL).
    `autocast` is a callable returning the precision's context manager."""
    from aiayn.data.batching import TokenBatchSampler, collate

    sampler = TokenBatchSampler(dataset.src_lengths, dataset.tgt_lengths, batch_tokens,
                                shuffle=False, allow_oversize=True)
    smoothed = nll = 0.0
    n = 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for idx in sampler.epoch_batches():
                b = collate(dataset, idx).to(device)
                with autocast():
                    logits = model(b.src, b.tgt_in)  # (B, T, V)
                s = label_smoothed_loss(logits, b.tgt_out, eps_ls)
                smoothed += float(s.smoothed)
                nll += float(s.nll)
                n += int(s.n_tokens)
    finally:
        model.train(was_training)
    if n == 0:
        return {}
    mean_nll = nll / n
    return {"dev_loss": smoothed / n, "dev_nll": mean_nll,
            "dev_ppl": math.exp(mean_nll) if mean_nll < 700 else math.inf, "dev_tokens": n}


def greedy_translations(model: torch.nn.Module, sources: list[np.ndarray], tokenizer: Any,
                        device: torch.device, autocast) -> list[str]:
    """Detokenized greedy translations of `sources` (subword id arrays), in input order, through
    the same search and source-length limit as `aiayn translate` (over-long sources truncated)."""
    from aiayn.decoding.translate import Translator

    tr = Translator.for_model(model, tokenizer, tokenizer, greedy=True, warn=lambda _: None)
    ids = [s.tolist()[: tr.max_src_tokens - 1] for s in sources]
    with autocast():
        found = tr.search(ids)
    return [tr.detokenize(h[0].tokens) if h else "" for h in found]


def dev_bleu(model: torch.nn.Module, dataset: Any, n_sentences: int, device: torch.device,
             autocast) -> dict[str, Any]:
    """sacreBLEU of greedy translations of the first `n_sentences` of the split (all when < 0)
    against its raw reference lines; {} when the split keeps no raw text."""
    from aiayn.errors import UserError
    from aiayn.evaluation.sacre import sacre_bleu

    try:
        refs = dataset.reference_lines("tgt")
    except UserError:
        return {}
    n = len(refs) if n_sentences < 0 else min(n_sentences, len(refs))
    if n == 0:
        return {}
    sources = [dataset[i][0] for i in range(n)]
    hyps = greedy_translations(model, sources, dataset.tgt_tokenizer, device, autocast)
    result = sacre_bleu(hyps, refs[:n])
    return {"dev_bleu": result.score, "bleu_sentences": n, "bleu_signature": result.signature,
            "example": {"ref": refs[0], "hyp": hyps[0]}}


def evaluate(model: torch.nn.Module, dataset: Any, batch_tokens: int, eps_ls: float,
             bleu_sentences: int, device: torch.device, autocast) -> dict[str, Any]:
    """Dev loss, perplexity and (when `bleu_sentences` != 0) greedy BLEU, without disturbing
    any random generator."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        out = dev_loss(model, dataset, batch_tokens, eps_ls, device, autocast)
        if bleu_sentences != 0:
            out.update(dev_bleu(model, dataset, bleu_sentences, device, autocast))
    return out
