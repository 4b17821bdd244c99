"""The model against independent computations: attention, masks, padding, caching, embeddings."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from aiayn import Transformer
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.embedding import sinusoidal_table

from helpers import MICRO

MICRO = replace(MICRO, vocab_size=40, p_drop=0.0)

VARIANTS = {
    "paper": MICRO,
    "d_k!=d_model/h": replace(MICRO, n_heads=3, d_k=7, d_v=11),
    "pre-norm": replace(MICRO, norm="pre"),
    "learned-positions": replace(MICRO, positions="learned", max_positions=64),
    "window": replace(MICRO, attn_window=2),
    "untied": replace(MICRO, tie_embeddings=False, tgt_vocab_size=33, tie_output=False),
    "attn-bias": replace(MICRO, attn_bias=True),
}


def make(cfg, seed=0):
    torch.manual_seed(seed)
    return Transformer(cfg).eval()


def rand_batch(cfg, b=3, s=9, t=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, cfg.src_vocab, (b, s), generator=g)
    tgt = torch.randint(4, cfg.tgt_vocab, (b, t), generator=g)
    return src, tgt


def test_multihead_attention_equals_independent_computation():
    cfg = replace(MICRO, d_model=12, n_heads=3, d_k=5, d_v=4, attn_bias=True)
    torch.manual_seed(0)
    mha = MultiHeadAttention(cfg, self_attention=False).double().eval()
    torch.nn.init.normal_(mha.q_proj.bias)
    torch.nn.init.normal_(mha.kv_proj.bias)
    x = torch.randn(2, 4, 12, dtype=torch.float64)
    mem = torch.randn(2, 6, 12, dtype=torch.float64)
    key_ok = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)

    with torch.no_grad():
        q = mha.project_q(x)
        k, v = mha.project_kv(mem)
        out, _ = mha.attend(q, k, v, key_ok[:, None, None, :])
        expected = independent_attention(mha, x, mem, key_ok)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def independent_attention(mha, x, mem, key_ok):

    # Independent: per batch row, per head, per query, with plain loops and math.exp.
    wq, bq = mha.q_proj.weight, mha.q_proj.bias
    wk, wv = mha.kv_proj.weight[:15], mha.kv_proj.weight[15:]
    bk, bv = mha.kv_proj.bias[:15], mha.kv_proj.bias[15:]
    expected = torch.zeros(2, 4, 12, dtype=torch.float64)
    for b in range(2):
        heads = []
        for i in range(3):
            Q = x[b] @ wq[i * 5:(i + 1) * 5].T + bq[i * 5:(i + 1) * 5]
            K = mem[b] @ wk[i * 5:(i + 1) * 5].T + bk[i * 5:(i + 1) * 5]
            V = mem[b] @ wv[i * 4:(i + 1) * 4].T + bv[i * 4:(i + 1) * 4]
            rows = []
            for tq in range(4):
                allowed = [j for j in range(6) if key_ok[b, j]]
                e = [math.exp(float(Q[tq] @ K[j]) / math.sqrt(5)) for j in allowed]
                z = sum(e)
                rows.append(sum((e_j / z) * V[j] for e_j, j in zip(e, allowed)))
            heads.append(torch.stack(rows))
        expected[b] = mha.out_proj(torch.cat(heads, dim=-1))
    return expected


@pytest.mark.parametrize("name", VARIANTS)
def test_explicit_weights_path_equals_fused_path(name):
    cfg = VARIANTS[name]
    model = make(cfg)
    src, tgt = rand_batch(cfg)
    src[1, 6:] = 0  # padding
    fused = model(src, tgt)
    explicit, weights = model(src, tgt, return_attention=True)
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-5)
    for w in weights["encoder"] + weights["self"] + weights["cross"]:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    # padded source keys get no weight; future target positions get no weight
    assert weights["cross"][0][1, :, :, 6:].abs().max() == 0
    assert torch.triu(weights["self"][0], diagonal=1).abs().max() == 0


@pytest.mark.parametrize("name", VARIANTS)
def test_no_leakage_from_future_target_tokens(name):
    cfg = VARIANTS[name]
    model = make(cfg)
    src, tgt = rand_batch(cfg, t=8)
    base = model(src, tgt)
    for t in range(tgt.size(1) - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = torch.randint(4, cfg.tgt_vocab, changed[:, t + 1:].shape)
        out = model(src, changed)
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", VARIANTS)
def test_padding_changes_no_real_position(name):
    cfg = VARIANTS[name]
    model = make(cfg)
    src_lens, tgt_lens = [5, 9, 3], [4, 7, 2]
    g = torch.Generator().manual_seed(3)
    seqs_s = [torch.randint(4, cfg.src_vocab, (n,), generator=g) for n in src_lens]
    seqs_t = [torch.randint(4, cfg.tgt_vocab, (n,), generator=g) for n in tgt_lens]

    def pad(seqs, width):
        return torch.stack([torch.cat([s, s.new_zeros(width - len(s))]) for s in seqs])

    tight = model(pad(seqs_s, 9), pad(seqs_t, 7))
    loose = model(pad(seqs_s, 15), pad(seqs_t, 12))
    for i, n in enumerate(tgt_lens):
        torch.testing.assert_close(loose[i, :n], tight[i, :n], rtol=0, atol=1e-5)
        alone = model(seqs_s[i][None], seqs_t[i][None])[0]  # no padding at all
        torch.testing.assert_close(tight[i, :n], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_step_decoding_equals_full_forward(name):
    cfg = VARIANTS[name]
    model = make(cfg)
    src, tgt = rand_batch(cfg, t=11)
    src[0, 5:] = 0
    full = model(src, tgt)
    mask = src != 0
    cache = model.new_cache(model.encode(src, mask), mask, capacity=3)  # forces the cache to grow
    steps = torch.stack([model.decode_step(tgt[:, i:i + 1], cache) for i in range(tgt.size(1))], 1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-5)
    assert cache.length == tgt.size(1)


def test_cache_reorder_selects_batch_rows():
    model = make(MICRO)
    src, tgt = rand_batch(MICRO, b=3, t=5)
    mask = src != 0
    cache = model.new_cache(model.encode(src, mask), mask)
    for i in range(3):
        model.decode_step(tgt[:, i:i + 1], cache)
    index = torch.tensor([2, 2, 0])
    cache.reorder(index)
    nxt = model.decode_step(tgt[index, 3:4], cache)
    full = model(src[index], tgt[index, :4])[:, -1]
    torch.testing.assert_close(nxt, full, rtol=0, atol=1e-5)


def test_cache_holds_at_most_one_spare_layer_buffer():
    """Reordering at every step (beam search) and growing keep the cache's self-attention state to
    its layers' buffers plus one spare of a layer's size, never a second copy of the whole cache;
    and each step's result still equals the full forward pass."""
    cfg = replace(MICRO, n_layers=3)
    model = make(cfg)
    src, tgt = rand_batch(cfg, b=3, t=9)
    mask = src != 0
    cache = model.new_cache(model.encode(src, mask), mask, capacity=2)
    rows = torch.arange(3)
    swaps = [torch.tensor(p) for p in ([1, 0, 2], [2, 2, 0], [0, 1, 1], [1, 2, 0])]

    def storages() -> set[int]:
        bufs = [*cache.self_k, *cache.self_v] + ([cache._spare] if cache._spare is not None else [])
        return {b.untyped_storage().data_ptr() for b in bufs}

    for t in range(8):
        cache.reorder(swaps[t % 4], cross_index=True)
        rows = rows[swaps[t % 4]]
        step = model.decode_step(tgt[rows, t : t + 1], cache)  # grows at t = 2, 4, ... (capacity 2)
        full = model(src[rows], tgt[rows, : t + 1])[:, -1]
        torch.testing.assert_close(step, full, rtol=0, atol=1e-5)
        assert len(storages()) <= 2 * cfg.n_layers + 1
        if cache._spare is not None:
            assert cache._spare.shape == cache.self_k[0].shape
    cache.reorder(torch.tensor([1]))  # a smaller batch: new buffers, none of the old kept
    assert cache.batch_size == 1 and all(b.size(0) == 1 for b in [*cache.self_k, *cache.self_v])
    assert cache._spare is None


def test_slots_past_the_filled_ones_are_never_read():
    """The cache's buffers are allocated, grown and reordered without zeroing: poisoning every slot
    past the filled ones with NaN before each step must not change a result."""
    model = make(MICRO)
    src, tgt = rand_batch(MICRO, b=3, t=10)
    mask = src != 0
    cache = model.new_cache(model.encode(src, mask), mask, capacity=1)
    rows = torch.arange(3)
    for t in range(tgt.size(1)):
        for buf in [*cache.self_k, *cache.self_v]:
            buf[:, :, cache.filled:] = float("nan")
        step = model.decode_step(tgt[rows, t : t + 1], cache)
        full = model(src[rows], tgt[rows, : t + 1])[:, -1]
        torch.testing.assert_close(step, full, rtol=0, atol=1e-5)
        if t % 3:  # some steps reorder (into the spare buffer), some do not
            index = torch.tensor([[2, 0, 1], [1, 1, 0]][t % 2])
            cache.reorder(index)
            rows = rows[index]


def test_restricted_attention_limits_the_receptive_field():
    cfg = replace(MICRO, attn_window=1, n_layers=1)
    model = make(cfg)
    src, tgt = rand_batch(cfg, b=1, s=12, t=6)
    mem = model.encode(src)
    changed = src.clone()
    changed[0, 0] = 5 if src[0, 0] != 5 else 6
    # one layer, window 1: source position 0 influences only positions 0 and 1
    diff = (model.encode(changed) - mem).abs().amax(-1)[0]
    assert diff[:2].min() > 0 and diff[2:].max() == 0


def test_positional_encoding_matches_formula():
    d = 10
    table = sinusoidal_table(50, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_positions_extend_beyond_initial_table():
    model = make(MICRO)
    src = torch.randint(4, 40, (1, 1500))  # longer than the initial 1024-row table
    assert torch.isfinite(model.encode(src)).all()


def test_embeddings_are_scaled_and_tied():
    model = make(MICRO)
    ids = torch.tensor([[5, 6, 7]])
    torch.testing.assert_close(model.src_embed(ids), model.src_embed.weight[ids] * math.sqrt(64))
    # one matrix: source embedding, target embedding and pre-softmax projection
    assert model.target_embedding.weight is model.src_embed.weight
    mats = [p for p in model.parameters() if p.shape == (40, 64)]
    assert len(mats) == 1
    y = torch.randn(1, 2, 64)
    torch.testing.assert_close(model.logits(y), y @ model.src_embed.weight.T)
    untied = make(VARIANTS["untied"])
    assert untied.target_embedding.weight is not untied.src_embed.weight
    assert untied.out_proj.weight.shape == (33, 64)


def test_dropout_is_active_in_training_and_off_in_eval():
    cfg = replace(MICRO, p_drop=0.3)
    model = make(cfg)
    src, tgt = rand_batch(cfg)
    torch.testing.assert_close(model(src, tgt), model(src, tgt))
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))


def test_bf16_autocast_on_cpu():
    model = make(MICRO).train()
    src, tgt = rand_batch(MICRO)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(src, tgt)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    with torch.no_grad():
        ref = model(src, tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mask = src != 0
            cache = model.new_cache(model.encode(src, mask), mask)
            step = model.decode_step(tgt[:, :1], cache)
    assert (step.float() - ref[:, 0]).abs().max() < 0.1 * ref[:, 0].abs().max()


def test_cache_reorder_shrinks_batch_and_keeps_cross_state_when_asked():
    model = make(MICRO)
    src, tgt = rand_batch(MICRO, b=2, t=5)
    mask = src != 0
    cache = model.new_cache(model.encode(src, mask), mask)
    beams = torch.tensor([0, 0, 1, 1])
    cache.reorder(beams)  # expand to 2 "beams" per sentence
    model.decode_step(tgt[beams, :1], cache)
    swap = torch.tensor([1, 0, 3, 2])  # beams trade places within their sentence
    cache.reorder(swap, cross_index=None)
    model.decode_step(tgt[beams[swap], 1:2], cache)
    cache.reorder(torch.tensor([2]))  # only sentence 1 survives, a smaller batch
    nxt = model.decode_step(tgt[1:2, 2:3], cache)
    torch.testing.assert_close(nxt, model(src[1:2], tgt[1:2, :3])[:, -1], rtol=0, atol=1e-5)
    assert cache.batch_size == 1


@pytest.mark.parametrize("need_weights", [False, True])
def test_beams_sharing_one_cross_copy_equal_rows_with_their_own(need_weights):
    # beam search stores a sentence's cross-attention keys/values once for its k beams
    # (`reorder(beams, cross_index=None)`): its g rows are g queries against one copy
    model = make(MICRO)
    src, tgt = rand_batch(MICRO, b=3, t=4)
    mask = src != 0
    beams = torch.arange(3).repeat_interleave(2)  # (6,) two rows per sentence
    with torch.no_grad():
        memory = model.encode(src, mask)
        own = model.new_cache(memory, mask)
        own.reorder(beams)  # a copy per row
        shared = model.new_cache(memory, mask)
        shared.reorder(beams, cross_index=None)
        assert own.group == 1 and shared.group == 2 and shared.cross_k.size(1) == 3
        toks = tgt[beams]
        for i in range(3):
            a = model.decode_step(toks[:, i:i + 1], own, return_attention=need_weights)
            b = model.decode_step(toks[:, i:i + 1], shared, return_attention=need_weights)
            if need_weights:
                (a, wa), (b, wb) = a, b
                for x, y in zip(wa["cross"], wb["cross"]):
                    torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        # sentence 2 leaves: its rows and its one source row
        own.reorder(torch.tensor([1, 0, 3, 2]))
        shared.reorder(torch.tensor([1, 0, 3, 2]), cross_index=torch.tensor([0, 1]))
        assert shared.group == 2
        torch.testing.assert_close(model.decode_step(toks[:4, 3:4], own),
                                   model.decode_step(toks[:4, 3:4], shared), rtol=0, atol=1e-5)
