"""BPE-dropout (aiayn.data.resegment): our merges equal sentencepiece's segmentation at p = 0, a
dropped merge may apply at a later step (hand-built merges), each epoch's segmentation spells the
same text, is a pure function of (seed, epoch) also across processes, degenerates to the prepared
segmentation as p -> 0, and the sampler over it batches every pair once within budget and resumes
mid-epoch exactly; the trainer uses it, resumes bit for bit, and refuses it on a vocabulary that is
not BPE."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aiayn.config import load_config
from aiayn.data.batching import collate
from aiayn.data.dataset import ParallelDataset
from aiayn.data.resegment import BpeDropout, Resegmenter, ResegmentingSampler
from aiayn.errors import UserError
from aiayn.training.trainer import TrainOptions, train
from test_training_fixtures import REPO, SMALL, tiny_dataset


@pytest.fixture(scope="module")
def bpe_data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("bpe"), model_type="bpe", vocab_size=80, byte_fallback=False)


@pytest.fixture(scope="module")
def ds(bpe_data):
    return ParallelDataset(bpe_data, "train")


def rows(ids, offsets):
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def test_merges_at_p0_are_sentencepieces_segmentation(ds):
    tok = ds.src_tokenizer
    bpe = BpeDropout(tok)
    words: set[str] = set()
    for i in range(len(ds)):
        words.update(tok.decode(ds[i][0].tolist()).split())
        words.update(tok.decode(ds[i][1].tolist()).split())
    words |= {"zebra", "quietly", "abba", "aaaa", "xyzzy"}  # words the training text may not have
    checked = 0
    for w in sorted(words):
        chars = bpe.chars("▁" + w)
        if chars is not None:
            assert bpe.segment(chars, 0.0, None) == tok.encode(w), w
            checked += 1
    assert checked > 0.9 * len(words)
    # so re-segmenting keeps every prepared word reachable: none is frozen
    assert [w.frozen for w in Resegmenter(ds, 0.1, seed=1, max_pieces=1000).words] == [0, 0]


def hand_built(merges):
    """A BpeDropout over the pieces a, b, c, d = 0..3 and the given {(x, y): (score, z)}."""
    bpe = BpeDropout.__new__(BpeDropout)
    bpe.merges, bpe.char_ids = merges, {}
    return bpe


def test_a_dropped_merge_may_apply_at_a_later_step():
    a, b, c, d, ab, cd, abcd = range(7)
    bpe = hand_built({(a, b): (-1.0, ab), (c, d): (-2.0, cd), (ab, cd): (-3.0, abcd)})
    assert bpe.segment([a, b, c, d], 0.0, None) == [abcd]
    # step 1: a+b dropped (0.0 < p), c+d kept; step 2: a+b drawn again and kept; step 3: ab+cd dropped
    draws = iter([0.0, 0.9, 0.9, 0.0])
    assert bpe.segment([a, b, c, d], 0.5, lambda: next(draws)) == [ab, cd]
    assert bpe.segment([a, b, c, d], 0.5, lambda: 0.0) == [a, b, c, d]  # every merge dropped
    # equal scores: the leftmost pair first, as sentencepiece
    aa = 4
    bpe = hand_built({(a, a): (-1.0, aa)})
    assert bpe.segment([a, a, a], 0.0, None) == [aa, a]


def test_each_epoch_spells_the_same_text_differently(ds):
    pairs = Resegmenter(ds, 0.3, seed=1, max_pieces=1000).epoch(0)
    tok = ds.src_tokenizer
    for side in ("src", "tgt"):
        prepared = rows(getattr(ds, f"{side}_ids"), getattr(ds, f"{side}_offsets"))
        sampled = rows(getattr(pairs, f"{side}_ids"), getattr(pairs, f"{side}_offsets"))
        assert [tok.decode(r) for r in sampled] == [tok.decode(r) for r in prepared]
        assert sum(map(len, sampled)) > 1.1 * sum(map(len, prepared))  # dropped merges: more pieces
        assert sum(a != b for a, b in zip(sampled, prepared)) > len(prepared) // 4


def test_segmentation_is_a_function_of_seed_and_epoch(ds):
    a, b = Resegmenter(ds, 0.3, seed=1, max_pieces=1000), Resegmenter(ds, 0.3, seed=1, max_pieces=1000)
    b.epoch(5)  # another epoch first, as after a resume: must not change epoch 0
    for x, y in zip(a.epoch(0).__dict__.values(), b.epoch(0).__dict__.values()):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.epoch(1).src_ids, a.epoch(0).src_ids) or not np.array_equal(
        a.epoch(1).src_offsets, a.epoch(0).src_offsets)
    c = Resegmenter(ds, 0.3, seed=2, max_pieces=1000).epoch(0)
    assert not (np.array_equal(c.tgt_offsets, a.epoch(0).tgt_offsets)
                and np.array_equal(c.tgt_ids, a.epoch(0).tgt_ids))


def epoch_digest(pairs):
    return hashlib.sha256(b"".join(x.tobytes() for x in pairs.__dict__.values())).hexdigest()


def test_segmentation_is_the_same_in_another_process(bpe_data, ds):
    """A resumed run is a new process: its epochs must be segmented exactly as before."""
    code = ("import hashlib, sys; from aiayn.data.dataset import ParallelDataset; "
            "from aiayn.data.resegment import Resegmenter; "
            "p = Resegmenter(ParallelDataset(sys.argv[1], 'train'), 0.3, seed=1, max_pieces=1000).epoch(2); "
            "print(hashlib.sha256(b''.join(x.tobytes() for x in p.__dict__.values())).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code, str(bpe_data)], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout.strip()
    assert out == epoch_digest(Resegmenter(ds, 0.3, seed=1, max_pieces=1000).epoch(2))


def test_vanishing_p_gives_the_prepared_segmentation(ds):
    pairs = Resegmenter(ds, 1e-9, seed=1, max_pieces=1000).epoch(3)
    assert np.array_equal(pairs.src_ids, ds.src_ids) and np.array_equal(pairs.src_offsets, ds.src_offsets)
    assert np.array_equal(pairs.tgt_ids, ds.tgt_ids) and np.array_equal(pairs.tgt_offsets, ds.tgt_offsets)


def test_too_long_samples_keep_the_prepared_segmentation(ds):
    limit = int(max(ds.src_lengths.max(), ds.tgt_lengths.max()))  # every prepared pair fits
    free = Resegmenter(ds, 0.5, seed=1, max_pieces=10**6).epoch(0)  # the same draws, no limit
    pairs = Resegmenter(ds, 0.5, seed=1, max_pieces=limit).epoch(0)
    over = np.flatnonzero(np.maximum(free.src_lengths, free.tgt_lengths) > limit)
    assert len(over) > 0
    for i in range(len(ds)):
        want = ds[i] if i in set(over.tolist()) else free[i]
        assert np.array_equal(pairs[i][0], want[0]) and np.array_equal(pairs[i][1], want[1]), i


def test_sampler_batches_each_epochs_pairs_once_within_budget(ds):
    sampler = ResegmentingSampler(Resegmenter(ds, 0.3, seed=4, max_pieces=59), 60, seed=4)
    counts = set()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        data = sampler.epoch_data()
        batches = list(sampler)
        counts.add(len(batches))
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(ds)))
        for idx in batches:
            b = collate(data, idx)
            assert b.src.numel() <= 60 and b.tgt_out.numel() <= 60
            tok = ds.src_tokenizer
            for row, i in zip(b.src.tolist(), idx):
                assert tok.decode(row) == tok.decode(ds[int(i)][0].tolist())  # EOS/PAD dropped
    assert len(counts) > 1  # the batch count follows each epoch's lengths


def test_sampler_resumes_mid_epoch_exactly(ds):
    def make():
        return ResegmentingSampler(Resegmenter(ds, 0.3, seed=7, max_pieces=59), 60, seed=7)

    whole = make()
    stream = list(iter(whole)) + list(iter(whole))  # epochs 0 and 1
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(iter(resumed))
    tail += list(iter(resumed))  # and on into the next epoch
    assert len(head + tail) == len(stream)
    assert all(np.array_equal(a, b) for a, b in zip(head + tail, stream))
    assert np.array_equal(resumed.epoch_data().src_ids, whole.epoch_data().src_ids)


def quiet(**kw):
    base = dict(threads=1, tensorboard=False, progress=False, eval_bleu_sentences=0, save_minutes=None,
                eval_every=0)
    base.update(kw)
    return TrainOptions(**base)


def test_trainer_learns_and_resumes_bit_for_bit(bpe_data, tmp_path):
    cfg = load_config("micro", overrides=[*SMALL, "p_bpe_drop=0.2"])
    whole = train(cfg, bpe_data, tmp_path / "whole", quiet(max_steps=40, save_every=10))
    assert whole["steps"] == 40
    losses = [json.loads(line)["loss"] for line in (tmp_path / "whole" / "metrics.jsonl")
              .read_text().splitlines() if '"train"' in line]
    assert losses[-1] < losses[0] - 0.5
    train(cfg, bpe_data, tmp_path / "split", quiet(max_steps=25, save_every=10))
    train(None, bpe_data, tmp_path / "split", quiet(max_steps=40, resume=True, save_every=10))
    a = load_file(str(tmp_path / "whole" / "last" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "last" / "model.safetensors"))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # and the segmentation really changed what was trained on: p=0 ends elsewhere
    plain = train(load_config("micro", overrides=SMALL), bpe_data, tmp_path / "plain", quiet(max_steps=40))
    c = load_file(str(tmp_path / "plain" / "last" / "model.safetensors"))
    assert plain["steps"] == 40 and not all(torch.equal(a[k], c[k]) for k in a)


def test_trainer_refuses_bpe_dropout_on_a_character_vocabulary(tmp_path):
    data = tiny_dataset(tmp_path)  # model_type char
    cfg = load_config("micro", overrides=[*SMALL, "p_bpe_drop=0.1"])
    with pytest.raises(UserError, match="p_bpe_drop=0.1 needs a BPE vocabulary.*char"):
        train(cfg, data, tmp_path / "r", quiet(max_steps=2))


@pytest.mark.parametrize("bad", ["p_bpe_drop=1.0", "p_bpe_drop=-0.1"])
def test_config_rejects_bad_p_bpe_drop(bad):
    with pytest.raises(UserError, match="p_bpe_drop must be in"):
        load_config("micro", overrides=[bad])
