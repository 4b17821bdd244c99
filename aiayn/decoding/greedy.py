"""Greedy decoding: the most probable next token at every step, batched.

Uses only the model's incremental API (`encode` once, `new_cache`, `decode_step`,
`cache.reorder`), so a step costs one new position per sentence. Rows that have finished are
dropped from the cache, so they stop costing compute. Lengths follow `aiayn.decoding.common`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aiayn.decoding.common import (
    AttentionRequest,
    Hypothesis,
    StepConstraint,
    apply_constraint,
    ban_early_eos,
    decoder_length_cap,
    decoding_defaults,
    max_output_lengths,
    next_token_logprobs,
    resolve_mask,
    unflatten_attention,
)
from aiayn.special import BOS_ID, EOS_ID, PAD_ID


@torch.inference_mode()
def greedy_search(model: Any, src: Tensor, src_mask: Tensor | None = None,
                  max_len_a: float | None = None, max_len_b: float | None = None,
                  min_len: int = 0, attention: AttentionRequest | None = None,
                  constraint: StepConstraint | None = None) -> list[Hypothesis]:
    """Greedy decoding of a batch. src: (B, S) int64, pieces + EOS, right-padded with PAD;
    src_mask: (B, S) bool, True at real tokens (default `src != PAD`).

    Returns one `Hypothesis` per sentence, in batch order; its score is its log-probability (no
    length penalty: greedy has no competing hypotheses to rank). The model should be in eval
    mode. `max_len_a`/`max_len_b` default to the model config's (1 and 50). `min_len` (not in
    the paper, 0 = off) forbids EOS before step min_len (`common.ban_early_eos`).
    `attention` keeps each step's cross-attention weights as `Hypothesis.attention`.
    `constraint` (one row per sentence) limits the tokens each step may choose
    (`common.StepConstraint`).
    """
    cfg = decoding_defaults(model)
    a = cfg.max_len_a if max_len_a is None else max_len_a
    b = cfg.max_len_b if max_len_b is None else max_len_b
    src_mask = resolve_mask(src, src_mask)
    n, device = src.size(0), src.device
    max_lens = max_output_lengths(src_mask, a, b, decoder_length_cap(model))  # (B,)
    width = int(max_lens.max()) if n else 0

    # Results for every sentence, written when it finishes.
    out_tok = torch.full((n, width), PAD_ID, dtype=torch.long, device=device)
    out_lp = torch.zeros(n, width, dtype=torch.float32, device=device)
    out_len = torch.zeros(n, dtype=torch.long, device=device)  # pieces, EOS excluded
    out_complete = torch.zeros(n, dtype=torch.bool, device=device)
    out_raw = torch.zeros(n, dtype=torch.float32, device=device)

    if n:
        memory = model.encode(src, src_mask)
        cache = model.new_cache(memory, src_mask)
    rows = torch.arange(n, device=device)  # sentence index of each live row
    hist_tok = torch.zeros(n, 0, dtype=torch.long, device=device)  # (n_live, t)
    hist_lp = torch.zeros(n, 0, dtype=torch.float32, device=device)
    raw = torch.zeros(n, dtype=torch.float32, device=device)  # running sum, as beam search keeps it
    hist_w = out_w = w_shape = None  # kept attention: (n_live, t, A), (n, width, A), (L', h', S)
    last = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
    t = 0
    while rows.numel():
        if attention is None:
            logits = model.decode_step(last, cache)  # (n_live, V)
        else:
            logits, weights = model.decode_step(last, cache, return_attention=True)
            step_w = attention.select(weights["cross"])  # (n_live, L', h', S)
            w_shape = tuple(step_w.shape[1:])
            step_w = step_w.flatten(1)[:, None]  # (n_live, 1, A)
            hist_w = step_w if hist_w is None else torch.cat([hist_w, step_w], dim=1)
            if out_w is None:
                out_w = step_w.new_zeros(n, width, step_w.size(2))
        logp = ban_early_eos(next_token_logprobs(logits), t + 1, min_len)  # (n_live, V) float32
        logp = apply_constraint(logp, constraint, max_lens[rows] - t)
        tok_lp, tok = logp.max(dim=-1)  # (n_live,)
        hist_tok = torch.cat([hist_tok, tok[:, None]], dim=1)  # (n_live, t+1)
        hist_lp = torch.cat([hist_lp, tok_lp[:, None]], dim=1)
        raw = raw + tok_lp
        t += 1
        ended = tok == EOS_ID
        done = ended | (t >= max_lens[rows])
        if bool(done.any()):
            d = rows[done]
            out_tok[d, :t] = hist_tok[done]
            out_lp[d, :t] = hist_lp[done]
            out_len[d] = t - ended[done].long()
            out_complete[d] = ended[done]
            out_raw[d] = raw[done]
            keep = (~done).nonzero().squeeze(1)
            if hist_w is not None:
                out_w[d, :t] = hist_w[done]
                hist_w = hist_w[keep]
            rows, hist_tok, hist_lp, tok = rows[keep], hist_tok[keep], hist_lp[keep], tok[keep]
            raw = raw[keep]
            if rows.numel():
                cache.reorder(keep)
                if constraint is not None:
                    constraint.reorder(keep)
        if constraint is not None and rows.numel():
            constraint.advance(tok)
        last = tok[:, None]

    hyps = []
    toks, lps, raws = out_tok.tolist(), out_lp.tolist(), out_raw.tolist()
    src_lens = src_mask.sum(dim=1).tolist()
    for i, (length, complete) in enumerate(zip(out_len.tolist(), out_complete.tolist())):
        steps = length + int(complete)
        w = None if out_w is None else unflatten_attention(out_w[i], steps, w_shape, src_lens[i])
        hyps.append(Hypothesis(toks[i][:length], raws[i], raws[i], bool(complete), lps[i][:steps],
                               w))
    return hyps
