"""Exclusive locks on outputs: `exclusive_lock(target)` holds an OS lock (flock) on the hidden
sibling `.NAME.lock` for as long as a command writes `target`; a second command is refused with a
line naming the holder's PID; the kernel releases the lock when its holder ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Collection, Iterator, Sequence

from aiayn.errors import UserError
from aiayn.files import check_writable, file_mode, foreign_entry, remove_stale_temporaries, writing

try:
    import fcntl
except ImportError:  # not a POSIX system: locks are not taken
    fcntl = None  # type: ignore[assignment]


def lock_path(target: str | os.PathLike) -> Path:
    """The lock file of output `target`: its hidden sibling `.NAME.lock`."""
    t = Path(target)
    return t.parent / f".{t.name}.lock"


def _holder(lock: Path) -> str:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = lock.read_text(encoding="utf-8").strip()
        if text:
            pid, _, who = text.partition(" ")
            return f"{who or 'another process'} (PID {pid})"
    return "another process"


def _open_locked(lock: Path) -> int | None:
    """Open `lock` and take its flock without waiting: the descriptor, or None when another
    process holds it. A lock file is deleted by its holder on release, so after locking check that
    the file is still the one at `lock` (else it was released and deleted meanwhile: try again)."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, file_mode())
        if fcntl is None:
            return fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        mine = os.fstat(fd)
        try:
            now = os.stat(lock)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
            return fd
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(target: str | os.PathLike, owner: str = "aiayn",
                   advice: str = "wait for it to finish, or choose another output") -> Iterator[Path]:
    """Hold an exclusive OS lock on output `target` (a file or directory, which need not exist)
    for the block; refuse at once, with a line naming the holder's PID, when another process holds
    it. `owner` (e.g. "aiayn train") is recorded for that message. The lock is the kernel's: it
    ends with its process, however that process ends. Once held, the temporaries of `target` that
    dead processes left are removed. The lock file is deleted on release (a killed holder's stays,
    unlocked, until the next command on `target`)."""
    t = Path(target)
    lock = lock_path(t)
    with writing(t):
        t.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_locked(lock)
    if fd is None:
        raise UserError(f"{t} is in use by {_holder(lock)}; {advice}")
    try:
        with writing(t):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {owner}\n".encode(), 0)
        remove_stale_temporaries(t.parent, t.name)  # what a killed earlier writer left
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still holding it: see _open_locked
        os.close(fd)


@contextlib.contextmanager
def output_directory(out: str | os.PathLike, owner: str, overwrite: bool, marker: str, kind: str,
                     inputs: Sequence[str | os.PathLike] = (),
                     advice: str = "wait for it to finish, or choose another output",
                     files: Collection[str] = ()) -> Iterator[Path]:
    """Hold `out`'s lock (`exclusive_lock`) for the block, after refusing, in one line each, an
    `out` that is one of the command's `inputs`, an existing `out` without `overwrite`, and always
    one that is not a `kind` directory (no `marker` file in it; a file or a link) or that holds
    anything besides the files a `kind` directory holds (`marker` and `files`: names or fnmatch
    patterns; `aiayn.files.foreign_entry`): a command replaces only what aiayn wrote, and
    deletes nothing else."""
    p = Path(out)
    if any(os.path.lexists(p) and p.resolve() == Path(i).resolve() for i in inputs):
        what = "the model directory itself" if len(inputs) == 1 else "one of the inputs"
        raise UserError(f"{p} is {what}; choose another output directory")
    with exclusive_lock(p, owner, advice):
        check_writable(p, overwrite)
        if os.path.lexists(p) and not (p.is_dir() and not p.is_symlink() and (p / marker).is_file()):
            raise UserError(f"{p} exists and is not {kind}; refusing to replace it (choose another "
                            f"output directory)")
        theirs = foreign_entry(p, [marker, *files]) if os.path.lexists(p) else None
        if theirs is not None:
            raise UserError(f"{p} holds {theirs.name}, which is no part of {kind} that aiayn writes; "
                            f"refusing to replace it (choose another --out, or remove {theirs.name})")
        yield p
