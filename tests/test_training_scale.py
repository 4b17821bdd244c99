"""Training on a sharded dataset (memory-mapped shards read as one split) is training on the same
pairs unsharded: the same batches and bit-identical weights, through accumulated updates and a
resume; the sampler's compact sort keys give exactly the batches of the plain (k, secondary) rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import ParallelSource
from aiayn.data.dataset import ConcatArray, ParallelDataset
from aiayn.data.prepare import PrepareOptions, prepare_dataset
from aiayn.presets import load_config
from aiayn.training.trainer import TrainOptions, train

from helpers import SMALL, tiny_dataset


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The tiny task twice: one shard, and shards of 37 pairs."""
    root = tmp_path_factory.mktemp("scale")
    one = tiny_dataset(root)
    sp = {name: ParallelSource(root / f"{name}.xx", root / f"{name}.yy") for name in ("train", "valid")}
    many = root / "sharded"
    prepare_dataset(many, sp, PrepareOptions("xx", "yy", vocab_size=25, model_type="char"), shard_pairs=37,
                    workers=0, progress=False)
    return one, many


def options(**kw) -> TrainOptions:
    base = dict(threads=1, tensorboard=False, progress=False, eval_bleu_sentences=0, save_minutes=None,
                eval_every=0, seed=5, accum=2)
    return TrainOptions(**{**base, **kw})


def weights(run):
    return load_file(str(run / "last" / "model.safetensors"))


@pytest.mark.slow
def test_sharded_training_equals_unsharded_and_resumes_exactly(datasets, tmp_path):
    one, many = datasets
    ds = ParallelDataset(many, "train")
    assert isinstance(ds.src_ids, ConcatArray) and len(ds.src_ids.parts) == 11  # 400 pairs / 37
    cfg = load_config("base", overrides=SMALL)
    train(cfg, one, tmp_path / "one", options(max_steps=24))
    train(cfg, many, tmp_path / "half", options(max_steps=12))  # stops, then goes on
    train(None, many, tmp_path / "half", options(max_steps=24, resume=True))
    a, b = weights(tmp_path / "one"), weights(tmp_path / "half")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def reference_epoch(src, tgt, max_tokens, seed, epoch):
    """The batching rule written out: pairs grouped by (max(s, t) + 1, t - s) in that order,
    each group (numbered from 0 in that order) shuffled by rng([seed, epoch, group]), cut
    greedily, then the batches shuffled by rng([seed, epoch])."""
    k = np.maximum(src, tgt) + 1
    keys = sorted({(int(k[i]), int(tgt[i] - src[i])) for i in range(len(src))})
    order = []
    for g, key in enumerate(keys):
        members = [i for i in range(len(src)) if (k[i], tgt[i] - src[i]) == key]
        order += np.random.default_rng([seed, epoch, g]).permutation(members).tolist()
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * k[i] > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    batches.append(cur)
    return [batches[j] for j in np.random.default_rng([seed, epoch]).permutation(len(batches))]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint16])
def test_sampler_batches_follow_the_rule_whatever_the_length_dtype(dtype):
    rng = np.random.default_rng(0)
    src = rng.integers(0, 60, 3000)
    tgt = np.clip(src + rng.integers(-9, 10, 3000), 0, None)
    s = TokenBatchSampler(src.astype(dtype), tgt.astype(dtype), 700, seed=4)
    assert s.groups.members.dtype == np.int32  # the sampler's one per-pair array: 4 bytes a pair
    for epoch in (0, 1):
        got = [b.tolist() for b in s.epoch_batches(epoch)]
        assert got == reference_epoch(src, tgt, 700, 4, epoch)
