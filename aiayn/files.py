"""Writing outputs safely: atomic writes, temporary names that say whose they are, deletion that
is never seen half done, and I/O failures as one-line errors.

- Atomic outputs: `atomic_write` (a file) and `write_dir_atomically` (a directory) write a hidden
  temporary sibling, fsync it and rename it into place: a crash at any instant leaves either the
  old output or the new one, never a torn one. `publish_dir` puts a directory written elsewhere
  beside the output (a resumable work directory) in place the same way.
- Temporary names carry the writer's PID and host (`temp_path`): `.NAME.PID@HOST.RANDOM.tmp`. The
  writers above, and `remove_stale_temporaries`, delete those whose process is gone, so a killed
  command leaves nothing behind for long.
- I/O failures (disk full, read-only directory, permission denied) inside the writers become an
  `OutputError` (a `UserError`): one line saying what, where and what to do (`writing`).

A command holds its output's lock (aiayn/locks.py) while it writes; reading and checking what was
written before is aiayn/checks.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import hashlib
import os
import re
import secrets
import shutil
import socket
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

from aiayn.errors import OutputError, UserError


def check_writable(path: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse to replace an existing file unless the user asked for it (`--overwrite`)."""
    p = Path(path)
    if p.exists() and not overwrite:
        raise UserError(f"{p} already exists; pass --overwrite to replace it")
    return p


def foreign_entry(directory: str | os.PathLike, names: Iterable[str]) -> Path | None:
    """The first entry of `directory` (by name) that is not a plain file named as one of `names`
    (file names, or fnmatch patterns such as "events.out.tfevents.*"): something aiayn does not
    write there, which replacing or deleting the directory would destroy; None when there is none.
    `--overwrite` replaces a directory only when this is None (`aiayn.locks.output_directory`)."""
    patterns = list(names)
    for entry in sorted(Path(directory).iterdir()):
        if not (entry.is_file() and not entry.is_symlink()
                and any(fnmatch.fnmatchcase(entry.name, n) for n in patterns)):
            return entry
    return None


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename inside `directory` durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_mode() -> int:
    """The permissions a new file gets under this process's umask (os.open's 0o666 default)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# --- I/O failures as one line ------------------------------------------------------------------

# What to do about the usual reasons a write fails.
_REMEDY = {
    errno.ENOSPC: "free some disk space",
    errno.EDQUOT: "free some space within your disk quota",
    errno.EFBIG: "raise this process's file size limit (ulimit -f)",
    errno.EACCES: "check the permissions or write somewhere else",
    errno.EPERM: "check the permissions or write somewhere else",
    errno.EROFS: "write somewhere else (the file system is read-only)",
}


def io_error_code(exc: BaseException) -> int | None:
    """The OS error number behind `exc`: an OSError's, or one a library names in its message
    (safetensors reports Rust's `... (os error 28)`); None when `exc` is no I/O failure."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    m = re.search(r"\(os error (\d+)\)|Os \{ code: (\d+)|\[Errno (\d+)\]", str(exc))
    return int(next(g for g in m.groups() if g)) if m else None


def output_error(path: str | os.PathLike, exc: BaseException,
                 then: str = "run the command again") -> OutputError | None:
    """The one-line error for a failed write of `path` (what, where, the remedy, then `then`), or
    None when `exc` is not an I/O failure."""
    code = io_error_code(exc)
    if code is None:
        return None
    reason = os.strerror(code)
    culprit = getattr(exc, "filename", None)
    if culprit and Path(culprit) != Path(path) and not any(map(is_temporary, Path(culprit).parts)):
        reason += f" ({culprit})"  # not the output itself: e.g. an input the writer was copying
    return OutputError(path, reason, _REMEDY.get(code, "fix the cause"), then)


def io_failure(exc: BaseException) -> str | None:
    """One line for an I/O failure anywhere (the command line's last resort, where no writer
    named its output), or None when `exc` is no I/O failure."""
    code = io_error_code(exc)
    if code is None:
        return None
    where = getattr(exc, "filename", None)
    line = f"{where}: {os.strerror(code)}" if where else os.strerror(code)
    return f"{line}; {_REMEDY[code]}, then run the command again" if code in _REMEDY else line


@contextlib.contextmanager
def writing(path: str | os.PathLike, then: str = "run the command again") -> Iterator[None]:
    """Turn an I/O failure inside the block into an `OutputError` naming `path`; anything else
    (a bug, a `UserError`) passes unchanged."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        err = output_error(path, e, then)
        if err is None:
            raise
        raise err from None


# --- temporary names carrying their writer -----------------------------------------------------

_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)@(?P<host>[0-9a-f]{8})\.[0-9a-f]+\.(?P<kind>tmp|old)$")


def is_temporary(name: str) -> bool:
    """Whether a file name is one `temp_path` makes (of any process)."""
    return _TEMP.match(name) is not None


def temp_path(target: str | os.PathLike, kind: str = "tmp", pid: int | None = None) -> Path:
    """A fresh hidden sibling name of `target` that says which process (default: this one) wrote
    it: `.NAME.PID@HOST.RANDOM.tmp` (kind "old": a previous version set aside during a swap)."""
    t = Path(target)
    return t.parent / f".{t.name}.{pid or os.getpid()}@{_HOST}.{secrets.token_hex(4)}.{kind}"


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine (a PID reused since errs on the safe side)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_path(path: Path) -> None:
    """Delete a file, link or directory tree; a link is removed, never followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def delete_atomically(path: str | os.PathLike) -> None:
    """Delete a file or directory tree so that nobody ever sees it half-deleted: rename it to a
    temporary name first (one atomic step), then delete that (which a kill may interrupt:
    `remove_stale_temporaries` finishes the job). A link is removed, never followed."""
    p = Path(path)
    if not os.path.lexists(p):
        return
    doomed = temp_path(p)
    try:
        os.replace(p, doomed)
    except FileNotFoundError:
        return
    remove_path(doomed)


def remove_stale_temporaries(directory: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Delete the temporaries (of output `name` only, if given) that processes now gone left in
    `directory`; returns what was removed. A previous version set aside by an interrupted swap is
    put back where its output is missing. Temporaries of live processes, of other machines and
    other hidden files are never touched."""
    d = Path(directory)
    removed: list[Path] = []
    try:
        entries = list(d.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP.match(entry.name)
        if (not m or m["host"] != _HOST or (name is not None and m["name"] != name)
                or int(m["pid"]) == os.getpid() or process_alive(int(m["pid"]))):
            continue
        target = d / m["name"]
        if m["kind"] == "old" and not os.path.lexists(target):
            with contextlib.suppress(OSError):
                os.replace(entry, target)
                continue
        remove_path(entry)
        removed.append(entry)
    return removed


# --- atomic writers ----------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of `path` for writing; on success fsync and rename it over `path`.

    On an exception the temporary file is removed and `path` is untouched; an I/O failure (disk
    full, no permission) becomes a one-line `OutputError`.
    """
    p = Path(path)
    with writing(p):
        p.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(p.parent, p.name)
        tmp = temp_path(p)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode())
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
    """fsync an already written temporary file (name it with `temp_path(path)`) and rename it over
    `path` (for libraries that write files themselves, e.g. downloads)."""
    with writing(path):
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
        fsync_dir(Path(path).parent)


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 with RENAME_EXCHANGE); False where the
    system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_files(directory: Path, mode: int) -> None:
    for f in directory.iterdir():
        if f.is_file():
            os.chmod(f, mode)
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_dir_atomically(path: str | os.PathLike, fill: Callable[[Path], object]) -> Path:
    """Call `fill(tmp)` to populate a fresh temporary sibling directory, then put it at `path`
    (`publish_dir`). On any failure the temporary directory is removed, an I/O failure becomes a
    one-line `OutputError`, and whatever was at `path` stays."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent, path.name)
        tmp = temp_path(path)
        os.mkdir(tmp, 0o700)
        try:
            fill(tmp)
            publish_dir(tmp, path)
        except BaseException:
            remove_path(tmp)
            raise
    return path


def publish_dir(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Put the complete directory `tmp` (a sibling of `path`; `write_dir_atomically`'s temporary,
    or a resumable work directory such as `aiayn prepare`'s) at `path`: fsync its files, give them
    the user's usual permissions, rename. An existing directory at `path` is replaced in one atomic
    swap (or, where the system cannot swap, set aside and put back if the rename fails;
    `remove_stale_temporaries` restores it after a kill). An I/O failure becomes a one-line
    `OutputError`, and whatever was at `path` stays. A directory not named by `temp_path` is
    renamed to such a name first, so that the previous version, which the swap leaves under it,
    is a temporary that `remove_stale_temporaries` deletes should a kill interrupt its removal."""
    tmp, path = Path(tmp), Path(path)
    with writing(path):
        if not is_temporary(tmp.name):
            staged = temp_path(path)
            os.replace(tmp, staged)
            tmp = staged
        mode = file_mode()
        _fsync_files(tmp, mode)
        os.chmod(tmp, mode | ((mode & 0o444) >> 2))  # directories: x wherever r
        fsync_dir(tmp)
        if not os.path.lexists(path):
            os.replace(tmp, path)
        elif _exchange(tmp, path):
            remove_path(tmp)  # the previous version, now under the temporary name
        else:
            old = temp_path(path, "old")
            os.replace(path, old)
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old, path)  # put the previous version back
                raise
            remove_path(old)
        fsync_dir(path.parent)
    return path
