"""Beam search with the GNMT length penalty and exact early stopping (§6.1: beam size 4,
alpha = 0.6, maximum output length input length + 50, "terminate early when possible").

The search, per sentence, vectorised over sentences and beams (no Python loop over sentences):

1. Each step extends the k live hypotheses by every token; candidates are ranked by their raw
   score, the sum of log-probabilities. Of the best 2k candidates, an EOS candidate ranked among
   the first k (one that would have taken a place in a beam of width k) becomes a finished
   hypothesis; the k best non-EOS candidates are the new live beams (2k candidates always hold k
   of them: at most k end in EOS, one per beam).
2. A finished hypothesis Y is ranked by score(Y) = log P(Y | X) / lp(|Y|), lp from
   `aiayn.decoding.common.length_penalty`, |Y| counting EOS. Each sentence keeps the k best
   finished hypotheses (the "pool"); `nbest` <= k of them are returned, best first.
3. Early stopping. A live hypothesis with raw score s after t steps can only end at some length
   t' in (t, L], with raw score s' <= s (log-probabilities are <= 0), so its final score is
   s' / lp(t') <= s / lp(t') <= s / lp(L): s <= 0 and lp is non-decreasing in length when
   alpha >= 0, so dividing by the largest penalty gives the largest (least negative) value. The
   bound grows with s, so checking the best live beam suffices: a sentence stops as soon as it
   has `nbest` finished hypotheses and best_live_s / lp(L) <= the nbest-th finished score. No live
   hypothesis can then enter the n-best list: stopping early never changes the result (tested).
   With alpha = 0 the bound is the raw score itself, the usual "best live < worst kept" rule.
   Not in the paper, an option (`early_stop="current"`, `aiayn translate --early-stop current`):
   the bound at the next length instead, best_live_s / lp(t + 1), the score the best live beam
   would get by ending now at no cost. It stops sooner with alpha > 0 (with alpha = 0 the two
   rules are the same), as fairseq and CTranslate2 stop once their beams have finished, and can
   miss a longer winner the exact bound would have waited for (tested on a worked case).
4. At the maximum length L (see `common`), the live beams are kept as cut-off hypotheses
   (`complete=False`), ranked below every complete one, so a sentence always gets an answer.

Finished sentences leave the batch: their cache rows are dropped in the same `cache.reorder`
that reorders the beams, so they cost nothing afterwards. Log-softmax runs in float32 even
under bf16 autocast, and raw scores are accumulated in float32; PAD and BOS are never generated
(`common.next_token_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding import EARLY_STOP_RULES
from aiayn.decoding.common import (
    AttentionRequest,
    Hypothesis,
    StepConstraint,
    apply_constraint,
    ban_early_eos,
    decoder_length_cap,
    decoding_defaults,
    length_penalty,
    max_output_lengths,
    next_token_logprobs,
    resolve_mask,
    row_topk,
    unflatten_attention,
)
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

NEG_INF = float("-inf")
EARLY_STOP = (True, False, *EARLY_STOP_RULES)  # True is "exact"


@dataclass
class _Pool:
    """Finished hypotheses per sentence, best first: (n, P[, W[, A]]) tensors. An empty slot has
    score -inf and complete False. Tokens are PAD-padded to W, the largest maximum length; `attn`
    holds the kept attention weights of each step (A = L' h' S values), only when asked for."""

    tok: Tensor  # (n, P, W) int64 pieces, no EOS
    tlp: Tensor  # (n, P, W) float32 per-token log-probs (EOS's included when complete)
    length: Tensor  # (n, P) int64 number of pieces
    raw: Tensor  # (n, P) float32 log P(Y | X)
    score: Tensor  # (n, P) float32 raw / lp(|Y|)
    complete: Tensor  # (n, P) bool
    attn: Tensor | None = None  # (n, P, W, A) float32

    @classmethod
    def empty(cls, n: int, p: int, w: int, device: torch.device, attn_size: int = 0) -> "_Pool":
        return cls(
            tok=torch.full((n, p, w), PAD_ID, dtype=torch.long, device=device),
            tlp=torch.zeros(n, p, w, dtype=torch.float32, device=device),
            length=torch.zeros(n, p, dtype=torch.long, device=device),
            raw=torch.full((n, p), NEG_INF, device=device),
            score=torch.full((n, p), NEG_INF, device=device),
            complete=torch.zeros(n, p, dtype=torch.bool, device=device),
            attn=torch.zeros(n, p, w, attn_size, device=device) if attn_size else None,
        )

    def _present(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def rows(self, index: Tensor) -> "_Pool":
        return _Pool(**{name: getattr(self, name)[index] for name in self._present()})

    def put_rows(self, index: Tensor, other: "_Pool") -> None:
        for name in self._present():
            getattr(self, name)[index] = getattr(other, name)

    @staticmethod
    def cat(pools: list["_Pool"]) -> "_Pool":
        return _Pool(**{name: torch.cat([getattr(p, name) for p in pools], dim=1)
                        for name in pools[0]._present()})

    def merge(self, cand: "_Pool") -> "_Pool":
        """Keep the P best of the pool and the candidates (n, C): complete before cut-off, then
        by score, descending."""
        p = self.score.size(1)
        both = _Pool.cat([self, cand])
        # Lexicographic order with two stable sorts: by score, then by completeness.
        order = both.score.argsort(dim=1, descending=True, stable=True)  # (n, P + C)
        flag = both.complete.gather(1, order).to(torch.int8)
        order = order.gather(1, flag.argsort(dim=1, descending=True, stable=True))[:, :p]
        return _Pool(**{name: _gather_beams(getattr(both, name), order)
                        for name in both._present()})


def _pad_to(x: Tensor, width: int, value: float) -> Tensor:
    return F.pad(x, (0, width - x.size(-1)), value=value)


def _pad_steps(x: Tensor, width: int) -> Tensor:
    """Kept attention (n, c, t, A) zero-padded to (n, c, width, A)."""
    return F.pad(x, (0, 0, 0, width - x.size(2)))


def _gather_beams(x: Tensor, beam: Tensor) -> Tensor:
    """x: (n, k, ...), beam: (n, c) -> (n, c, ...), row j of sentence i is x[i, beam[i, j]]."""
    idx = beam.reshape(beam.shape + (1,) * (x.dim() - 2))  # (n, c, 1, ...)
    return x.gather(1, idx.expand(-1, -1, *x.shape[2:]))


@torch.inference_mode()
def beam_search(model: Any, src: Tensor, src_mask: Tensor | None = None,
                beam_size: int | None = None, alpha: float | None = None,
                max_len_a: float | None = None, max_len_b: float | None = None,
                nbest: int = 1, early_stop: bool | str = True, min_len: int = 0,
                attention: AttentionRequest | None = None,
                constraint: StepConstraint | None = None) -> list[list[Hypothesis]]:
    """Beam search over a batch. src: (B, S) int64, pieces + EOS, right-padded with PAD; src_mask:
    (B, S) bool, True at real tokens (default `src != PAD`).

    Returns per sentence, in batch order, up to `nbest` hypotheses best first (normally exactly
    `nbest`; fewer only when the model gives probability 0 to almost everything). Settings left
    None come from the model's config (the paper's: k = 4, alpha = 0.6, L = S + 50).
    `early_stop=False` runs every sentence to its maximum length (for testing: same result);
    True or "exact" is the exact bound, "current" the bound at the next length (module doc).
    `min_len` (not in the paper, 0 = off) forbids EOS before step min_len
    (`common.ban_early_eos`); the early-stopping bound still holds, as it only removes choices.
    `attention` keeps, for every hypothesis, the cross-attention weights of the steps that made
    it (`Hypothesis.attention`), following each beam's history through the reorderings; the
    search itself is unchanged. `constraint` (one row per sentence when given) limits the
    tokens each hypothesis may write (`common.StepConstraint`). The model should be in eval mode.
    """
    cfg = decoding_defaults(model)
    k = cfg.beam_size if beam_size is None else int(beam_size)
    alpha = cfg.alpha if alpha is None else float(alpha)
    a = cfg.max_len_a if max_len_a is None else max_len_a
    b = cfg.max_len_b if max_len_b is None else max_len_b
    if k < 1:
        raise ValueError(f"beam size must be >= 1, got {k}")
    if not 1 <= nbest <= k:
        raise ValueError(f"nbest must be between 1 and the beam size {k}, got {nbest}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0 (the early-stopping bound needs it), got {alpha}")
    if early_stop not in EARLY_STOP:
        raise ValueError(f"early_stop must be one of {EARLY_STOP}, got {early_stop!r}")
    src_mask = resolve_mask(src, src_mask)
    n_sent, device = src.size(0), src.device
    if n_sent == 0:
        return []
    max_lens = max_output_lengths(src_mask, a, b, decoder_length_cap(model))  # (B,)
    width = int(max_lens.max())
    bound_lp = length_penalty(max_lens.to(torch.float32), alpha)  # (B,) lp(L), the bound's divisor

    memory = model.encode(src, src_mask)
    # The k beams of a sentence start identical, so the first step decodes one row per sentence
    # (a quarter of that step's work at k = 4); its reorder then expands each row to the k beams,
    # which share the sentence's source side. `rows_per` is the rows each sentence has in the cache.
    cache = model.new_cache(memory, src_mask)
    rows_per = 1
    w_shape = None  # (L', h', S) of the kept attention
    if attention is not None:
        w_shape = (*attention.kept(cfg.n_layers, cfg.n_heads), src.size(1))
    a_size = 0 if w_shape is None else w_shape[0] * w_shape[1] * w_shape[2]
    final = _Pool.empty(n_sent, k, width, device, a_size)

    sent = torch.arange(n_sent, device=device)  # (n,) live sentences' indices into the batch
    pool = _Pool.empty(n_sent, k, width, device, a_size)
    hist_w = torch.zeros(n_sent, k, 0, a_size, device=device) if a_size else None  # (n, k, t, A)
    # The k beams start identical; only beam 0 may extend at step 1, or the beam would fill with
    # k copies of the same hypothesis.
    raw = torch.full((n_sent, k), NEG_INF, device=device)
    raw[:, 0] = 0.0
    hist_tok = torch.zeros(n_sent, k, 0, dtype=torch.long, device=device)  # (n, k, t)
    hist_lp = torch.zeros(n_sent, k, 0, dtype=torch.float32, device=device)
    last = torch.full((n_sent, 1), BOS_ID, dtype=torch.long, device=device)
    t = 0
    while sent.numel():
        n = sent.numel()
        if attention is None:
            logits = model.decode_step(last, cache)  # (n*r, V), r = rows_per
        else:
            logits, weights = model.decode_step(last, cache, return_attention=True)
            step_w = attention.select(weights["cross"]).reshape(n, rows_per, 1, a_size)
            step_w = step_w.expand(n, k, 1, a_size)  # (n, k, 1, A)
        vocab = logits.size(-1)
        logp = ban_early_eos(next_token_logprobs(logits), t + 1, min_len)  # (n*r, V) float32
        left = (max_lens[sent] - t).repeat_interleave(rows_per)  # (n*r,) steps a row may take
        logp = apply_constraint(logp, constraint, left)  # (n*r, V)
        n_cand = min(2 * k, k * vocab)
        # The 2k best of the k * V candidates raw + log p, in two rounds: within a beam they rank
        # as log p does (raw is the beam's), so each beam's 2k best tokens hold every winner of
        # that beam; then the best 2k of those k * 2k. The same candidates as one top-k over
        # (n, k * V), without adding raw to all V log-probs of every row.
        c = min(n_cand, vocab)
        beam_lp, beam_tok = row_topk(logp, c)  # (n*r, c)
        if rows_per < k:  # the first step's row stands for the k identical beams (raw -inf but 0)
            beam_lp = beam_lp.repeat_interleave(k, dim=0)  # (n*k, c)
            beam_tok = beam_tok.repeat_interleave(k, dim=0)
        cand_raw = (raw.reshape(n * k, 1) + beam_lp).view(n, k * c)
        top_raw, pos = cand_raw.topk(n_cand, dim=1)  # (n, 2k), best first
        top_beam = pos // c
        top_tok = beam_tok.view(n, k * c).gather(1, pos)
        top_lp = beam_lp.view(n, k * c).gather(1, pos)  # (n, 2k) the new token's own log-prob
        t += 1  # |Y| of every candidate made at this step
        is_eos = top_tok == EOS_ID
        rank = torch.arange(n_cand, device=device)

        # The k best non-EOS candidates become the live beams.
        live = (rank + n_cand * is_eos.long()).topk(k, dim=1, largest=False).indices  # (n, k)
        beam = top_beam.gather(1, live)
        live_raw = top_raw.gather(1, live)
        live_tok = top_tok.gather(1, live)
        parent_tok, parent_lp = hist_tok, hist_lp  # (n, k, t-1), before this step
        hist_tok = torch.cat([_gather_beams(hist_tok, beam), live_tok[:, :, None]], dim=2)
        hist_lp = torch.cat([_gather_beams(hist_lp, beam), top_lp.gather(1, live)[:, :, None]], 2)
        parent_w = hist_w
        if hist_w is not None:
            hist_w = torch.cat([_gather_beams(hist_w, beam), _gather_beams(step_w, beam)], 2)

        # EOS candidates ranked among the first k finish; at the maximum length the live beams
        # are kept too, cut off.
        ended = is_eos[:, :k] & torch.isfinite(top_raw[:, :k])  # (n, k)
        at_max = t >= max_lens[sent]  # (n,)
        if bool(ended.any() | at_max.any()):  # the step's one host sync besides `done`
            parent = top_beam[:, :k]
            cut = at_max[:, None] & torch.isfinite(live_raw)  # (n, k)
            lp_t = length_penalty(t, alpha)
            pool = pool.merge(_Pool.cat([
                _Pool(tok=_pad_to(_gather_beams(parent_tok, parent), width, PAD_ID),
                      tlp=_pad_to(torch.cat([_gather_beams(parent_lp, parent),
                                             top_lp[:, :k, None]], 2), width, 0.0),
                      length=torch.full_like(parent, t - 1),
                      raw=top_raw[:, :k].masked_fill(~ended, NEG_INF),
                      score=(top_raw[:, :k] / lp_t).masked_fill(~ended, NEG_INF),
                      complete=ended,
                      attn=None if hist_w is None else _pad_steps(torch.cat(
                          [_gather_beams(parent_w, parent), _gather_beams(step_w, parent)], 2),
                          width)),
                _Pool(tok=_pad_to(hist_tok, width, PAD_ID),
                      tlp=_pad_to(hist_lp, width, 0.0),
                      length=torch.full_like(beam, t),
                      raw=live_raw.masked_fill(~cut, NEG_INF),
                      score=(live_raw / lp_t).masked_fill(~cut, NEG_INF),
                      complete=torch.zeros_like(cut),
                      attn=None if hist_w is None else _pad_steps(hist_w, width)),
            ]))

        done = at_max | ~torch.isfinite(live_raw[:, 0])
        if early_stop:
            enough = pool.complete.sum(dim=1) >= nbest
            divisor = length_penalty(t + 1, alpha) if early_stop == "current" else bound_lp[sent]
            best_possible = live_raw[:, 0] / divisor
            done |= enough & (best_possible <= pool.score[:, nbest - 1])
        if bool(done.any()):
            final.put_rows(sent[done], pool.rows(done))
            keep = (~done).nonzero().squeeze(1)  # (m,)
            sent, pool = sent[keep], pool.rows(keep)
            beam, live_raw, live_tok = beam[keep], live_raw[keep], live_tok[keep]
            hist_tok, hist_lp = hist_tok[keep], hist_lp[keep]
            hist_w = None if hist_w is None else hist_w[keep]
        else:
            keep = torch.arange(n, device=device)
        if not sent.numel():
            break
        # One gather both drops finished sentences and puts each beam's parent state in place.
        # The k beams of a sentence share its cross-attention keys/values (stored once), so
        # those move only when sentences leave the batch.
        cross = keep if keep.numel() != n else None  # (m,)
        # At the first step every beam's parent is its sentence's one row (beams other than 0
        # are dead there: raw -inf, their state unused).
        rows = (keep[:, None] * rows_per + beam.clamp(max=rows_per - 1)).view(-1)  # (m*k,)
        cache.reorder(rows, cross_index=cross)
        rows_per = k
        if constraint is not None:
            constraint.reorder(rows)
            constraint.advance(live_tok.reshape(-1))
        raw = live_raw
        last = live_tok.reshape(-1, 1)
    return _to_hypotheses(final, nbest, w_shape, src_mask.sum(dim=1).tolist())


def _to_hypotheses(final: _Pool, nbest: int, w_shape: tuple[int, int, int] | None = None,
                   src_lens: list[int] | None = None) -> list[list[Hypothesis]]:
    """The first `nbest` non-empty pool entries of each sentence as `Hypothesis` lists (with
    their attention, (L', h', steps, S_i), when the pool kept it)."""
    out = []
    tok, tlp = final.tok[:, :nbest].tolist(), final.tlp[:, :nbest].tolist()
    length, raw = final.length[:, :nbest].tolist(), final.raw[:, :nbest].tolist()
    score, complete = final.score[:, :nbest].tolist(), final.complete[:, :nbest].tolist()
    for i in range(len(tok)):
        hyps = []
        for j in range(len(tok[i])):
            if score[i][j] == NEG_INF:
                continue
            steps = length[i][j] + int(complete[i][j])
            w = (None if final.attn is None
                 else unflatten_attention(final.attn[i, j], steps, w_shape, src_lens[i]))
            hyps.append(Hypothesis(tok[i][j][: length[i][j]], score[i][j], raw[i][j],
                                   bool(complete[i][j]), tlp[i][j][:steps], w))
        out.append(hyps)
    return out
