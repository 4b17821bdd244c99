"""Downloading with checksums, against a local file:// mirror (tests never use the network)."""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys

import pytest

from aiayn.errors import UserError
from aiayn.recipes.download import MULTI30K_FILES, download_files, text_sha256


def make_mirror(tmp_path, names):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    sums = {}
    for i, name in enumerate(names):
        text = f"sentence {i} of {name}\nzweite Zeile {i}\n".encode()
        with gzip.open(mirror / name, "wb") as f:
            f.write(text)
        sums[name] = hashlib.sha256(text).hexdigest()
    return mirror, sums


def test_download_verifies_and_keeps_files(tmp_path):
    mirror, sums = make_mirror(tmp_path, ["train.en.gz", "train.de.gz"])
    out = tmp_path / "out"
    paths = download_files(sums, mirror.as_uri(), out, progress=False)
    assert sorted(p.name for p in paths) == ["train.de.gz", "train.en.gz"]
    for p in paths:
        assert text_sha256(p) == sums[p.name]
        assert (mirror / p.name).read_bytes() == p.read_bytes()
    # a second run keeps verified files (mirror gone: it must not need it)
    (mirror / "train.en.gz").unlink()
    download_files(sums, mirror.as_uri(), out, progress=False)


def test_checksum_mismatch_keeps_nothing(tmp_path):
    mirror, sums = make_mirror(tmp_path, ["val.en.gz"])
    out = tmp_path / "out"
    with pytest.raises(UserError, match="checksum mismatch"):
        download_files({"val.en.gz": "0" * 64}, mirror.as_uri(), out, progress=False)
    assert list(out.iterdir()) == []


def test_missing_remote_file_is_a_clear_error(tmp_path):
    mirror, _ = make_mirror(tmp_path, [])
    with pytest.raises(UserError, match="cannot fetch"):
        download_files({"nope.gz": "0" * 64}, mirror.as_uri(), tmp_path / "out", progress=False)


def test_multi30k_table_covers_the_standard_splits():
    for split, n in [("train", 29000), ("val", 1014), ("test_2016_flickr", 1000)]:
        for lang in ("en", "de", "fr"):
            sha, lines = MULTI30K_FILES[f"{split}.{lang}.gz"]
            assert len(sha) == 64 and lines == n


def test_download_cli_error_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "aiayn", "download", "multi30k", "--out",
                        str(tmp_path / "o"), "--base-url", (tmp_path / "nowhere").as_uri(),
                        "--langs", "en"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "cannot fetch" in r.stderr
