"""Atomic file output and overwrite protection.

Every file aiayn writes goes through `atomic_write` (temporary file in the same directory, fsync,
rename): a crash at any instant leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterator

from aiayn.errors import UserError


def check_writable(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse to replace an existing file unless the user asked for it (`--overwrite`)."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise UserError(f"{p} already exists; pass --overwrite to replace it")
    return p


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, streamed; a missing file is a `UserError`."""
    import hashlib

    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a file") from None
    return h.hexdigest()


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename inside `directory` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; on success fsync and rename it over `path`.

    On an exception the temporary file is removed and `path` is untouched.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    os.chmod(tmp, _umask_mode())  # mkstemp makes 0600; outputs get the user's usual mode
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fsync_dir(p.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_replace_file(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """fsync an already written temporary file and rename it over `path` (for libraries that
    write files themselves, e.g. safetensors)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, _umask_mode())
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def write_dir_atomically(path: str | os.PathLike, fill: Callable[[Path], object]) -> Path:
    """Call `fill(tmp)` to populate a fresh temporary sibling directory, then `publish_dir` it at
    `path`. On any failure the temporary directory is removed and `path` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        fill(tmp)
        return publish_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_dir(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Put the complete directory `tmp` (a sibling of `path`) at `path`: fsync its files, give
    them the user's usual permissions, rename. An existing directory at `path` is replaced only
    then, and is put back if the swap fails."""
    tmp, path = Path(tmp), Path(path)
    mode = _umask_mode()
    for f in tmp.iterdir():
        if f.is_file():
            os.chmod(f, mode)
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    os.chmod(tmp, mode | ((mode & 0o444) >> 2))  # directories: x wherever r
    fsync_dir(tmp)
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.replace(path, old / "d")
        try:
            os.replace(tmp, path)
        except BaseException:
            os.replace(old / "d", path)  # put the previous directory back
            raise
        finally:
            if path.exists():
                shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
    fsync_dir(path.parent)
    return path
