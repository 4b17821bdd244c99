"""Token-budget batching (§5.1) and collation, checked against direct reference computations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from aiayn.data.batching import (
    Batch,
    TokenBatchSampler,
    collate,
    cut_points,
    length_batches,
    length_groups,
    pad_rows,
    split_for_ranks,
)
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from aiayn.errors import UserError


def lengths(n=2000, seed=0, lo=1, hi=60):
    rng = np.random.default_rng(seed)
    src = rng.integers(lo, hi, n)
    tgt = np.clip(src + rng.integers(-8, 9, n), 0, None)
    return src, tgt


def check_budget(batches, src, tgt, max_tokens):
    for b in batches:
        assert len(b) * (src[b].max() + 1) <= max_tokens  # padded source incl. EOS
        assert len(b) * (tgt[b].max() + 1) <= max_tokens  # padded target incl. BOS/EOS


def runs(k_sorted):
    """A sorted width per pair as (widths, ends) runs, the form cut_points takes."""
    widths, counts = np.unique(k_sorted, return_counts=True)
    return widths, np.cumsum(counts)


def check_exactly_once(batches, n):
    allidx = np.concatenate(batches)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))


@pytest.mark.parametrize("max_tokens", [68, 200, 1000, 5000])
def test_budget_and_every_pair_once(max_tokens):
    src, tgt = lengths()
    s = TokenBatchSampler(src, tgt, max_tokens, seed=3)
    for epoch in range(3):
        batches = list(s)
        assert s.epoch == epoch and len(batches) == len(s)
        check_budget(batches, src, tgt, max_tokens)
        check_exactly_once(batches, len(src))


def test_batches_are_greedy_full():
    # Sorted by width, no batch could have taken the next pair of the sorted run.
    src, tgt = lengths(500, seed=1)
    k = np.sort(np.maximum(src, tgt) + 1)
    b = cut_points(*runs(k), 300)
    for j in range(len(b) - 2):
        size = b[j + 1] - b[j]
        assert size * k[b[j + 1] - 1] <= 300
        assert (size + 1) * k[b[j + 1]] > 300


def test_an_unbounded_budget_over_int32_widths_is_one_batch():
    # a dataset's lengths are int32; "no token limit" (translation by sentence count) is huge
    k = np.array([2, 3, 3, 7], np.int32)
    assert cut_points(*runs(k), 2**63 - 1).tolist() == [0, 4]
    assert cut_points(*runs(k), 2**63 - 1, max_sentences=3).tolist() == [0, 3, 4]


def greedy_cuts(k, max_tokens, max_sentences=None):
    """The cutting rule pair by pair: a batch ends where one more pair would break a limit."""
    starts, size, widest = [0], 0, 0
    for i, w in enumerate(k):
        if size and ((size + 1) * max(widest, w) > max_tokens or size == (max_sentences or size + 1)):
            starts.append(i)
            size, widest = 0, 0
        size, widest = size + 1, max(widest, w)
    return starts + [len(k)] if len(k) else [0]


@pytest.mark.parametrize("seed", range(20))
def test_cut_points_over_runs_equal_the_rule_pair_by_pair(seed):
    # cut_points jumps over whole runs of full batches; the rule walked one pair at a time
    rng = np.random.default_rng(seed)
    k = np.sort(rng.integers(1, int(rng.integers(2, 80)), int(rng.integers(0, 400))))
    max_tokens = int(rng.integers(1, 600))
    max_sentences = None if seed % 2 else int(rng.integers(1, 30))
    assert cut_points(*runs(k), max_tokens, max_sentences).tolist() == greedy_cuts(k, max_tokens, max_sentences)


def test_same_seed_same_batches_different_seed_or_epoch_differs():
    src, tgt = lengths()
    a = TokenBatchSampler(src, tgt, 800, seed=7)
    b = TokenBatchSampler(src, tgt, 800, seed=7)
    c = TokenBatchSampler(src, tgt, 800, seed=8)
    ea, eb, ec = list(a), list(b), list(c)
    assert all(np.array_equal(x, y) for x, y in zip(ea, eb)) and len(ea) == len(eb)
    assert [x.tolist() for x in ea] != [x.tolist() for x in ec]
    assert [x.tolist() for x in list(a)] != [x.tolist() for x in ea]  # next epoch reshuffled


def test_batches_group_similar_lengths():
    src, tgt = lengths(3000)
    s = TokenBatchSampler(src, tgt, 2000, seed=0)
    spread = np.mean([np.ptp(np.maximum(src[b], tgt[b])) for b in s.epoch_batches()])
    rng = np.random.default_rng(0)
    random_spread = np.mean([np.ptp(np.maximum(src, tgt)[rng.choice(3000, 40)]) for _ in range(50)])
    assert spread < 0.1 * random_spread


def test_resume_mid_epoch_equals_uninterrupted():
    src, tgt = lengths()
    full = TokenBatchSampler(src, tgt, 700, seed=11)
    reference = [b.tolist() for _ in range(3) for b in full]  # three epochs straight

    first = TokenBatchSampler(src, tgt, 700, seed=11)
    got = []
    it = iter(first)
    for _ in range(len(first) + 5):  # past the first epoch, into the second
        if len(got) == len(first):
            it = iter(first)
        got.append(next(it).tolist())
    state = first.state_dict()
    assert state["epoch"] == 1 and state["position"] == 5

    resumed = TokenBatchSampler(src, tgt, 700, seed=11)
    resumed.load_state_dict(state)
    got += [b.tolist() for b in resumed]  # rest of epoch 1
    got += [b.tolist() for b in resumed]  # epoch 2
    assert got == reference


def test_an_epoch_is_planned_only_as_far_as_its_batches_are_taken():
    # start-up independent of the corpus: the first batch shuffles only the length groups it
    # holds pairs of; a whole epoch shuffles each group once
    src, tgt = lengths(5000, hi=120)
    s = TokenBatchSampler(src, tgt, 600, seed=2)
    first = next(iter(s))
    plan = s._plan
    positions = np.flatnonzero(np.isin(s.groups.members, first))  # where its pairs sit in key order
    touched = set(np.searchsorted(s.groups.ends, positions, side="right").tolist())
    assert set(plan._shuffled) == touched and len(touched) < len(s.groups.ends) // 10
    for _ in s:
        pass
    assert len(plan._shuffled) == len(s.groups.ends)


def test_state_at_epoch_end_resumes_next_epoch():
    src, tgt = lengths(300)
    s = TokenBatchSampler(src, tgt, 500, seed=2)
    list(s)
    t = TokenBatchSampler(src, tgt, 500, seed=2)
    t.load_state_dict(s.state_dict())
    assert [b.tolist() for b in t] == [b.tolist() for b in s]
    assert t.epoch == s.epoch == 1


def test_resume_refuses_different_settings():
    src, tgt = lengths(300)
    state = TokenBatchSampler(src, tgt, 500, seed=2).state_dict()
    with pytest.raises(UserError, match="seed=2, now 3"):
        TokenBatchSampler(src, tgt, 500, seed=3).load_state_dict(state)
    with pytest.raises(UserError, match="world_size=1, now 2"):
        TokenBatchSampler(src, tgt, 500, seed=2, world_size=2).load_state_dict(state)


@pytest.mark.parametrize("world_size", [2, 3, 4, 7])
def test_rank_shards_disjoint_complete_equal(world_size):
    src, tgt = lengths(1001)
    samplers = [TokenBatchSampler(src, tgt, 900, seed=5, rank=r, world_size=world_size)
                for r in range(world_size)]
    for epoch in range(2):
        shards = [list(s) for s in samplers]
        assert len({len(sh) for sh in shards}) == 1  # same number of steps on every rank
        assert all(len(sh) == len(samplers[0]) for sh in shards)
        check_exactly_once([b for sh in shards for b in sh], len(src))
        check_budget([b for sh in shards for b in sh], src, tgt, 900)


def test_split_for_ranks_splits_largest():
    k = np.array([2, 2, 2, 2, 3, 3, 3, 3, 3, 3], np.int64)
    b = split_for_ranks(np.array([0, 4, 10]), *runs(k), 3)  # batch 1 (6 pairs x 3) is the largest
    assert b.tolist() == [0, 4, 7, 10]
    with pytest.raises(UserError, match="same number of batches"):
        split_for_ranks(np.array([0, 1, 2, 3]), *runs(k[:3]), 2)


def test_oversize_pair_is_an_error_or_alone():
    src = np.array([5, 7, 300, 6])
    tgt = np.array([5, 7, 10, 6])
    with pytest.raises(UserError, match="pair 2 has 301 source / 11 target tokens.*--max-len 99"):
        TokenBatchSampler(src, tgt, 100)
    s = TokenBatchSampler(src, tgt, 100, allow_oversize=True)
    batches = list(s)
    check_exactly_once(batches, 4)
    assert [2] in [b.tolist() for b in batches]
    check_budget([b for b in batches if 2 not in b], src, tgt, 100)


def test_unshuffled_is_sorted_and_seed_free():
    src, tgt = lengths(500)
    a = list(TokenBatchSampler(src, tgt, 600, shuffle=False, seed=1))
    b = list(TokenBatchSampler(src, tgt, 600, shuffle=False, seed=2))
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    widths = [np.maximum(src[x], tgt[x]).max() for x in a]
    assert widths == sorted(widths)


@pytest.mark.parametrize("n", [0, 1, 7, 3000])
def test_length_groups_order_pairs_by_width_then_difference(n):
    src, tgt = lengths(n, seed=n, lo=0, hi=200)
    g = length_groups(src.astype(np.int32), tgt.astype(np.int32))
    k = np.maximum(src, tgt) + 1
    key = [(int(k[i]), int(tgt[i] - src[i])) for i in range(n)]
    order = sorted(range(n), key=lambda i: key[i])  # stable: ties in index order
    assert g.members.tolist() == order
    ends = [i + 1 for i in range(n) if i == n - 1 or key[order[i]] != key[order[i + 1]]]
    assert g.ends.tolist() == ends and g.widths.tolist() == [key[order[e - 1]][0] for e in ends]
    # the same grouping chunk by chunk, and by np.unique for keys too spread for the table
    for other in (length_groups(src, tgt, chunk=13), length_groups(src, tgt, table_limit=0)):
        assert np.array_equal(other.members, g.members) and np.array_equal(other.ends, g.ends)
        assert np.array_equal(other.widths, g.widths)


def test_padding_fraction_matches_direct_count():
    src, tgt = lengths(800)
    s = TokenBatchSampler(src, tgt, 1500, seed=0)
    real = padded = 0
    for b in s.epoch_batches(all_ranks=True):
        for side in (src, tgt):
            real += (side[b] + 1).sum()
            padded += len(b) * (side[b].max() + 1)
    assert s.padding_fraction == pytest.approx(1 - real / padded)
    assert 0 < s.padding_fraction < 0.2


# --- collate ------------------------------------------------------------------------------------


class ListDataset:
    def __init__(self, pairs):
        self.pairs = pairs

    def __getitem__(self, i):
        return self.pairs[i]


class FlatDataset:
    """The memory layout of ParallelDataset (concatenated ids + offsets): exercises the fast path."""

    def __init__(self, pairs):
        for side, j in (("src", 0), ("tgt", 1)):
            seqs = [np.asarray(p[j], np.uint16) for p in pairs]
            setattr(self, f"{side}_ids", np.concatenate(seqs))
            setattr(self, f"{side}_offsets", np.concatenate([[0], np.cumsum([len(x) for x in seqs])]))


def reference_collate(pairs, indices):
    rows = [pairs[i] for i in indices]
    S = max(len(s) for s, _ in rows) + 1
    T = max(len(t) for _, t in rows) + 1
    src = [list(s) + [EOS_ID] + [PAD_ID] * (S - len(s) - 1) for s, _ in rows]
    tin = [[BOS_ID] + list(t) + [PAD_ID] * (T - len(t) - 1) for _, t in rows]
    tout = [list(t) + [EOS_ID] + [PAD_ID] * (T - len(t) - 1) for _, t in rows]
    return src, tin, tout


@pytest.fixture
def pairs():
    rng = np.random.default_rng(4)
    def seq(max_len):
        return rng.integers(4, 500, rng.integers(0, max_len)).tolist()

    return [(seq(12), seq(15)) for _ in range(60)]


@pytest.mark.parametrize("make", [ListDataset, FlatDataset])
def test_collate_layout(pairs, make):
    indices = [3, 17, 0, 42, 59, 8]
    batch = collate(make(pairs), indices)
    src, tin, tout = reference_collate(pairs, indices)
    assert batch.src.tolist() == src and batch.tgt_in.tolist() == tin and batch.tgt_out.tolist() == tout
    assert batch.src.dtype == batch.tgt_in.dtype == batch.tgt_out.dtype == torch.long
    assert batch.n_src_tokens == int((batch.src != PAD_ID).sum())
    assert batch.n_src_tokens == sum(len(pairs[i][0]) + 1 for i in indices)
    assert batch.n_tgt_tokens == int((batch.tgt_out != PAD_ID).sum())
    assert batch.indices.tolist() == indices and len(batch) == 6
    assert torch.equal(batch.src_mask, batch.src != PAD_ID) and batch.src_mask.dtype == torch.bool
    shifted = torch.where(batch.tgt_out[:, :-1] == EOS_ID, PAD_ID, batch.tgt_out[:, :-1])
    assert torch.equal(batch.tgt_in[:, 1:], shifted)  # decoder input = target shifted right (§3.1)


def test_collate_empty_sentences():
    batch = collate(ListDataset([([], []), ([5], [6, 7])]), [0, 1])
    assert batch.src.tolist() == [[EOS_ID, PAD_ID], [5, EOS_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, PAD_ID, PAD_ID], [BOS_ID, 6, 7]]
    assert batch.tgt_out.tolist() == [[EOS_ID, PAD_ID, PAD_ID], [6, 7, EOS_ID]]


def test_batch_to_keeps_content(pairs):
    batch = collate(ListDataset(pairs), [1, 2, 3])
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.tgt_out, batch.tgt_out)
    assert moved.n_tgt_tokens == batch.n_tgt_tokens


def test_sampler_and_collate_shapes_respect_budget(pairs):
    src = np.array([len(p[0]) for p in pairs])
    tgt = np.array([len(p[1]) for p in pairs])
    ds = FlatDataset(pairs)
    for idx in TokenBatchSampler(src, tgt, 48, seed=0):
        b = collate(ds, idx)
        assert b.src.numel() <= 48 and b.tgt_in.numel() <= 48 and b.tgt_out.numel() <= 48


def test_length_batches_cover_everything_longest_first():
    lengths = [2, 9, 0, 6, 6, 1, 29]  # pieces; the budget counts them + EOS
    batches = [b.tolist() for b in length_batches(lengths, 20)]
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches[0] == [6]  # too long for the budget: a batch of its own
    for b in batches:
        assert len(b) == 1 or len(b) * (max(lengths[i] for i in b) + 1) <= 20
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest, reverse=True)
    assert all(len(b) <= 2 for b in length_batches(lengths, 1000, max_sentences=2))
    # the target side counts too when given
    for b in length_batches([1, 1, 1, 1], 8, tgt_lengths=[1, 1, 3, 3]):
        assert len(b) * (max([1, 1, 3, 3][i] for i in b) + 1) <= 8


@pytest.mark.parametrize("multiple", [1, 8])
def test_pad_multiple_rounds_widths_and_charges_them(multiple):
    rng = np.random.default_rng(4)
    pairs = [(rng.integers(4, 50, rng.integers(1, 30)).tolist(), rng.integers(4, 50, rng.integers(1, 30)).tolist())
             for _ in range(300)]
    ds = ListDataset(pairs)
    s = TokenBatchSampler([len(p[0]) for p in pairs], [len(p[1]) for p in pairs], 256, seed=0,
                          pad_multiple=multiple)
    seen = []
    for idx in s.epoch_batches():
        b = collate(ds, idx, multiple)
        assert b.src.shape[1] % multiple == 0 and b.tgt_in.shape[1] % multiple == 0
        assert b.src.numel() <= 256 and b.tgt_in.numel() <= 256
        # the rounding only adds PAD columns: the unpadded batch is a prefix of the padded one
        plain = collate(ds, idx)
        assert torch.equal(b.src[:, : plain.src.shape[1]], plain.src)
        assert (b.src[:, plain.src.shape[1]:] == PAD_ID).all()
        assert torch.equal(b.tgt_out[:, : plain.tgt_out.shape[1]], plain.tgt_out)
        seen += idx.tolist()
    assert sorted(seen) == list(range(len(pairs)))


def test_pad_rows_right_and_left():
    rows = [[5, 6, 7], [], [8]]
    right, n = pad_rows(rows, extra=1, pad_id=9)
    assert right.tolist() == [[5, 6, 7, 9], [9, 9, 9, 9], [8, 9, 9, 9]] and n.tolist() == [3, 0, 1]
    left, _ = pad_rows(rows, extra=0, multiple=4, pad_id=9, left=True)
    assert left.tolist() == [[9, 5, 6, 7], [9, 9, 9, 9], [9, 9, 9, 8]]


def shape_counts(src_len, tgt_len, max_tokens: int, multiple: int, epochs: int) -> dict:
    """Batches per epoch, distinct (B, S, T) shapes over `epochs` epochs, the padded share of the
    token slots and the real target tokens per batch, of the sampler's batches with widths
    rounded up to `multiple` (what docs/experiments/performance.md tabulates)."""
    sampler = TokenBatchSampler(src_len, tgt_len, max_tokens, seed=1, pad_multiple=multiple)
    shapes, slots, real, tgt_real, n = set(), 0, 0, 0, 0
    for epoch in range(epochs):
        for b in sampler.epoch_batches(epoch):
            s = -(-int(src_len[b].max()) // multiple) * multiple
            t = -(-(int(tgt_len[b].max()) + 1) // multiple) * multiple  # + BOS / EOS
            shapes.add((len(b), s, t))
            slots += len(b) * (s + t)
            real += int(src_len[b].sum() + tgt_len[b].sum() + len(b))
            tgt_real += int(tgt_len[b].sum() + len(b))
            n += 1
    return {"batches_per_epoch": n // epochs, "distinct_shapes": len(shapes),
            "padding": 1 - real / slots, "real_tgt_tokens_per_batch": tgt_real / n}


def test_batch_shapes_counts_fewer_shapes_and_more_padding_for_larger_multiples():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(3, 60, 2000), rng.integers(3, 60, 2000)
    r1, r8 = (shape_counts(src, tgt, 1024, m, epochs=2) for m in (1, 8))
    assert r8["distinct_shapes"] < r1["distinct_shapes"]
    assert r1["padding"] < r8["padding"] < 1
    assert r8["real_tgt_tokens_per_batch"] < r1["real_tgt_tokens_per_batch"]
    # every pair is batched once per epoch: real target tokens add up to the corpus's
    assert abs(r1["real_tgt_tokens_per_batch"] * r1["batches_per_epoch"] - (tgt.sum() + len(tgt))) < 1e-6 * tgt.sum()
