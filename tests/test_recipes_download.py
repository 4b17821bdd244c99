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


# --- over HTTP, resumably (a local server on 127.0.0.1) -----------------------------------------

from aiayn.recipes.download import Remote, fetch, part_path  # noqa: E402

from helpers import serve  # noqa: E402

BLOB = bytes(range(256)) * 40  # 10,240 bytes


def remote(url: str, data: bytes = BLOB, name: str = "blob.tgz") -> Remote:
    return Remote(name, f"{url}/{name}", hashlib.sha256(data).hexdigest(), len(data))


def test_fetch_over_http_verifies_the_bytes(tmp_path):
    with serve({"blob.tgz": BLOB}) as s:
        dest = fetch(remote(s.url), tmp_path / "blob.tgz", progress=False)
        assert dest.read_bytes() == BLOB and not part_path(dest).exists()
        fetch(remote(s.url), dest, progress=False)  # verified already: no second request
    assert s.requests == [("blob.tgz", None)]


def test_a_dropped_connection_resumes_with_a_range_request(tmp_path):
    with serve({"blob.tgz": BLOB}, cut_after={"blob.tgz": 3000}) as s:
        dest = fetch(remote(s.url), tmp_path / "blob.tgz", progress=False, backoff=0)
    assert dest.read_bytes() == BLOB
    assert s.requests == [("blob.tgz", None), ("blob.tgz", "bytes=3000-")]


def test_a_later_run_resumes_the_part_file(tmp_path):
    dest = tmp_path / "blob.tgz"
    part_path(dest).write_bytes(BLOB[:7000])  # what a killed run left
    with serve({"blob.tgz": BLOB}) as s:
        fetch(remote(s.url), dest, progress=False)
    assert dest.read_bytes() == BLOB and s.requests == [("blob.tgz", "bytes=7000-")]
    # a part file that is already complete: the server answers 416, the file is verified
    dest.unlink()
    part_path(dest).write_bytes(BLOB)
    with serve({"blob.tgz": BLOB}) as s:
        fetch(remote(s.url), dest, progress=False)
    assert dest.read_bytes() == BLOB and s.requests == [("blob.tgz", f"bytes={len(BLOB)}-")]


def test_a_server_ignoring_range_restarts_the_part_file(tmp_path):
    dest = tmp_path / "blob.tgz"
    part_path(dest).write_bytes(b"x" * 5000)  # even a wrong prefix is replaced
    with serve({"blob.tgz": BLOB}, ignore_range=True) as s:
        fetch(remote(s.url), dest, progress=False)
    assert dest.read_bytes() == BLOB and s.requests == [("blob.tgz", "bytes=5000-")]


def test_a_corrupt_part_file_fails_the_checksum_then_the_next_run_starts_over(tmp_path):
    dest = tmp_path / "blob.tgz"
    part_path(dest).write_bytes(b"x" * 5000)  # resumed onto bytes that are not the file's
    with serve({"blob.tgz": BLOB}) as s:
        with pytest.raises(UserError, match="checksum mismatch"):
            fetch(remote(s.url), dest, progress=False)
        assert not dest.exists() and not part_path(dest).exists()
        fetch(remote(s.url), dest, progress=False)
    assert dest.read_bytes() == BLOB and s.requests[-1] == ("blob.tgz", None)


def test_http_errors_are_one_line_user_errors(tmp_path):
    with serve({}) as s:
        with pytest.raises(UserError, match=r"cannot fetch http://127\.0\.0\.1:\d+/blob\.tgz: Not Found"):
            fetch(remote(s.url), tmp_path / "blob.tgz", progress=False)
    with pytest.raises(UserError, match="cannot fetch"):  # nothing listening there any more
        fetch(remote(s.url), tmp_path / "blob.tgz", progress=False, timeout=5)
