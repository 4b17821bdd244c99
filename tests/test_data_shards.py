"""Datasets at scale: shards read as one array, a sharded dataset equal to an unsharded one, worker
processes equal to one process, an interrupted `prepare` resumed, the vocabulary sample, and the
format-1 (unsharded) datasets of earlier versions still read and still up to date."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from aiayn.data import prepare as prepare_module
from aiayn.data import shards as shards_module
from aiayn.data.batching import collate
from aiayn.data.dataset import ConcatArray, ParallelDataset, load_dataset_dir
from aiayn.data.encode import PairReservoir
from aiayn.data.prepare import prepare_dataset, work_dir
from aiayn.data.tokenizer import Tokenizer

from helpers import options, splits


def test_concat_array_reads_like_the_concatenation():
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 1000, n).astype(np.uint16) for n in (5, 1, 9, 4)]
    ref = np.concatenate(parts)
    view = ConcatArray(parts)
    assert len(view) == len(ref) and view.dtype == np.uint16
    idx = rng.integers(-len(ref), len(ref), (7, 3))
    assert np.array_equal(view[idx], ref[idx]) and view[idx].dtype == np.uint16
    for sl in (slice(0, 5), slice(6, 15), slice(3, 12), slice(17, 19), slice(4, 4), slice(None)):
        assert np.array_equal(view[sl], ref[sl]), sl
    assert view[-1] == ref[-1] and view[6] == ref[6]
    with pytest.raises(IndexError):
        view[np.array([len(ref)])]
    shifted = ConcatArray(parts, shift=[10, 20, 30, 40])
    assert np.array_equal(shifted[np.arange(len(ref))],
                          np.concatenate([p.astype(np.int64) + s for p, s in zip(parts, (10, 20, 30, 40))]))


def same_pairs(a: ParallelDataset, b: ParallelDataset) -> None:
    assert len(a) == len(b)
    assert np.array_equal(a.src_lengths, b.src_lengths) and np.array_equal(a.tgt_lengths, b.tgt_lengths)
    for i in range(len(a)):
        assert all(np.array_equal(x, y) for x, y in zip(a[i], b[i])), i
    rng = np.random.default_rng(1)
    for _ in range(5):
        idx = rng.choice(len(a), min(17, len(a)), replace=False)
        ca, cb = collate(a, idx), collate(b, idx)
        assert all(torch_equal(getattr(ca, f), getattr(cb, f)) for f in ("src", "tgt_in", "tgt_out"))


def torch_equal(x, y) -> bool:
    return x.shape == y.shape and bool((x == y).all())


def shard_hashes(out) -> list[dict]:
    m = json.loads((out / "manifest.json").read_text())
    return [s["files"] for s in m["splits"]["train"]["shards"]]


def test_sharded_dataset_equals_the_one_shard_dataset(raw, tmp_path):
    one = prepare_dataset(tmp_path / "one", splits(raw["dir"]), options(), workers=0, progress=False)
    many = prepare_dataset(tmp_path / "many", splits(raw["dir"]), options(), workers=2, shard_pairs=30,
                           chunk_pairs=8, progress=False)
    assert many.manifest["fingerprint"] == one.manifest["fingerprint"]
    shards = many.manifest["splits"]["train"]["shards"]
    assert len(shards) == 7 and [s["input_pairs"] for s in shards][-2:] == [[150, 180], [180, 200]]
    assert sum(s["pairs"] for s in shards) == one.manifest["splits"]["train"]["pairs"]
    for key in ("pairs", "input_pairs", "filtered", "src_tokens", "tgt_tokens", "max_src_len", "max_tgt_len"):
        assert many.manifest["splits"]["train"][key] == one.manifest["splits"]["train"][key], key
    for split in ("train", "valid", "test"):
        same_pairs(ParallelDataset(tmp_path / "many", split), ParallelDataset(tmp_path / "one", split))
    for f, sha in shards[3]["files"].items():  # the manifest's checksums are the files'
        assert hashlib.sha256((tmp_path / "many" / f).read_bytes()).hexdigest() == sha


def test_an_interrupted_prepare_resumes_where_it_stopped(raw, tmp_path, monkeypatch):
    ref = prepare_dataset(tmp_path / "ref", splits(raw["dir"]), options(), workers=0, shard_pairs=40,
                          progress=False)
    out = tmp_path / "ds"
    written = []
    real_write = prepare_module.write_shard

    def write_then_die(work, split, shard, enc):
        if split == "train" and shard == 3:
            raise KeyboardInterrupt  # killed while shard 3 is being written
        written.append(shard)
        return real_write(work, split, shard, enc)

    monkeypatch.setattr(prepare_module, "write_shard", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(out, splits(raw["dir"]), options(), workers=0, shard_pairs=40, progress=False)
    assert not out.exists() and (work_dir(out) / "train.00002.tgt.ids.npy").exists()
    (work_dir(out) / "train.00002.tgt.ids.npy").write_bytes(b"damaged")  # and shard 2 torn

    def no_retraining(*a, **k):
        raise AssertionError("the vocabulary of an interrupted run is kept")

    monkeypatch.setattr(prepare_module, "write_shard", real_write)
    monkeypatch.setattr(prepare_module, "train_tokenizers", no_retraining)
    encoded = []
    real_encode = prepare_module.ChunkEncoder.map
    monkeypatch.setattr(prepare_module.ChunkEncoder, "map",
                        lambda self, chunks: (encoded.append(len(e)) or e for e in real_encode(self, chunks)))
    again = prepare_dataset(out, splits(raw["dir"]), options(), workers=0, shard_pairs=40, progress=False)
    assert again.resumed_shards == 2 and sum(encoded) == 200 - 80  # shards 0-1 kept, 2 redone
    assert shard_hashes(out) == shard_hashes(tmp_path / "ref")
    assert again.manifest["splits"] == ref.manifest["splits"]  # identical content
    assert not work_dir(out).exists() and not (out / shards_module.PROGRESS_FILE).exists()


@pytest.mark.parametrize("shard_pairs", [40, 1_000_000])  # the corpus in 5 shards, or in one short one
def test_a_prepare_killed_after_its_last_shard_resumes(raw, tmp_path, monkeypatch, shard_pairs):
    ref = prepare_dataset(tmp_path / "ref", splits(raw["dir"]), options(), workers=0,
                          shard_pairs=shard_pairs, progress=False)
    out = tmp_path / "ds"
    real_held = prepare_module._write_held_split

    def die(*a, **k):
        raise KeyboardInterrupt  # killed while writing the dev set, every training shard done

    monkeypatch.setattr(prepare_module, "_write_held_split", die)
    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(out, splits(raw["dir"]), options(), workers=0, shard_pairs=shard_pairs, progress=False)
    monkeypatch.setattr(prepare_module, "_write_held_split", real_held)
    again = prepare_dataset(out, splits(raw["dir"]), options(), workers=0, shard_pairs=shard_pairs,
                            progress=False)
    assert again.resumed_shards == len(ref.manifest["splits"]["train"]["shards"])
    assert shard_hashes(out) == shard_hashes(tmp_path / "ref")
    assert again.manifest["splits"] == ref.manifest["splits"]


def test_an_up_to_date_prepare_clears_a_killed_prepares_lock_file(raw, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(out, splits(raw["dir"]), options(), workers=0, progress=False)
    lock = tmp_path / ".ds.lock"
    lock.write_text("999999999 aiayn prepare\n")  # left by a holder killed after publishing
    assert prepare_dataset(out, splits(raw["dir"]), options(), workers=0, progress=False).up_to_date
    assert not lock.exists()


def test_bad_inputs_leave_no_work_directory(raw, tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(Exception, match="too large for this corpus"):
        prepare_dataset(out, splits(raw["dir"]), options(vocab_size=100_000), progress=False)
    assert list(tmp_path.iterdir()) == [raw["dir"]]


def test_vocabulary_from_a_sample(raw, tmp_path):
    sp = splits(raw["dir"])
    whole = prepare_dataset(tmp_path / "whole", sp, options(vocab_sample=0), progress=False)
    assert prepare_dataset(tmp_path / "big", sp, options(vocab_sample=200), progress=False
                           ).manifest["fingerprint"] == whole.manifest["fingerprint"]  # 200 pairs: no sample
    sampled = prepare_dataset(tmp_path / "s", sp, options(vocab_sample=120, vocab_size=400), progress=False)
    assert sampled.manifest["splits"]["train"]["vocab_sample"] == 120
    # the vocabulary is the one sentencepiece learns from the sampled pairs with no empty side
    r = PairReservoir(120)
    src, tgt = raw["train"]
    r.add(src, tgt)
    s, t = zip(*[(a, b) for a, b in zip(*r.pairs()) if a.strip() and b.strip()])
    ref = Tokenizer.train(list(s) + list(t), 400)
    assert load_dataset_dir(tmp_path / "s").src_tokenizer.model_proto == ref.model_proto
    assert sampled.manifest["splits"]["train"]["input_pairs"] == 200  # every pair is still encoded


def test_cli_vocabulary_sample_defaults_to_the_options():
    """`aiayn prepare` without --vocab-sample leaves PrepareOptions' default, and its help names it."""
    import dataclasses

    from aiayn.cli import build_parser
    from aiayn.commands import prepare as prepare_command

    default = {f.name: f.default for f in dataclasses.fields(prepare_module.PrepareOptions)}["vocab_sample"]
    parser = build_parser()
    for extra, expected in ([], default), (["--vocab-sample", "7"], 7):
        args = parser.parse_args(["prepare", "--src-lang", "de", "--tgt-lang", "en", "--train", "x",
                                  "--out", "y", *extra])
        assert prepare_command.prepare_options(args).vocab_sample == expected
    help_text = " ".join(parser._subparsers._group_actions[0].choices["prepare"].format_help().split())
    assert f"(default {default};" in help_text


def legacy_dataset(out, new_out, raw_dir, opts) -> None:
    """A format-1 dataset, written as earlier versions did (one ids and one offsets file per split
    and side, no shard list), from the same inputs, with their fingerprint rule."""
    m = json.loads((new_out / "manifest.json").read_text())
    out.mkdir()
    (out / "spm.model").write_bytes((new_out / "spm.model").read_bytes())
    tok = Tokenizer.load(out / "spm.model")
    for split, info in m["splits"].items():
        ds = ParallelDataset(new_out, split)
        for side in ("src", "tgt"):
            rows = [ds[i][0 if side == "src" else 1] for i in range(len(ds))]
            ids = np.concatenate(rows).astype(np.uint16) if rows else np.zeros(0, np.uint16)
            offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
            np.save(out / f"{split}.{side}.ids.npy", ids)
            np.save(out / f"{split}.{side}.idx.npy", offsets)
        if info["raw_text"]:
            for side in ("src", "tgt"):
                (out / f"{split}.{side}.txt").write_bytes((new_out / f"{split}.{side}.txt").read_bytes())
        del info["shards"]
        info.pop("vocab_sample", None)
    legacy_options = {k: v for k, v in m["options"].items() if k != "vocab_sample"}
    key = {"format": ["aiayn-dataset", 1], "options": legacy_options,
           "inputs": {split: [(f["role"], f["sha256"]) for f in info["files"]] for split, info in m["splits"].items()}}
    m.update(version=1, options=legacy_options,
             fingerprint=hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest())
    (out / "manifest.json").write_text(json.dumps(m))
    assert tok.vocab_size == m["vocab"]["src"]["size"]


def test_format_1_datasets_are_read_and_stay_up_to_date(raw, tmp_path):
    new = tmp_path / "new"
    prepare_dataset(new, splits(raw["dir"]), options(), progress=False)
    old = tmp_path / "old"
    legacy_dataset(old, new, raw["dir"], options())
    for split in ("train", "valid", "test"):
        same_pairs(ParallelDataset(old, split), ParallelDataset(new, split))
    assert ParallelDataset(old, "test").reference_lines() == raw["test"][1]
    again = prepare_dataset(old, splits(raw["dir"]), options(), progress=False)
    assert again.up_to_date and again.manifest["version"] == 1
