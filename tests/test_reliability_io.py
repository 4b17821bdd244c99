"""Nothing lost, nothing crashes: one command per output (OS locks), I/O failures as one line with
the previous output intact, temporaries that say whose they are and are cleaned, and no silent
surprises (a --resume with nothing to resume, NUL bytes in a corpus)."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn import files, locks
from aiayn.cli import main as cli_main
from aiayn.data import model_dir as model_io
from aiayn.data.corpus import ParallelSource
from aiayn.data.prepare import PrepareOptions, format_summary, prepare_dataset
from aiayn.errors import OutputError, UserError
from aiayn.presets import load_config
from aiayn.training import checkpoint as ckpt
from aiayn.training.trainer import TrainOptions, train

from helpers import REPO, SMALL, dead_pid, free_port, tiny_dataset

HOLD = """
import sys, time
from aiayn.locks import exclusive_lock
with exclusive_lock(sys.argv[1], "a test holder"):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("tiny"), n_train=200, n_valid=20)


def hold_lock(target: Path) -> subprocess.Popen:
    """Another process holding the lock on `target` (until it is killed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], env=env, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def quiet(**kw) -> TrainOptions:
    return TrainOptions(**{**dict(threads=1, tensorboard=False, progress=False, eval_every=0,
                                  eval_bleu_sentences=0, save_minutes=None), **kw})


def one_line(err: str) -> str:
    """The error is one line and the last one (progress lines such as "reading ..." may precede it)."""
    lines = err.rstrip("\n").splitlines()
    assert "Traceback" not in err and [l for l in lines if "error" in l] == lines[-1:], err
    return lines[-1] + "\n"


# --- locks ------------------------------------------------------------------------------------

def test_a_lock_is_refused_with_the_holders_pid_and_freed_when_it_is_killed(tmp_path):
    target = tmp_path / "out"
    holder = hold_lock(target)
    try:
        with pytest.raises(UserError, match=rf"{target} is in use by a test holder \(PID {holder.pid}\)"):
            with locks.exclusive_lock(target):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with locks.exclusive_lock(target, "me") as lock:  # the kernel released the killed holder's lock
        assert lock.read_text() == f"{os.getpid()} me\n"
        # one process, two opens: still refused (an flock belongs to the open file)
        with pytest.raises(UserError, match=f"PID {os.getpid()}"):
            with locks.exclusive_lock(target):
                pass
    assert not lock.exists()  # released and removed


def test_a_lock_file_deleted_by_its_releasing_holder_is_never_held(tmp_path, monkeypatch):
    """The race of deleting lock files: a process opens the lock file, its holder releases and
    deletes it, then the process locks the deleted file. It must notice and lock the file now at
    the path, or a third process could hold the lock beside it."""
    import fcntl

    target = tmp_path / "out"
    real_flock, calls = fcntl.flock, []

    def released_meanwhile(fd, op):
        if not calls:
            os.unlink(locks.lock_path(target))  # the previous holder's release, just before our flock
        calls.append(op)
        return real_flock(fd, op)

    monkeypatch.setattr(locks.fcntl, "flock", released_meanwhile)
    with locks.exclusive_lock(target, "first"):
        assert len(calls) == 2  # locked the deleted file, noticed, locked the new one
        monkeypatch.setattr(locks.fcntl, "flock", real_flock)
        with pytest.raises(UserError, match=f"in use by first \\(PID {os.getpid()}\\)"):
            with locks.exclusive_lock(target, "second"):
                pass


def test_every_command_refuses_an_output_in_use(tmp_path, data, model_dir, capsys):
    outs = {name: tmp_path / name for name in ("run", "ds", "avg", "hyp.txt")}
    (tmp_path / "src.txt").write_text("a b\n", encoding="utf-8")
    holders = [hold_lock(p) for p in outs.values()]
    try:
        commands = [
            ["train", "--data", str(data), "--out", str(outs["run"]), "--set", *SMALL, "--max-steps", "1"],
            ["prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train", str(data.parent / "train"),
             "--out", str(outs["ds"]), "--vocab-size", "25", "--model-type", "char"],
            ["average", "--inputs", str(model_dir), str(model_dir), "--out", str(outs["avg"])],
            ["translate", "--model", str(model_dir), "--input", str(tmp_path / "src.txt"),
             "--output", str(outs["hyp.txt"])],
        ]
        for argv, holder, out in zip(commands, holders, outs.values()):
            assert cli_main(argv) == 2, argv[0]
            err = one_line(capsys.readouterr().err)
            assert f"{out} is in use by a test holder (PID {holder.pid})" in err
            assert not out.exists()
    finally:
        for h in holders:
            h.kill()
            h.wait()


@pytest.mark.slow
def test_under_torchrun_every_rank_stops_with_rank_0s_message(tmp_path, data):
    """Rank 0 alone takes the lock; when it cannot, the other ranks do not wait for it in a
    collective: every rank exits with the same one-line error."""
    run = tmp_path / "run"
    holder = hold_lock(run)
    port = str(free_port())
    procs = []
    try:
        for rank in range(2):
            env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RANK": str(rank),
                   "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "AIAYN_ALLOCATOR": "system"}
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "aiayn", "train", "--data", str(data), "--out", str(run),
                 "--set", *SMALL, "--max-steps", "2", "--device", "cpu", "--no-progress"],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
        holder.kill()
        holder.wait()
    for p, err in zip(procs, errs):
        assert p.returncode == 2, err
        assert err.strip().splitlines()[-1] == (
            f"aiayn train: error: {run} is in use by a test holder (PID {holder.pid}); wait for it "
            f"to finish, or choose another --out")
    assert not run.exists()


# --- I/O failures -----------------------------------------------------------------------------

# what safetensors raises on a full disk (its message for EFBIG, seen under RLIMIT_FSIZE, is the
# same with "File too large (os error 27)")
SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def test_io_error_codes_of_python_and_of_libraries():
    assert files.io_error_code(OSError(errno.ENOSPC, "No space left on device")) == errno.ENOSPC
    # safetensors (Rust) reports the OS error inside its message, as Display or as Debug
    assert files.io_error_code(RuntimeError(SAFETENSORS_FULL)) == errno.ENOSPC
    debug = 'IoError(Os { code: 27, kind: FileTooLarge, message: "File too large" })'
    assert files.io_error_code(RuntimeError(debug)) == errno.EFBIG
    assert files.io_error_code(RuntimeError("[Errno 13] Permission denied: 'x'")) == errno.EACCES
    assert files.io_error_code(ValueError("a bug")) is None
    e = files.output_error("out/x", OSError(errno.ENOSPC, "No space left on device"))
    assert str(e) == ("cannot write out/x: No space left on device; free some disk space, then run "
                      "the command again")


def test_a_failed_atomic_write_keeps_the_old_file_and_says_so(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("old\n")

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def write(self, _):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OutputError, match=f"cannot write {out}: No space left on device; free some disk space"):
        with files.atomic_write(out) as f:
            FullDisk(f).write("new\n")
    assert out.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["out.txt"]
    # a bug inside the block is not disguised as an I/O failure
    with pytest.raises(ZeroDivisionError):
        with files.atomic_write(out) as f:
            1 / 0
    assert out.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["out.txt"]


def file_size_limit(limit: int):
    """Writes beyond `limit` bytes fail with EFBIG, as on a disk that has filled up (RLIMIT_FSIZE:
    no root needed). Restores the limit and SIGXFSZ's handler afterwards."""
    import contextlib

    @contextlib.contextmanager
    def limited():
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old[1]))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, handler)

    return limited()


@pytest.mark.slow
@pytest.mark.parametrize("failure", ["file size limit", "ENOSPC from safetensors"])
def test_a_full_disk_during_a_checkpoint_keeps_the_last_one(data, tmp_path, monkeypatch, capsys, failure):
    """The checkpoint of step 4 fails to write: one line naming it, the reason and --resume; the
    checkpoint of step 2 stays whole, no temporary is left, and the run resumes from it."""
    run = tmp_path / "run"
    save = ckpt.save_checkpoint

    def failing_save(run_dir, step, *a, **k):
        if step < 4:
            return save(run_dir, step, *a, **k)
        if failure == "file size limit":
            with file_size_limit(2000):
                return save(run_dir, step, *a, **k)
        from safetensors import SafetensorError

        def full(*_, **__):
            raise SafetensorError(SAFETENSORS_FULL)
        monkeypatch.setattr(model_io, "save_file", full)
        return save(run_dir, step, *a, **k)

    monkeypatch.setattr(ckpt, "save_checkpoint", failing_save)
    argv = ["train", "--data", str(data), "--out", str(run), "--set", *SMALL, "--max-steps", "6",
            "--save-every", "2", "--eval-every", "0", "--threads", "1", "--no-tensorboard",
            "--no-progress", "--save-minutes", "1000"]
    assert cli_main(argv) == 2
    err = one_line(capsys.readouterr().err)
    reason = "File too large" if failure == "file size limit" else "No space left on device"
    assert err.startswith(f"aiayn train: error: cannot write {run}/checkpoints/step_000004: {reason}; ")
    assert err.rstrip().endswith("then continue with --resume (from step_000002, which is intact)")
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    model_io.load_model(run / "last")
    monkeypatch.undo()
    assert cli_main([*argv, "--resume"]) == 0
    assert [s for s, _ in ckpt.list_checkpoints(run)][-1] == 6


DROP_FILE_CAPABILITIES = """
import ctypes, json, os, sys
# as root, drop the capabilities that override file permissions, so a read-only directory is one
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    h, d = Header(0x20080522, 0), (Data * 2)()
    assert libc.capget(ctypes.byref(h), d) == 0
    for cap in (1, 2, 3):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
        d[0].effective &= ~(1 << cap)
    assert libc.capset(ctypes.byref(h), d) == 0, ctypes.get_errno()
import contextlib, io
from aiayn.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    results.append([rc, err.getvalue()])
print(json.dumps(results))
"""


@pytest.mark.slow
def test_read_only_output_directories_give_one_line(tmp_path, data, model_dir):
    ro = tmp_path / "ro"
    ro.mkdir()
    (tmp_path / "src.txt").write_text("a b\n", encoding="utf-8")
    commands = [
        ["prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train", str(data.parent / "train"),
         "--out", str(ro / "ds"), "--vocab-size", "25", "--model-type", "char"],
        ["average", "--inputs", str(model_dir), str(model_dir), "--out", str(ro / "avg")],
        ["translate", "--model", str(model_dir), "--input", str(tmp_path / "src.txt"),
         "--output", str(ro / "hyp.txt")],
    ]
    ro.chmod(0o555)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO), "AIAYN_ALLOCATOR": "system", "OMP_NUM_THREADS": "1"}
        r = subprocess.run([sys.executable, "-c", DROP_FILE_CAPABILITIES, json.dumps(commands)],
                           env=env, capture_output=True, text=True, timeout=120)
    finally:
        ro.chmod(0o755)
    assert r.returncode == 0, r.stderr
    for argv, (rc, err) in zip(commands, json.loads(r.stdout)):
        out = argv[argv.index("--out" if "--out" in argv else "--output") + 1]
        assert rc == 2, err
        assert one_line(err) == (f"aiayn {argv[0]}: error: cannot write {out}: Permission denied "
                                 f"({ro}/.{Path(out).name}.lock); check the permissions or write "
                                 f"somewhere else, then run the command again\n")
    assert os.listdir(ro) == []


def test_any_other_io_failure_is_one_line_too(monkeypatch, capsys, tmp_path):
    import aiayn.commands.info as info

    def broken(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "x.log"))

    monkeypatch.setattr(info, "main", broken)
    assert cli_main(["info"]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"aiayn info: error: {tmp_path}/x.log: No space left on device; free some disk space, then "
        f"run the command again\n")


# --- leftovers --------------------------------------------------------------------------------

def test_temporaries_of_dead_processes_are_removed_and_others_kept(tmp_path):
    out = tmp_path / "out.txt"
    dead, live = dead_pid(), os.getppid()
    stale_file = files.temp_path(out, pid=dead)
    stale_file.write_text("half")
    stale_dir = files.temp_path(tmp_path / "ds", pid=dead)
    stale_dir.mkdir()
    (stale_dir / "x.npy").write_bytes(b"\0")
    alive = files.temp_path(out, pid=live)
    alive.write_text("being written")
    other_host = tmp_path / f".out.txt.{dead}@00000000.ab.tmp"
    other_host.write_text("")
    user_file = tmp_path / ".out.txt.notes.tmp"  # not one of ours
    user_file.write_text("")
    # a previous version set aside by an interrupted swap is put back where its output is missing
    set_aside = files.temp_path(tmp_path / "model", "old", pid=dead)
    set_aside.mkdir()
    assert files.is_temporary(stale_file.name) and not files.is_temporary(user_file.name)

    assert files.remove_stale_temporaries(tmp_path, "out.txt") == [stale_file]
    assert stale_dir.exists()
    assert sorted(files.remove_stale_temporaries(tmp_path)) == [stale_dir]
    assert (tmp_path / "model").is_dir() and not set_aside.exists()
    assert alive.exists() and other_host.exists() and user_file.exists()


def test_a_later_run_cleans_what_killed_writers_left(tmp_path, model_dir):
    """A killed prepare leaves a hidden directory, a killed translate a 0-byte file: the next
    command into the same output removes them (here, through the writers and the lock)."""
    out = tmp_path / "hyp.txt"
    left = files.temp_path(out, pid=dead_pid())
    left.write_bytes(b"")
    (tmp_path / "src.txt").write_text("a b\n", encoding="utf-8")
    assert cli_main(["translate", "--model", str(model_dir), "--input", str(tmp_path / "src.txt"),
                     "--output", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.txt", "src.txt"]

    ds = tmp_path / "ds"
    left = files.temp_path(ds, pid=dead_pid())
    left.mkdir()
    (left / "train.src.ids.npy").write_bytes(b"\0" * 10)
    with locks.exclusive_lock(ds):
        assert not left.exists()


def test_write_dir_atomically_swaps_in_one_step_and_never_follows_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("mine")
    d = tmp_path / "d"
    files.write_dir_atomically(d, lambda t: (t / "a").write_text("1"))
    files.write_dir_atomically(d, lambda t: (t / "a").write_text("2"))
    assert (d / "a").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "outside"]
    link = tmp_path / "link"
    link.symlink_to(outside)
    files.write_dir_atomically(link, lambda t: (t / "a").write_text("3"))  # replaces the link itself
    files.delete_atomically(link)
    assert (outside / "keep").read_text() == "mine" and not os.path.lexists(link)


# --- no silent surprises ----------------------------------------------------------------------

def test_resume_with_no_checkpoint_says_it_starts_anew(data, tmp_path, capsys):
    run = tmp_path / "run"
    s = train(load_config("base", overrides=SMALL), data, run, quiet(max_steps=2, resume=True))
    assert s["steps"] == 2
    assert f"warning: --resume: {run} holds no checkpoint yet; starting a new run at step 0" in capsys.readouterr().err


def test_nul_bytes_are_counted_dropped_from_training_and_reported(tmp_path):
    src = ["a b", "c\0d", "e f", "g h"] * 5
    tgt = ["k l", "m n", "o\0p", "q r"] * 5
    for name, lines in (("t.xx", src), ("t.yy", tgt), ("v.xx", ["a\0b", "c"]), ("v.yy", ["k", "l"])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    said = []
    r = prepare_dataset(tmp_path / "ds", {"train": ParallelSource(tmp_path / "t.xx", tmp_path / "t.yy"),
                                          "valid": ParallelSource(tmp_path / "v.xx", tmp_path / "v.yy")},
                        PrepareOptions("xx", "yy", vocab_size=30, model_type="char"), log=said.append)
    train_info = r.manifest["splits"]["train"]
    assert train_info["filtered"]["nul"] == 10 and train_info["pairs"] == 10
    assert r.manifest["splits"]["valid"]["pairs"] == 2  # dev and test sets keep every line
    assert "warning: valid: 1 pair(s) hold NUL bytes (kept: dev and test sets are never filtered)" in said
    assert "NUL bytes 10" in format_summary(r)
    # text that is mostly NUL bytes is UTF-16 or binary: refused, naming the file
    (tmp_path / "u.xx").write_bytes("a b\n".encode("utf-16-le"))
    (tmp_path / "u.yy").write_text("k l\n")
    with pytest.raises(UserError, match=r"u.xx: 4 of its 8 bytes are NUL: UTF-16 or binary"):
        prepare_dataset(tmp_path / "ds2", {"train": ParallelSource(tmp_path / "u.xx", tmp_path / "u.yy")},
                        PrepareOptions("xx", "yy", vocab_size=30, model_type="char"))
