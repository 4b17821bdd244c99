"""Fetch public data sets with checksums (never used by the tests, which build fixtures).

Checksums are SHA-256 of the *decompressed* text, so a file recompressed by a mirror still
verifies, while any change to its sentences does not.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from aiayn.errors import UserError
from aiayn.io import atomic_replace_file

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


def text_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's content, decompressed first when it is gzip."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            is_gzip = f.read(2) == b"\x1f\x8b"  # by content: downloads have temporary names
        with (gzip.open if is_gzip else open)(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except (OSError, EOFError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    return h.hexdigest()


def download_files(files: dict[str, str], base_url: str, out_dir: str | os.PathLike,
                   progress: bool = True) -> list[Path]:
    """Fetch `base_url/name` for each name -> expected sha256 into `out_dir`, verifying each.
    Files already present and verified are kept; a mismatch deletes the download and stops."""
    from tqdm import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    # disable=None: a bar only when stderr is a terminal, never in logs or pipes
    bar = tqdm(files.items(), desc="download", unit="file", disable=None if progress else True)
    for name, want in bar:
        dest = out / name
        if dest.exists() and text_sha256(dest) == want:
            done.append(dest)
            continue
        url = f"{base_url.rstrip('/')}/{name}"
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=out)
        try:
            with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=60) as r:
                for chunk in iter(lambda: r.read(1 << 20), b""):
                    f.write(chunk)
            got = text_sha256(tmp)
            if got != want:
                raise UserError(f"{url}: checksum mismatch (expected {want[:12]}…, got {got[:12]}…); "
                                "nothing was kept")
            atomic_replace_file(tmp, dest)
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"cannot fetch {url}: {getattr(e, 'reason', e)}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        done.append(dest)
    return done
