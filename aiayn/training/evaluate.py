"""Development-set figures during training: loss, per-token perplexity (Table 3's "PPL (dev)")
and, optionally, sacreBLEU of greedy translations of the first sentences (or, for a study's final
figures, of beam-search translations: `dev_bleu(..., beam_size=4)`, as Table 3 was measured).

Runs on rank 0 with the unwrapped model in eval mode (no dropout) and leaves every random
generator as it found it, so evaluating never changes what training computes next.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from aiayn.data.batching import collate, length_batches
from aiayn.decoding.translate import Translator
from aiayn.errors import UserError
from aiayn.evaluation.perplexity import reference_perplexity
from aiayn.evaluation.sacre import sacre_bleu


def dev_loss(model: torch.nn.Module, dataset: Any, batch_tokens: int, eps_ls: float,
             device: torch.device, autocast, pad_multiple: int = 1) -> dict[str, float]:
    """Label-smoothed loss and NLL per target token over the whole split, and exp(NLL), through
    the project's one dev-loss computation (`reference_perplexity`). `autocast` is a callable
    returning the precision's context manager."""
    batches = (collate(dataset, idx, pad_multiple).to(device)
               for idx in length_batches(dataset.src_lengths, batch_tokens, dataset.tgt_lengths))
    try:
        r = reference_perplexity(model, batches, eps_ls=eps_ls, autocast=autocast)
    except ValueError:  # an empty split
        return {}
    return {"dev_loss": r["smoothed_per_token"], "dev_nll": r["nll_per_token"], "dev_ppl": r["ppl"],
            "dev_tokens": r["n_tokens"]}


def translations(model: torch.nn.Module, sources: list[np.ndarray], tokenizer: Any,
                 device: torch.device, autocast, beam_size: int | None = None) -> list[str]:
    """Detokenized translations of `sources` (subword id arrays), in input order, through the
    same search and source-length limit as `aiayn translate` (over-long sources truncated):
    greedy when `beam_size` is None, else beam search with the model config's length penalty and
    output-length limits (§6.1)."""
    tr = Translator.for_model(model, tokenizer, tokenizer, greedy=beam_size is None,
                              beam_size=beam_size, warn=lambda _: None)
    ids = [s.tolist()[: tr.max_src_tokens - 1] for s in sources]
    with autocast():
        found = tr.search(ids)
    return [tr.detokenize(h[0].tokens) if h else "" for h in found]


def dev_bleu(model: torch.nn.Module, dataset: Any, n_sentences: int, device: torch.device,
             autocast, beam_size: int | None = None) -> dict[str, Any]:
    """sacreBLEU of the translations (greedy, or beam search of `beam_size`) of the first
    `n_sentences` of the split (all when < 0) against its raw reference lines; {} when the split
    keeps no raw text."""
    try:
        refs = dataset.reference_lines("tgt")
    except UserError:
        return {}
    n = len(refs) if n_sentences < 0 else min(n_sentences, len(refs))
    if n == 0:
        return {}
    sources = [dataset[i][0] for i in range(n)]
    hyps = translations(model, sources, dataset.tgt_tokenizer, device, autocast, beam_size)
    result = sacre_bleu(hyps, refs[:n])
    return {"dev_bleu": result.score, "bleu_sentences": n, "bleu_signature": result.signature,
            "example": {"ref": refs[0], "hyp": hyps[0]}}


def evaluate(model: torch.nn.Module, dataset: Any, batch_tokens: int, eps_ls: float,
             bleu_sentences: int, device: torch.device, autocast, pad_multiple: int = 1
             ) -> dict[str, Any]:
    """Dev loss, perplexity and (when `bleu_sentences` != 0) greedy BLEU, without disturbing
    any random generator."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        out = dev_loss(model, dataset, batch_tokens, eps_ls, device, autocast, pad_multiple)
        if bleu_sentences != 0:
            out.update(dev_bleu(model, dataset, bleu_sentences, device, autocast))
    return out
