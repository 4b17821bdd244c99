"""Fetch public data sets with checksums, resumably (the tests serve fixtures from a local HTTP
server; nothing here is used by them against the internet).

Checksums are SHA-256, of one of two things:
- `"text"`: the *decompressed* content (Multi30k's gzip files), so a file recompressed by a mirror
  still verifies, while any change to its sentences does not;
- `"bytes"`: the file exactly as served (archives, whose published checksums are of their bytes).

A download goes to `.NAME.part` beside its destination. When it breaks off (a dropped connection,
a killed process), the next attempt (a retry within the same call, or a later run) asks the server
for the rest with an HTTP Range request and appends it; a server that ignores the Range header
sends the whole file, and the part file starts over. Only a verified file takes the final name; a
checksum mismatch deletes the part file.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from aiayn.checks import sha256_file
from aiayn.errors import UserError
from aiayn.files import atomic_replace_file
from aiayn.progress import Progress

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
# Multi30k task 1 (Elliott et al., 2016): file -> (sha256 of the decompressed text, line count)
MULTI30K_FILES: dict[str, tuple[str, int]] = {
    "train.en.gz": ("460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6", 29000),
    "train.de.gz": ("2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72", 29000),
    "train.fr.gz": ("5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d", 29000),
    "val.en.gz": ("1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227", 1014),
    "val.de.gz": ("660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660", 1014),
    "val.fr.gz": ("5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc", 1014),
    "test_2016_flickr.en.gz": ("399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182", 1000),
    "test_2016_flickr.de.gz": ("4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16", 1000),
    "test_2016_flickr.fr.gz": ("cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6", 1000),
}

CHUNK = 1 << 20  # bytes per read from the network and from disk


@dataclass(frozen=True)
class Remote:
    """One file to fetch: where from, its expected SHA-256 (of its bytes, or of its decompressed
    text with `text`), and its size in bytes when known (for the progress bar)."""

    name: str
    url: str
    sha256: str
    size: int | None = None
    text: bool = False

    def at(self, base_url: str | None) -> "Remote":
        """The same file from a mirror: `base_url/name` instead of `url` (None: unchanged)."""
        if base_url is None:
            return self
        return Remote(self.name, f"{base_url.rstrip('/')}/{self.name}", self.sha256, self.size, self.text)


def text_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's content, decompressed first when it is gzip."""
    try:
        with open(path, "rb") as f:
            is_gzip = f.read(2) == b"\x1f\x8b"  # by content: downloads have temporary names
        with (gzip.open if is_gzip else open)(path, "rb") as f:
            return _hash_stream(f)
    except (OSError, EOFError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None


def _hash_stream(f) -> str:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(CHUNK), b""):
        h.update(chunk)
    return h.hexdigest()


def verified(path: Path, remote: Remote) -> bool:
    """Whether `path` holds `remote`'s content (a cheap size check first when the size is known)."""
    if not path.is_file() or (remote.size is not None and not remote.text
                              and path.stat().st_size != remote.size):
        return False
    return (text_sha256 if remote.text else sha256_file)(path) == remote.sha256


def part_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.part")


def _content_range_start(header: str | None) -> int | None:
    """The first byte of a `Content-Range: bytes START-END/TOTAL` header, or None."""
    m = re.match(r"bytes\s+(\d+)-\d+/(\d+|\*)", header or "")
    return int(m.group(1)) if m else None


def _transfer(remote: Remote, part: Path, progress: bool, timeout: float) -> None:
    """One attempt: append the rest of `remote` to `part` (all of it when the server will not
    resume). Network errors propagate; the bytes received so far stay in `part`."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(remote.url, headers={"User-Agent": "aiayn"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # nothing left to send: the part file is complete (or wrong)
            return
        raise
    with response:
        status = getattr(response, "status", None)
        if have and not (status == 206 and _content_range_start(response.headers.get("Content-Range")) == have):
            have = 0  # the server sent the whole file (file:// URLs always do): start over
        announced = response.headers.get("Content-Length")
        received = 0
        with open(part, "ab" if have else "wb") as f, Progress(
                remote.size, initial=have, desc=remote.name, unit="B", unit_scale=True,
                enabled=progress, leave=False) as bar:
            for chunk in iter(lambda: response.read(CHUNK), b""):
                f.write(chunk)
                received += len(chunk)
                bar.update(len(chunk))
        # http.client ends a body cut short by a closed connection quietly: check its length
        if announced is not None and received < int(announced):
            raise http.client.IncompleteRead(b"", int(announced) - received)


def fetch(remote: Remote, dest: str | os.PathLike, progress: bool = True, retries: int = 3,
          timeout: float = 60, backoff: float = 2.0) -> Path:
    """Download `remote` to `dest` unless a verified copy is there; resume a `.part` file left by
    an earlier attempt; retry `retries` times after a network error, each time from where the
    transfer stopped, as long as it made progress. A checksum mismatch is a `UserError` and
    deletes the part file; so is a `dest` that exists but does not verify (a user's own file, or
    one changed since: never replaced)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if verified(dest, remote):
        return dest
    if os.path.lexists(dest):  # never replace a file that is not this download
        raise UserError(f"{dest} exists and is not {remote.name} as published (its checksum "
                        f"differs); move it away, or choose another --out, and run again")
    part = part_path(dest)
    for attempt in range(retries + 1):
        before = part.stat().st_size if part.exists() else 0
        try:
            _transfer(remote, part, progress, timeout)
            break
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            # retry only a transfer that broke off after making progress (a dropped connection);
            # a refused connection or a missing file fails at once (run again to resume)
            grew = part.exists() and part.stat().st_size > before
            if attempt == retries or not grew:
                reason = getattr(e, "reason", None) or str(e) or e.__class__.__name__
                raise UserError(f"cannot fetch {remote.url}: {reason}") from None
            time.sleep(backoff * (attempt + 1))
    got = (text_sha256 if remote.text else sha256_file)(part)
    if got != remote.sha256:
        part.unlink()
        raise UserError(f"{remote.url}: checksum mismatch (expected {remote.sha256[:12]}…, got "
                        f"{got[:12]}…); nothing was kept")
    atomic_replace_file(part, dest)
    return dest


def download_files(files: dict[str, str], base_url: str, out_dir: str | os.PathLike,
                   progress: bool = True) -> list[Path]:
    """Fetch `base_url/name` for each name -> expected sha256 of its (decompressed) text into
    `out_dir`, verifying each. Files already present and verified are kept; a mismatch deletes
    the download and stops."""
    out = Path(out_dir)
    return [fetch(Remote(name, "", sha, text=True).at(base_url), out / name, progress)
            for name, sha in files.items()]
