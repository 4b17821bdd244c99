"""Search on a random tiny Transformer: beam 1 equals greedy, a sentence's output does not depend
on its batch, and the cached incremental search equals a slow reference written here that
re-runs `model.decode` on the whole prefix at every step."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from aiayn.decoding import source_batch
from aiayn.model import Transformer
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

from helpers import MICRO, beam_search, greedy_search

VOCAB = 24


class RampEos(Transformer):
    """A random model whose EOS logit grows with the target position, so that sentences end at
    different, input-dependent lengths (an untrained model otherwise ends at once or never).
    The bias is added in both `decode` and `decode_step`, so they still agree."""

    start, slope = -4.0, 0.6

    def decode(self, tgt_in, memory, src_mask, return_attention=False):
        out = super().decode(tgt_in, memory, src_mask).clone()
        out[..., EOS_ID] += self.start + self.slope * torch.arange(tgt_in.size(1)).float()
        return out

    def decode_step(self, tokens, cache):
        t = cache.length
        out = super().decode_step(tokens, cache).clone()
        out[:, EOS_ID] += self.start + self.slope * t
        return out


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    cfg = replace(MICRO, vocab_size=VOCAB, n_layers=2, d_model=32, d_ff=64,
                  n_heads=4, max_len_b=12)
    return RampEos(cfg).eval()


@pytest.fixture(scope="module")
def sources():
    g = torch.Generator().manual_seed(1)
    lengths = [1, 7, 3, 9, 2, 5, 8, 4, 6, 3]
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in lengths]


def key(h):
    return h.tokens, h.complete


def test_fixture_sentences_end_at_different_times(model, sources):
    hyps = greedy_search(model, *source_batch(sources))
    assert len({len(h.tokens) for h in hyps}) >= 3
    assert any(h.complete for h in hyps)


def test_beam_one_equals_greedy(model, sources):
    src, mask = source_batch(sources)
    greedy = greedy_search(model, src, mask)
    beam = beam_search(model, src, mask, beam_size=1, alpha=0.0)
    assert [key(h) for h in greedy] == [key(hs[0]) for hs in beam]
    for g, (b,) in zip(greedy, beam):
        assert b.score == pytest.approx(g.score, abs=1e-5)
        assert b.logprob == pytest.approx(g.logprob, abs=1e-5)
        assert b.token_logprobs == pytest.approx(g.token_logprobs, abs=1e-5)
    # With alpha > 0, beam 1 keeps looking after greedy's EOS and can only do better.
    for g, (b,) in zip(greedy, beam_search(model, src, mask, beam_size=1, alpha=0.6)):
        steps = len(g.tokens) + g.complete
        if g.complete:
            assert b.score >= g.logprob / ((5 + steps) / 6) ** 0.6 - 1e-5


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_output_does_not_depend_on_the_batch(model, sources, search):
    def run(batch):
        src, mask = source_batch(batch)
        if search == "greedy":
            return [[h] for h in greedy_search(model, src, mask)]
        return beam_search(model, src, mask, beam_size=4, nbest=2)

    together = run(sources)
    alone = [run([s])[0] for s in sources]
    halves = [None] * len(sources)
    halves[::2], halves[1::2] = run(sources[::2]), run(sources[1::2])
    reordered = run(sources[::-1])[::-1]
    for other in (alone, halves, reordered):
        for a, b in zip(together, other):
            assert [key(h) for h in a] == [key(h) for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


# --- the slow reference: no cache, whole prefix through `decode`, plain Python lists ----------

def _next_logprobs(model, src_ids, prefixes):
    """log p(. | prefix) for each prefix (lists of ids, no BOS), by a full `decode` pass."""
    n = len(prefixes)
    src = torch.tensor([src_ids + [EOS_ID]] * n)
    mask = src != PAD_ID
    tgt_in = torch.tensor([[BOS_ID] + p for p in prefixes])
    with torch.no_grad():
        logits = model.decode(tgt_in, model.encode(src, mask), mask)[:, -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    logp[:, [PAD_ID, BOS_ID]] = float("-inf")
    return logp.tolist()


def reference_greedy(model, src_ids, a=1.0, b=12):
    limit = math.floor(a * (len(src_ids) + 1) + b)
    tokens, total = [], 0.0
    for _ in range(limit):
        logp = _next_logprobs(model, src_ids, [tokens])[0]
        tok = max(range(len(logp)), key=logp.__getitem__)
        total += logp[tok]
        if tok == EOS_ID:
            return tokens, total, True
        tokens.append(tok)
    return tokens, total, False


def reference_beam(model, src_ids, k, alpha, nbest, a=1.0, b=12):
    """Beam search as the module docstring states it, one sentence, re-decoding every prefix."""
    limit = math.floor(a * (len(src_ids) + 1) + b)
    lp = lambda n: ((5 + n) / 6) ** alpha  # noqa: E731
    live = [([], 0.0)]
    finished = []  # (complete, score, raw, tokens)
    for t in range(1, limit + 1):
        logp = _next_logprobs(model, src_ids, [toks for toks, _ in live])
        cands = sorted(((raw + x, i, v) for i, (_, raw) in enumerate(live)
                        for v, x in enumerate(logp[i]) if x > float("-inf")),
                       reverse=True)[: 2 * k]
        new_live = []
        for rank, (s, i, v) in enumerate(cands):
            if v == EOS_ID:
                if rank < k:
                    finished.append((True, s / lp(t), s, live[i][0]))
            elif len(new_live) < k:
                new_live.append((live[i][0] + [v], s))
        live = new_live
        if t == limit:
            finished += [(False, s / lp(t), s, toks) for toks, s in live]
            break
        done = sorted((f for f in finished if f[0]), key=lambda f: -f[1])
        if len(done) >= nbest and live[0][1] / lp(limit) <= done[nbest - 1][1]:
            break
    finished.sort(key=lambda f: (f[0], f[1]), reverse=True)
    return [(toks, score, complete) for complete, score, _, toks in finished[:nbest]]


def test_cached_greedy_equals_uncached_reference(model, sources):
    hyps = greedy_search(model, *source_batch(sources))
    for s, h in zip(sources, hyps):
        tokens, total, complete = reference_greedy(model, s)
        assert (h.tokens, h.complete) == (tokens, complete)
        assert h.logprob == pytest.approx(total, abs=1e-4)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_cached_beam_equals_uncached_reference(model, sources, alpha):
    found = beam_search(model, *source_batch(sources), beam_size=4, alpha=alpha, nbest=3)
    for s, hyps in zip(sources, found):
        ref = reference_beam(model, s, k=4, alpha=alpha, nbest=3)
        assert [(h.tokens, h.complete) for h in hyps] == [(t, c) for t, _, c in ref]
        assert [h.score for h in hyps] == pytest.approx([sc for _, sc, _ in ref], abs=1e-4)


def test_early_stopping_changes_no_result(model, sources):
    src, mask = source_batch(sources)
    for nbest in (1, 3):
        fast = beam_search(model, src, mask, beam_size=4, nbest=nbest)
        slow = beam_search(model, src, mask, beam_size=4, nbest=nbest, early_stop=False)
        assert [[key(h) for h in hs] for hs in fast] == [[key(h) for h in hs] for hs in slow]
    # nbest only cuts the list: its head is the same.
    one = beam_search(model, src, mask, beam_size=4, nbest=1)
    three = beam_search(model, src, mask, beam_size=4, nbest=3)
    assert [key(a[0]) for a in one] == [key(b[0]) for b in three]


def test_bf16_autocast_runs_and_scores_stay_finite(model, sources):
    src, mask = source_batch(sources[:3])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = beam_search(model, src, mask)
        greedy = greedy_search(model, src, mask)
    assert all(math.isfinite(hs[0].score) for hs in found)
    assert all(math.isfinite(h.score) for h in greedy)


def test_bf16_weights_translator_scores_agree_with_fp32(model_dir):
    # Cast-once bf16 weights must compute the fp32 model's distribution up to bf16 rounding: the
    # per-token log-probs a bf16 search reports equal the fp32 model's, teacher-forced on the same
    # outputs, within 0.05 nats. (Argmax ties of a random model may break differently.)
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator

    lines = ["the cat sat on the mat", "a dog runs", "die kinder spielen im garten"]
    auto = Translator(load_model(model_dir), precision="bf16", convert=False)
    assert next(auto.model.parameters()).dtype == torch.float32  # left as it was
    cast = Translator(load_model(model_dir), precision="bf16", greedy=True)
    assert next(cast.model.parameters()).dtype == torch.bfloat16
    ids = cast.prepare(lines)
    found = [h[0] for h in cast.search(ids)]
    fp32 = load_model(model_dir).model.eval()
    src, mask = source_batch(ids)
    for i, h in enumerate(found):
        steps = len(h.token_logprobs)
        tgt_in = torch.tensor([[BOS_ID] + h.tokens + [EOS_ID]])[:, :steps]  # (1, steps)
        out = (h.tokens + [EOS_ID])[:steps]
        with torch.no_grad():
            logp = fp32(src[i : i + 1], tgt_in, mask[i : i + 1]).float().log_softmax(-1)[0]
        ref = [logp[t, y].item() for t, y in enumerate(out)]
        assert steps > 0 and max(abs(a - b) for a, b in zip(h.token_logprobs, ref)) < 0.05
