"""`aiayn prepare` and `ParallelDataset`: binarize, load back, reuse, refuse, and fail cleanly."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from aiayn.data.corpus import ParallelSource
from aiayn.data.dataset import ParallelDataset, load_dataset_dir, read_split_text
from aiayn.data.prepare import prepare_dataset
from aiayn.errors import UserError

from helpers import DE, EN, REPO, TABLE, options, sentences, splits, tiny_dataset, write_lines


def expected_filter(tok, src, tgt, max_len, max_ratio):
    """Reference for the training filters: the first reason that applies to each pair, or None."""
    reasons = []
    for s, t in zip(src, tgt):
        if not s.strip() or not t.strip():
            reasons.append("empty")
            continue
        if "\0" in s + t:
            reasons.append("nul")
            continue
        ls, lt = len(tok.encode(s)), len(tok.encode(t))
        if max(ls, lt) > max_len:
            reasons.append("too_long")
        elif max(ls, lt) > max_ratio * min(ls, lt):
            reasons.append("length_ratio")
        else:
            reasons.append(None)
    return reasons


def test_prepare_then_load_round_trips(raw, tmp_path):
    out = tmp_path / "ds"
    result = prepare_dataset(out, splits(raw["dir"]), options())
    assert not result.up_to_date
    ds = ParallelDataset(out, "train")
    src, tgt = raw["train"]
    reasons = expected_filter(ds.src_tokenizer, src, tgt, 40, 9.0)
    assert (reasons[5], reasons[9], reasons[17]) == ("empty", "too_long", "length_ratio")
    kept = [i for i, r in enumerate(reasons) if r is None]
    assert len(kept) > 180
    m = json.loads((out / "manifest.json").read_text())
    counts = {k: reasons.count(k) for k in ("empty", "nul", "too_long", "length_ratio")}
    assert m["splits"]["train"]["filtered"] == counts
    assert m["splits"]["train"]["pairs"] == len(kept) and m["splits"]["train"]["input_pairs"] == 200
    assert m["shared_vocab"] and m["vocab"]["src"]["size"] == 500

    assert len(ds) == len(kept) and ds.src_tokenizer is ds.tgt_tokenizer
    assert ds.src_ids.dtype == np.uint16
    for j, i in enumerate(kept):
        assert ds.text(j) == (src[i], tgt[i])
        s, t = ds[j]
        assert len(s) == ds.src_lengths[j] and len(t) == ds.tgt_lengths[j]
        assert s.tolist() == ds.src_tokenizer.encode(src[i])
    assert ds.manifest["splits"]["train"]["src_tokens"] == int(ds.src_lengths.sum())


def test_dev_and_test_are_not_filtered(raw, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(out, splits(raw["dir"]), options())
    for split in ("valid", "test"):
        ds = ParallelDataset(out, split)
        src, tgt = raw[split]
        assert len(ds) == len(src)
        assert [ds.text(i) for i in range(len(ds))] == list(zip(src, tgt))
        assert ds.reference_lines() == tgt
        assert read_split_text(out, split, "src") == src
    assert ParallelDataset(out, "valid").src_lengths[3] == 0
    with pytest.raises(UserError, match="keeps no raw text"):
        read_split_text(out, "train")
    with pytest.raises(UserError, match="no split 'dev'"):
        ParallelDataset(out, "dev")


def test_rerun_reuses_and_changes_are_refused(raw, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(out, splits(raw["dir"]), options())
    stamp = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = prepare_dataset(out, splits(raw["dir"]), options())
    assert again.up_to_date
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp

    with pytest.raises(UserError, match="other inputs or options; pass --overwrite"):
        prepare_dataset(out, splits(raw["dir"]), options(vocab_size=510))
    src, tgt = raw["test"]
    write_lines(raw["dir"] / "test.en", src[:-1] + ["a changed line"])
    with pytest.raises(UserError, match="--overwrite"):
        prepare_dataset(out, splits(raw["dir"]), options())
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamp  # untouched

    prepare_dataset(out, splits(raw["dir"]), options(), overwrite=True)
    assert read_split_text(out, "test", "src")[-1] == "a changed line"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "raw"]  # no temp dirs left


def test_overwrite_refuses_foreign_directory(raw, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    with pytest.raises(UserError, match="not an aiayn dataset"):
        prepare_dataset(out, splits(raw["dir"]), options(), overwrite=True)
    assert (out / "precious.txt").read_text() == "keep me"


def test_errors_write_nothing(raw, tmp_path):
    d = raw["dir"]
    out = tmp_path / "new" / "ds"
    write_lines(d / "short.de", ["eins", "zwei"])
    cases = [
        ({"train": ParallelSource(d / "missing.en", d / "train.de")}, r"missing\.en: no such file"),
        ({"train": ParallelSource(d / "train.en", d / "short.de")}, r"train\.en has 200 lines, .*short\.de has 2"),
        ({**splits(d), "valid": ParallelSource(d / "val.en", d / "short.de")}, r"val\.en has 20 lines"),
    ]
    (d / "bad.de").write_bytes(b"gut\n" * 7 + b"schlecht \xc3\x28\n" + b"gut\n" * 192)
    cases.append(({"train": ParallelSource(d / "train.en", d / "bad.de")}, r"bad\.de:8: invalid UTF-8"))
    for sp, pattern in cases:
        with pytest.raises(UserError, match=pattern):
            prepare_dataset(out, sp, options())
        # nothing: not the dataset, not its work directory (an empty parent, made for the output's
        # lock, may stay)
        assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])
    with pytest.raises(UserError, match="too large for this corpus"):
        prepare_dataset(out, splits(d), options(vocab_size=100_000))
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_separate_vocab_tsv_and_sgml(tmp_path):
    d = tmp_path / "raw"
    d.mkdir()
    src, tgt = sentences(EN, 120, 7), sentences(DE, 120, 8)
    (d / "train.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)), encoding="utf-8")
    (d / "test.de.sgm").write_text(
        '<refset>\n<doc docid="1">\n<seg id="1">Haus &amp; Hund</seg>\n<seg id="2">über &quot;x&quot;</seg>\n'
        "</doc>\n</refset>\n", encoding="utf-8")
    write_lines(d / "test.en", ["house and dog", "over x"])
    sp = {"train": ParallelSource(d / "train.tsv"), "test": ParallelSource(d / "test.en", d / "test.de.sgm")}
    out = tmp_path / "ds"
    prepare_dataset(out, sp, options(separate_vocab=True, vocab_size=400, max_len=0, max_ratio=0))
    info = load_dataset_dir(out)
    assert not info.shared_vocab and info.src_tokenizer != info.tgt_tokenizer
    assert {p.name for p in out.glob("*.model")} == {"src.spm.model", "tgt.spm.model"}
    ds = ParallelDataset(out, "train")
    assert [ds.text(i) for i in range(len(ds))] == list(zip(src, tgt))
    test = ParallelDataset(out, "test")
    assert test.reference_lines() == ["Haus & Hund", 'über "x"']
    assert test.text(0) == ("house and dog", "Haus & Hund")


def test_separate_target_vocabulary_size(tmp_path):
    """A target vocabulary of its own size: a closed set of symbols, one id each, beside the
    source's subwords (the parsing recipe's tree symbols). Unset, it leaves the fingerprint as
    it was before the option existed, so older datasets stay up to date."""
    from aiayn.data.prepare import _fingerprint, fingerprint_options

    d = tmp_path / "raw"
    d.mkdir()
    src = sentences(EN, 80, 3)
    tgt = [" ".join(["(S"] + ["XX"] * len(s.split()) + [")S"]) for s in src]
    write_lines(d / "train.en", src)
    write_lines(d / "train.de", tgt)
    opts = options(separate_vocab=True, vocab_size=300, tgt_model_type="word", tgt_vocab_size=7,
                   max_len=0, max_ratio=0)
    prepare_dataset(tmp_path / "ds", {"train": ParallelSource(d / "train.en", d / "train.de")}, opts)
    info = load_dataset_dir(tmp_path / "ds")
    assert (info.src_tokenizer.vocab_size, info.tgt_tokenizer.vocab_size) == (300, 7)
    assert info.tgt_tokenizer.encode("(S XX )S") == [info.tgt_tokenizer.piece_to_id(p)
                                                     for p in ("▁(S", "▁XX", "▁)S")]
    unset = options(separate_vocab=True)
    # the options as they were before tgt_vocab_size, vocab_from (and vocab_sample, which a corpus
    # no larger than the sample leaves out) existed
    legacy = {k: v for k, v in unset.__dict__.items()
              if k not in ("tgt_vocab_size", "vocab_sample", "vocab_from")}
    assert fingerprint_options(unset, 200) == legacy
    assert _fingerprint(unset, {}, 200) != _fingerprint(options(separate_vocab=True, tgt_vocab_size=7), {}, 200)
    with pytest.raises(UserError, match="separate"):
        options(tgt_vocab_size=7).check()


def test_dataset_pickles_by_path(raw, tmp_path):
    out = tmp_path / "ds"
    prepare_dataset(out, splits(raw["dir"]), options())
    ds = ParallelDataset(out, "valid")
    back = pickle.loads(pickle.dumps(ds))
    assert len(pickle.dumps(ds)) < 1000
    assert [back.text(i) for i in range(len(back))] == [ds.text(i) for i in range(len(ds))]


def test_missing_dataset_dir(tmp_path):
    with pytest.raises(UserError, match="run aiayn prepare"):
        ParallelDataset(tmp_path / "nothing", "train")


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "aiayn", "prepare", *args], cwd=cwd, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_cli_prepare_and_missing_file(raw, tmp_path):
    d = raw["dir"]
    out = tmp_path / "cli_ds"
    common = ["--src-lang", "en", "--tgt-lang", "de", "--out", str(out),
              "--vocab-size", "500", "--max-len", "40"]
    bad = run_cli("--train", str(d / "nothere"), *common, cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("aiayn prepare: error: no file ") and "nothere.en" in bad.stderr
    assert not out.exists()

    ok = run_cli("--train", str(d / "train"), "--valid", str(d / "val"), "--test", str(d / "test"), *common,
                 cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    train = ParallelDataset(out, "train").manifest["splits"]["train"]
    f = train["filtered"]
    assert f"train: {train['pairs']} pairs" in ok.stdout
    assert f"(empty 1, NUL bytes 0, too long {f['too_long']}, length ratio {f['length_ratio']})" in ok.stdout
    assert ParallelDataset(out, "test").reference_lines() == raw["test"][1]


def test_tiny_dataset_is_what_the_tests_assume(tmp_path):
    data = tiny_dataset(tmp_path)
    ds = ParallelDataset(data, "train")
    assert len(ds) == 400 and ds.src_tokenizer.vocab_size == 25
    src, tgt = ds.text(0)
    assert tgt == " ".join(reversed(src.split())).translate(TABLE)
    assert ParallelDataset(data, "valid").reference_lines()[0]
