"""`min_len` (not in the paper): no EOS before a given output length, in greedy and beam search.

A fake model makes EOS the most probable token at every step, so without `min_len` every search
ends at once; with it, the searches must run to exactly `min_len` steps and then stop on EOS.
"""

from __future__ import annotations

import pytest
import torch

from aiayn.data.model_dir import load_model
from aiayn.decoding.common import source_batch
from aiayn.decoding.translate import SearchOptions, search_batched
from aiayn.special import EOS_ID

from helpers import beam_search, greedy_search

V = 9


class _Cache:
    def __init__(self, n: int):
        self.length = 0
        self.n = n

    def reorder(self, index, cross_index=None):
        self.n = index.numel()


class EagerEos:
    """log-probabilities: EOS -0.1, token 4 -2, token 5 -3, the rest -9 (unnormalised logits are
    fine: searches take a log-softmax)."""

    def encode(self, src, src_mask=None):
        return src

    def new_cache(self, memory, src_mask):
        return _Cache(memory.size(0))

    def decode_step(self, tokens, cache):
        cache.length += 1
        logits = torch.full((tokens.size(0), V), -9.0)
        logits[:, EOS_ID], logits[:, 4], logits[:, 5] = -0.1, -2.0, -3.0
        return logits


SOURCES = [[4, 5, 6], [7], [8, 8]]


@pytest.mark.parametrize("min_len", [0, 1, 4, 7])
def test_greedy_and_beam_end_no_earlier_than_min_len(min_len):
    src, src_mask = source_batch(SOURCES)
    want = [4] * max(min_len - 1, 0)  # then EOS, the |Y| = min_len-th token
    for h in greedy_search(EagerEos(), src, src_mask, max_len_a=0, max_len_b=20, min_len=min_len):
        assert h.tokens == want and h.complete and len(h.token_logprobs) == len(want) + 1
    for hyps in beam_search(EagerEos(), src, src_mask, beam_size=3, alpha=0.6, max_len_a=0,
                            max_len_b=20, nbest=3, min_len=min_len):
        assert hyps[0].tokens == want and hyps[0].complete
        assert all(h.complete and len(h.tokens) + 1 >= min_len for h in hyps)


def test_min_len_beyond_max_len_gives_cut_off_outputs():
    src, src_mask = source_batch(SOURCES)
    for h in greedy_search(EagerEos(), src, src_mask, max_len_a=0, max_len_b=5, min_len=30):
        assert h.tokens == [4] * 5 and not h.complete
    for hyps in beam_search(EagerEos(), src, src_mask, beam_size=2, max_len_a=0, max_len_b=5,
                            min_len=30):
        assert len(hyps[0].tokens) == 5 and not hyps[0].complete


def test_fixed_length_decoding_of_a_real_model(model_dir):
    """min_len = max_len: every sentence decodes exactly that many steps (the benchmarks' setup)."""
    model = load_model(model_dir).model
    ids = [[5, 6, 7], [8], [9, 10, 11, 12]]
    for greedy in (True, False):
        opts = SearchOptions(greedy=greedy, beam_size=3, max_len_a=0, max_len_b=6, min_len=6)
        for (h,) in search_batched(model, ids, opts):
            assert len(h.token_logprobs) == 6  # 6 pieces cut off, or 5 and EOS
    with pytest.raises(ValueError, match="min_len"):
        SearchOptions(min_len=-1).validate()
