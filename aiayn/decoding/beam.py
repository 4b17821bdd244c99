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

The search is `BeamSearch`, whose sentences need not start together: `add` lets sentences join
at any step (each at its own step count and output position; `aiayn.decoding.engine` keeps the
batch full this way), and `step` hands back each sentence the step it finishes. Finished
sentences leave at once: their cache rows are dropped in the same `cache.reorder` that reorders
the beams, so they cost nothing afterwards. Its settings are a `SearchSettings`
(aiayn/decoding/search.py), decided and checked before it is built; greedy search is its beam of
one. Log-softmax runs in float32 even under bf16 autocast, and raw scores are accumulated in
float32; PAD and BOS are never generated (`common.best_next_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Hashable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.decoding.common import (
    Hypothesis,
    StepConstraint,
    ban_early_eos,
    best_next_tokens,
    decoder_heads,
    decoder_length_cap,
    length_penalty,
    max_output_lengths,
    next_token_logprobs,
    resolve_mask,
    row_topk,
)
from aiayn.decoding.constraints import PhraseState, round_robin
from aiayn.decoding.search import SearchSettings
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

NEG_INF = float("-inf")


@dataclass
class _Pool:
    """Finished hypotheses per sentence, best first: (n, P[, W[, A, S]]) tensors. An empty slot
    has score -inf and complete False. Tokens are PAD-padded to W, the largest maximum length;
    `attn` holds the kept attention weights of each step (A = L' h' rows over S source
    positions), only when asked for."""

    tok: Tensor  # (n, P, W) int64 pieces, no EOS
    tlp: Tensor  # (n, P, W) float32 per-token log-probs (EOS's included when complete)
    length: Tensor  # (n, P) int64 number of pieces
    raw: Tensor  # (n, P) float32 log P(Y | X)
    score: Tensor  # (n, P) float32 raw / lp(|Y|)
    complete: Tensor  # (n, P) bool
    attn: Tensor | None = None  # (n, P, W, A, S) float32

    @classmethod
    def empty(cls, n: int, p: int, w: int, device: torch.device,
              attn_shape: tuple[int, int] | None = None) -> "_Pool":
        return cls(
            tok=torch.full((n, p, w), PAD_ID, dtype=torch.long, device=device),
            tlp=torch.zeros(n, p, w, dtype=torch.float32, device=device),
            length=torch.zeros(n, p, dtype=torch.long, device=device),
            raw=torch.full((n, p), NEG_INF, device=device),
            score=torch.full((n, p), NEG_INF, device=device),
            complete=torch.zeros(n, p, dtype=torch.bool, device=device),
            attn=torch.zeros(n, p, w, *attn_shape, device=device) if attn_shape else None,
        )

    def _present(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def rows(self, index: Tensor) -> "_Pool":
        return _Pool(**{name: getattr(self, name)[index] for name in self._present()})

    @staticmethod
    def cat(pools: list["_Pool"], dim: int = 1) -> "_Pool":
        """Slots side by side (dim 1), or sentences one after the other (dim 0)."""
        return _Pool(**{name: torch.cat([getattr(p, name) for p in pools], dim=dim)
                        for name in pools[0]._present()})

    def widen(self, w: int, s: int) -> "_Pool":
        """The same pool with tokens (and kept attention) padded to W = w steps (and S = s)."""
        return _Pool(tok=_pad_to(self.tok, w, PAD_ID), tlp=_pad_to(self.tlp, w, 0.0),
                     length=self.length, raw=self.raw, score=self.score, complete=self.complete,
                     attn=None if self.attn is None else _pad_attn(self.attn, w, s))

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


def cannot_win(raw: Tensor, divisor: Tensor, pool: _Pool, nbest: int) -> Tensor:
    """Early stopping's test (3. in the module doc), per beam: raw (n, c) live raw scores,
    divisor (n,) their bound's length penalty, lp(L) or lp(t + 1) -> (n, c) bool, True where the
    sentence has `nbest` finished hypotheses and the beam's bound raw / divisor is no better
    than the nbest-th of them."""
    enough = pool.complete.sum(dim=1) >= nbest  # (n,)
    return enough[:, None] & (raw / divisor[:, None] <= pool.score[:, nbest - 1 : nbest])


def _pad_to(x: Tensor, width: int, value: float) -> Tensor:
    return F.pad(x, (0, width - x.size(-1)), value=value)


def _pad_attn(x: Tensor, width: int, s: int) -> Tensor:
    """Kept attention (n, c, t, A, S') zero-padded to (n, c, width, A, s)."""
    return F.pad(x, (0, s - x.size(4), 0, 0, 0, width - x.size(2)))


def _put_step(hist: Tensor, col: Tensor, value: Tensor) -> Tensor:
    """hist (n, c, W, ...) with value (n, c, ...) written at step col[i] of sentence i (a copy)."""
    idx = col.reshape(-1, 1, 1, *([1] * (hist.dim() - 3)))
    idx = idx.expand(hist.size(0), hist.size(1), 1, *hist.shape[3:])  # (n, c, 1, ...)
    return hist.scatter(2, idx, value.unsqueeze(2))


def _gather_beams(x: Tensor, beam: Tensor) -> Tensor:
    """x: (n, k, ...), beam: (n, c) -> (n, c, ...), row j of sentence i is x[i, beam[i, j]]."""
    idx = beam.reshape(beam.shape + (1,) * (x.dim() - 2))  # (n, c, 1, ...)
    return x.gather(1, idx.expand(-1, -1, *x.shape[2:]))


class BeamSearch:
    """Beam search over the sentences `add` gives it, which may join at any step; `step` decodes
    one position of every live sentence and returns those that finished, with their keys.

        search = BeamSearch(model, settings)              # `SearchSettings`: k, alpha, L, ...
        search.add(src, src_mask, keys=["a", "b"])       # (B, S) pieces + EOS, PAD-padded
        while search.sentences:
            for key, hyps in search.step():              # hypotheses best first
                ...
            # more sentences may join here: search.add(...)

    `settings` (aiayn/decoding/search.py) are read as they are: beam size k, alpha, the maximum
    length rule (capped by the model's learned positions, `common.decoder_length_cap`), nbest.
    `early_stop` "exact" is the exact bound, "current" the bound at the next length (module
    doc), "never" runs every sentence to its maximum length (for testing: same result).
    `min_len` (not in the paper, 0 = off) forbids EOS before step min_len
    (`common.ban_early_eos`); the early-stopping bound still holds, as it only removes choices.
    `attention` keeps, for every hypothesis, the cross-attention weights of the steps that made
    it (`Hypothesis.attention`), following each beam's history through the reorderings; the
    search itself is unchanged. A constraint given to `add` (one row per sentence added) limits
    the tokens each hypothesis may write (`common.StepConstraint`); sentences that join later
    must bring theirs too. `phrases` given to `add` (target phrases per sentence) make the
    search lexically constrained (aiayn/decoding/constraints.py): every complete hypothesis
    holds its sentence's phrases, the beams dealt over banks of constraint pieces met; a search
    is constrained from its first sentence (sentences without phrases then join with none) or
    never, and an unconstrained one runs the paper's code unchanged. The model should be in
    eval mode.

    A sentence's result does not depend on the others in the search, nor on when it joined: each
    has its own step count, output positions (a cohort of the cache, `CacheCohorts`), maximum
    length and pool; the only link is that their rows share one decoder call per step (tested:
    equal to decoding it alone). Rows: k per live sentence, its beams, consecutive; at its first
    step only beam 0 is alive (raw score 0, the others -inf), so it fills the beam without k
    copies of one prefix.
    """

    def __init__(self, model: Any, settings: SearchSettings, continues: Tensor | None = None):
        self.model, self.settings = model, settings
        self.continues = continues  # (V,) bool: pieces that continue a word (phrases end words)
        self.k, self.alpha, self.nbest = settings.beam_size, settings.alpha, settings.nbest
        self.attention = attention = settings.attention
        self.length_cap = decoder_length_cap(model)  # learned positions: the decoder's last
        # kept attention: (L' h') rows over the source per step, when asked for
        self.a_shape = None if attention is None else attention.kept(*decoder_heads(model))
        self.a_rows = 0 if attention is None else math.prod(self.a_shape)
        self.keys: list[Hashable] = []  # the live sentences' keys, in row order
        self.src_lens: list[int] = []  # their real source tokens (EOS included)
        self.src_widths: list[int] = []  # the source positions each one's cohort holds (padded)
        self.cache: Any = None
        self.constraint: StepConstraint | None = None
        self.phrases: PhraseState | None = None  # lexical constraints (`add`'s `phrases`)
        self.lexical: bool | None = None  # whether this search is constrained: its first `add` says
        self.t = self.max_lens = self.bound_lp = self.raw = None  # (n,), (n,), (n,), (n, k)
        self.hist_tok = self.hist_lp = self.hist_w = self.last = None  # (n, k, W[, A, S]), (n k, 1)
        self.pool: _Pool | None = None

    @property
    def sentences(self) -> int:
        """Live sentences (k rows each)."""
        return len(self.keys)

    @property
    def rows(self) -> int:
        return len(self.keys) * self.k

    @torch.inference_mode()
    def add(self, src: Tensor, src_mask: Tensor | None, keys: Sequence[Hashable],
            constraint: StepConstraint | None = None,
            phrases: Sequence[Sequence[Sequence[int]]] | None = None) -> None:
        """Sentences join: src (B, S) int64 pieces + EOS, right-padded with PAD; src_mask (B, S)
        bool (default `src != PAD`); a key per sentence, handed back with its hypotheses;
        `constraint` one row per sentence, needed exactly when the search has one; `phrases`,
        per sentence, the target phrases (piece ids) its translation must contain (a constrained
        search's every `add` gives them, an empty list for a sentence without any)."""
        src_mask = resolve_mask(src, src_mask)
        n, k, device = src.size(0), self.k, src.device
        if n == 0:
            return
        if len(keys) != n:
            raise ValueError(f"{n} sentences but {len(keys)} keys")
        if self.sentences and (constraint is None) != (self.constraint is None):
            raise ValueError("sentences that join a constrained search need a constraint, and "
                             "only those")
        if self.lexical is None:
            self.lexical = phrases is not None
        elif self.lexical != (phrases is not None):
            raise ValueError("a search with phrases takes phrases (maybe empty) for every "
                             "sentence, and one without takes none")
        if phrases is not None and len(phrases) != n:
            raise ValueError(f"{n} sentences but {len(phrases)} phrase lists")
        cache = self.model.new_cache(self.model.encode(src, src_mask), src_mask)
        expand = torch.arange(n, device=device).repeat_interleave(k)  # (n k,) each sentence k beams
        cache.reorder(expand, cross_index=None)  # the k beams share the sentence's source side
        if constraint is not None:
            constraint.reorder(expand)
        state = None
        if phrases is not None:
            state = PhraseState.build(phrases, device, self.continues)
            state.reorder(expand)
        max_lens = max_output_lengths(src_mask, self.settings.max_len_a, self.settings.max_len_b,
                                      self.length_cap)
        width = max(int(max_lens.max()), 0 if self.pool is None else self.pool.tok.size(2))
        s = max(src.size(1), 0 if self.hist_w is None else self.hist_w.size(4))
        attn_shape = (self.a_rows, s) if self.a_rows else None
        raw = torch.full((n, k), NEG_INF, device=device)
        raw[:, 0] = 0.0
        new = dict(
            t=torch.zeros(n, dtype=torch.long, device=device), max_lens=max_lens,
            bound_lp=length_penalty(max_lens.to(torch.float32), self.alpha),  # lp(L), the bound's divisor
            raw=raw,
            hist_tok=torch.zeros(n, k, width, dtype=torch.long, device=device),
            hist_lp=torch.zeros(n, k, width, dtype=torch.float32, device=device),
            hist_w=torch.zeros(n, k, width, *attn_shape, device=device) if attn_shape else None,
            last=torch.full((n * k, 1), BOS_ID, dtype=torch.long, device=device))
        pool = _Pool.empty(n, k, width, device, attn_shape)
        if not self.sentences:
            self.cache, self.constraint, self.pool = cache, constraint, pool
            self.phrases = state
            for name, value in new.items():
                setattr(self, name, value)
        else:
            self.cache = self.cache.extend(cache)  # the model's own join (`KVCache.extend`)
            if constraint is not None:
                self.constraint.extend(constraint)
            if state is not None:
                self.phrases.extend(state)
            self.pool = _Pool.cat([self.pool.widen(width, s), pool], dim=0)
            for name in ("t", "max_lens", "bound_lp", "raw", "last"):
                setattr(self, name, torch.cat([getattr(self, name), new[name]]))
            self.hist_tok = torch.cat([_pad_to(self.hist_tok, width, PAD_ID), new["hist_tok"]])
            self.hist_lp = torch.cat([_pad_to(self.hist_lp, width, 0.0), new["hist_lp"]])
            if self.hist_w is not None:
                self.hist_w = torch.cat([_pad_attn(self.hist_w, width, s), new["hist_w"]])
        self.keys += list(keys)
        self.src_lens += src_mask.sum(dim=1).tolist()
        self.src_widths += [src.size(1)] * n

    @torch.inference_mode()
    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Decode one more position of every live sentence; returns (key, hypotheses best first)
        of each sentence that finished, which leaves the search (normally `nbest` hypotheses;
        fewer only when the model gives probability 0 to almost everything)."""
        n, k, model = self.sentences, self.k, self.model
        if not n:
            return []
        device = self.raw.device
        if self.attention is None:
            logits = model.decode_step(self.last, self.cache)  # (n k, V)
        else:
            logits, weights = model.decode_step(self.last, self.cache, return_attention=True)
            step_w = self.attention.select(weights["cross"])  # (n k, L', h', S)
            step_w = step_w.reshape(n, k, self.a_rows, step_w.size(-1))  # (n, k, A, S)
            # the kept weights span the widest source since the search began; the cohorts left
            # may be narrower
            step_w = F.pad(step_w, (0, self.hist_w.size(4) - step_w.size(-1)))
        vocab = logits.size(-1)
        t_rows = self.t.repeat_interleave(k)  # (n k,) steps taken so far
        allowed = None
        if self.constraint is not None:
            allowed = self.constraint.allowed(self.max_lens.repeat_interleave(k) - t_rows)
        n_cand = min(2 * k, k * vocab)
        if self.phrases is not None:  # dynamic beam allocation (aiayn/decoding/constraints.py)
            top_raw, top_beam, top_tok, top_lp, top_bank = self._allocate(logits, t_rows,
                                                                          allowed, n_cand)
        else:
            # The 2k best of the k * V candidates raw + log p, in two rounds: within a beam they
            # rank as log p does (raw is the beam's), so each beam's 2k best tokens hold every
            # winner of that beam; then the best 2k of those k * 2k. The same candidates as one
            # top-k over (n, k * V), without adding raw to all V log-probs of every row.
            c = min(n_cand, vocab)
            beam_lp, beam_tok = best_next_tokens(logits, c, t_rows + 1, self.settings.min_len,
                                                 allowed)  # (n k, c)
            cand_raw = (self.raw.reshape(n * k, 1) + beam_lp).view(n, k * c)
            top_raw, pos = cand_raw.topk(n_cand, dim=1)  # (n, 2k), best first
            top_beam = pos // c
            top_tok = beam_tok.view(n, k * c).gather(1, pos)
            top_lp = beam_lp.view(n, k * c).gather(1, pos)  # (n, 2k) the new token's own log-prob
        col = self.t  # (n,) the step each sentence writes: |Y| - 1 of this step's candidates
        t = self.t = self.t + 1  # (n,) |Y| of every candidate made at this step
        is_eos = top_tok == EOS_ID
        rank = torch.arange(n_cand, device=device)

        # The k best non-EOS candidates become the live beams.
        live = (rank + n_cand * is_eos.long()).topk(k, dim=1, largest=False).indices  # (n, k)
        if self.phrases is not None:  # dealt by bank; kept best first, as the bound reads them
            live = live.gather(1, top_raw.gather(1, live).argsort(dim=1, descending=True,
                                                                   stable=True))
        beam = top_beam.gather(1, live)
        live_raw = top_raw.gather(1, live)
        live_tok = top_tok.gather(1, live)
        parent_tok, parent_lp, parent_w = self.hist_tok, self.hist_lp, self.hist_w  # before this step
        hist_tok = _put_step(_gather_beams(parent_tok, beam), col, live_tok)  # (n, k, W)
        hist_lp = _put_step(_gather_beams(parent_lp, beam), col, top_lp.gather(1, live))
        hist_w = None
        if parent_w is not None:
            hist_w = _put_step(_gather_beams(parent_w, beam), col, _gather_beams(step_w, beam))

        # EOS candidates ranked among the first k finish; at the maximum length the live beams
        # are kept too, cut off.
        ended = is_eos[:, :k] & torch.isfinite(top_raw[:, :k])  # (n, k)
        at_max = t >= self.max_lens  # (n,)
        pool = self.pool
        if bool(ended.any() | at_max.any()):  # the step's one host sync besides `done`
            parent = top_beam[:, :k]
            cut = at_max[:, None] & torch.isfinite(live_raw)  # (n, k)
            if self.phrases is not None:  # cut off: those with the most phrase pieces first
                live_bank = top_bank.gather(1, live).masked_fill(~cut, -1)
                cut &= live_bank == live_bank.max(dim=1, keepdim=True).values
            lp_t = length_penalty(t.to(torch.float32), self.alpha)[:, None]  # (n, 1)
            pool = pool.merge(_Pool.cat([
                _Pool(tok=_gather_beams(parent_tok, parent),
                      tlp=_put_step(_gather_beams(parent_lp, parent), col, top_lp[:, :k]),
                      length=(t - 1)[:, None].expand(n, k),
                      raw=top_raw[:, :k].masked_fill(~ended, NEG_INF),
                      score=(top_raw[:, :k] / lp_t).masked_fill(~ended, NEG_INF),
                      complete=ended,
                      attn=None if parent_w is None else _put_step(
                          _gather_beams(parent_w, parent), col, _gather_beams(step_w, parent))),
                _Pool(tok=hist_tok, tlp=hist_lp, length=t[:, None].expand(n, k),
                      raw=live_raw.masked_fill(~cut, NEG_INF),
                      score=(live_raw / lp_t).masked_fill(~cut, NEG_INF),
                      complete=torch.zeros_like(cut), attn=hist_w),
            ]))

        done = at_max | ~torch.isfinite(live_raw[:, 0])
        stop = self.settings.early_stop
        if stop != "never":
            divisor = (length_penalty((t + 1).to(torch.float32), self.alpha)
                       if stop == "current" else self.bound_lp)
            # the bound grows with the raw score: the best live beam decides (3. above)
            done |= cannot_win(live_raw[:, :1], divisor, pool, self.nbest)[:, 0]
        finished: list[tuple[Hashable, list[Hypothesis]]] = []
        cross = None
        keep = torch.arange(n, device=device)
        if bool(done.any()):
            gone = done.nonzero().squeeze(1).tolist()
            hyps = _to_hypotheses(pool.rows(done), self.nbest, [self.src_lens[i] for i in gone],
                                  self.a_shape)
            finished = [(self.keys[i], h) for i, h in zip(gone, hyps)]
            keep = (~done).nonzero().squeeze(1)  # (m,)
            kept = keep.tolist()
            self.keys = [self.keys[i] for i in kept]
            self.src_lens = [self.src_lens[i] for i in kept]
            self.src_widths = [self.src_widths[i] for i in kept]
            if not kept:  # every sentence is done: the search is empty, ready for new ones
                self.cache = self.constraint = self.pool = self.phrases = None
                self.hist_tok = self.hist_lp = self.hist_w = None
                return finished
            pool, beam, live_raw, live_tok = pool.rows(keep), beam[keep], live_raw[keep], live_tok[keep]
            hist_tok, hist_lp = hist_tok[keep], hist_lp[keep]
            hist_w = None if hist_w is None else hist_w[keep]
            for name in ("t", "max_lens", "bound_lp"):
                setattr(self, name, getattr(self, name)[keep])
            cross = keep
        self.pool, self.hist_tok, self.hist_lp, self.hist_w = pool, hist_tok, hist_lp, hist_w
        # One gather both drops finished sentences and puts each beam's parent state in place.
        # The k beams of a sentence share its cross-attention keys/values (stored once), so
        # those move only when sentences leave.
        rows = (keep[:, None] * k + beam).view(-1)  # (m k,)
        self.cache.reorder(rows, cross_index=cross)
        if self.constraint is not None:
            self.constraint.reorder(rows)
            self.constraint.advance(live_tok.reshape(-1))
        if self.phrases is not None:
            self.phrases.reorder(rows)
            self.phrases.advance(live_tok.reshape(-1))
        self.raw = live_raw
        self.last = live_tok.reshape(-1, 1)
        return finished

    def _allocate(self, logits: Tensor, t_rows: Tensor, allowed: Tensor | None, n_cand: int
                  ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """A constrained step's candidates in the order its beams are dealt
        (`constraints.round_robin`): each beam's 2k best pieces and the pieces that start or
        continue its phrases -> the first `n_cand` of them as (n, n_cand) raw scores, parent
        beams, pieces, the pieces' own log-probs and banks."""
        n, k, state = self.sentences, self.k, self.phrases
        vocab = logits.size(-1)
        logp = ban_early_eos(next_token_logprobs(logits), t_rows + 1, self.settings.min_len)
        mask = state.allowed(vocab)  # EOS once every phrase is written
        if allowed is not None:
            mask &= allowed
        logp.masked_fill_(~mask, NEG_INF)  # (n k, V)
        best_lp, best_tok = row_topk(logp, min(n_cand, vocab))  # (n k, c)
        want_tok, wanted = state.tok.clamp(min=0), state.wanted()  # (n k, C) each
        cols = torch.arange(state.width, device=logp.device)
        # a piece once per beam: not again when it is among the best, nor for a second phrase
        again = (want_tok[:, :, None] == best_tok[:, None, :]).any(dim=2)  # (n k, C)
        earlier = (want_tok[:, :, None] == want_tok[:, None, :]) & wanted[:, None, :]
        again |= (earlier & (cols[None, :] < cols[:, None])).any(dim=2)
        want_lp = logp.gather(1, want_tok).masked_fill(~wanted | again, NEG_INF)
        tok = torch.cat([best_tok, want_tok], dim=1)  # (n k, m)
        lp = torch.cat([best_lp, want_lp], dim=1)
        m = tok.size(1)
        bank = state.gains(tok).view(n, k * m)
        raw = (self.raw.reshape(n * k, 1) + lp).view(n, k * m)  # (n, k m)
        dealt, rank = round_robin(raw, bank, state.width + 1)  # (n, k m) each
        # First the EOS candidates that end (among the k best of their bank: every phrase
        # written), then the rest as dealt, the EOS candidates that do not end last: the search
        # below ends the EOS among the first k and takes its beams from the first k others.
        place = torch.empty_like(dealt).scatter_(
            1, dealt, torch.arange(k * m, device=dealt.device).expand(n, -1))  # (n, k m)
        eos = tok.view(n, k * m) == EOS_ID
        group = torch.where(eos, torch.where((rank < k) & torch.isfinite(raw), 0, 2), 1)
        order = (group * (k * m) + place).argsort(dim=1)[:, :n_cand]  # (n, n_cand)
        return (raw.gather(1, order), order // m, tok.view(n, k * m).gather(1, order),
                lp.view(n, k * m).gather(1, order), bank.gather(1, order))

    @torch.inference_mode()
    def settled(self) -> list[tuple[Hashable, list[int]]]:
        """(key, settled prefix) of every live sentence, read between steps without changing
        the search: the pieces every hypothesis still in contention for the sentence's best
        translation shares, so its final best translation starts with them (streaming, `aiayn
        serve`).

        In contention: the live beams (finite raw score) and the best finished hypothesis,
        pool slot 0. Nothing else can end first: every later hypothesis extends a live beam,
        and a finished one below slot 0 stays below it (the pool only gains, in order). A
        finished hypothesis counts with its own length, so a short one that may still win
        holds the prefix back even where the live beams agree. The prefix never shrinks: the
        contenders of the next step all extend this step's. One comparison along the time
        axis: (n, k + 1, t) tokens against beam 0's (alive in every live sentence)."""
        n, k = self.sentences, self.k
        if not n:
            return []
        width = int(self.t.max())
        if not width:
            return [(key, []) for key in self.keys]
        tok = torch.cat([self.hist_tok[:, :, :width], self.pool.tok[:, :1, :width]], dim=1)
        length = torch.cat([self.t[:, None].expand(n, k), self.pool.length[:, :1]], dim=1)
        alive = torch.cat([torch.isfinite(self.raw), torch.isfinite(self.pool.score[:, :1])], dim=1)
        pos = torch.arange(width, device=tok.device)
        agree = (tok == tok[:, :1]) & (pos < length[..., None])  # (n, k + 1, width)
        agree |= ~alive[..., None]  # an empty beam or pool slot contends for nothing
        size = agree.all(dim=1).long().cumprod(dim=1).sum(dim=1).tolist()  # (n,)
        first = self.hist_tok[:, 0, :width].tolist()
        return [(key, first[i][: size[i]]) for i, key in enumerate(self.keys)]


def _to_hypotheses(final: _Pool, nbest: int, src_lens: list[int],
                   a_shape: tuple[int, int] | None = None) -> list[list[Hypothesis]]:
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
            w = None
            if final.attn is not None:  # (steps, L' h', S_i) -> (L', h', steps, S_i)
                w = final.attn[i, j, :steps, :, : src_lens[i]].reshape(steps, *a_shape, -1)
                w = w.permute(1, 2, 0, 3).contiguous()
            hyps.append(Hypothesis(tok[i][j][: length[i][j]], score[i][j], raw[i][j],
                                   bool(complete[i][j]), tlp[i][j][:steps], w))
        out.append(hyps)
    return out
