"""aiayn/memory.py: the process-wide malloc and huge-page settings. Each case runs in a fresh
interpreter, because the settings are per process and must come before torch's first allocation."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from aiayn.memory import MIMALLOC_OPTIONS, allocator_environment, mimalloc_library, tune_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
with_mimalloc = pytest.mark.skipif(mimalloc_library() is None or not sys.platform.startswith("linux"),
                                   reason="the cmeel-mimalloc wheel is not installed")
glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="the settings exist on Linux with glibc only")


def run_python(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("THP_MEM_ALLOC_ENABLE", "AIAYN_TUNE_MEMORY")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env={**environ, **env}, cwd=ROOT, check=True)
    return out.stdout.strip()


def test_turned_off_changes_nothing():
    environ = {"AIAYN_TUNE_MEMORY": "0"}
    assert tune_memory(environ) == []
    assert environ == {"AIAYN_TUNE_MEMORY": "0"}


@pytest.mark.slow
@glibc_only
def test_applies_both_before_torch_and_respects_a_user_setting():
    code = """
        import os
        from aiayn.memory import MIMALLOC_OPTIONS, allocator_environment, mimalloc_library, tune_memory
        print(tune_memory(), os.environ.get("THP_MEM_ALLOC_ENABLE"))
    """
    assert run_python(code) == "['THP_MEM_ALLOC_ENABLE', 'mallopt'] 1"
    assert run_python(code, THP_MEM_ALLOC_ENABLE="0") == "['mallopt'] 0"
    # after torch: huge pages can no longer be switched on, so they are not claimed
    late = "import torch\n" + textwrap.dedent(code)
    assert run_python(late) == "['mallopt'] None"


@pytest.mark.slow
@glibc_only
def test_the_cli_applies_them_at_startup():
    code = """
        import contextlib, io, os
        from aiayn.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["info", "--preset", "base"])
        print(os.environ.get("THP_MEM_ALLOC_ENABLE"))
    """
    assert run_python(code) == "1"
    assert run_python(code, AIAYN_TUNE_MEMORY="0") == "None"


STEP_FAULTS = """
    import resource, sys
    from aiayn.memory import tune_memory
    tune_memory()
    import torch
    torch.set_num_threads(1)
    def step():
        x = torch.ones(1024, 2048)  # 8 MiB = 2,048 pages
        ys = [x * i for i in range(6)]  # all alive at once, freed together
        return sum(y.sum() for y in ys)
    for _ in range(5):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
@glibc_only
def test_steady_state_steps_stop_page_faulting():
    # A step that allocates and frees ~56 MiB of tensors, like a training step. With glibc's
    # defaults the freed memory goes back to the kernel and is faulted in again: 1,900 to 12,000
    # faults a step here, varying from process to process with where the heap's top lands. Tuned,
    # steady-state steps reuse the process's pages: 0 to 180 faults a step.
    code = STEP_FAULTS
    faults_per_step = int(run_python(code)) / 20
    assert faults_per_step < 1024, faults_per_step  # less than half of one tensor's pages
    # and so does the malloc setting alone (huge pages off)
    assert int(run_python(code, THP_MEM_ALLOC_ENABLE="0")) / 20 < 1024



@linux_only
def test_allocator_environment_decides_when_and_how(monkeypatch):
    lib = "/opt/x/libmimalloc.so"
    env = allocator_environment({"PATH": "/bin"}, library=lib)
    assert env["LD_PRELOAD"] == lib and env["PATH"] == "/bin"
    assert all(env[k] == v for k, v in MIMALLOC_OPTIONS.items())
    # a user's own preloads and mimalloc options are kept
    env = allocator_environment({"LD_PRELOAD": "/a.so", "MIMALLOC_PURGE_DELAY": "5"}, library=lib)
    assert env["LD_PRELOAD"] == f"{lib}:/a.so" and env["MIMALLOC_PURGE_DELAY"] == "5"
    # none: asked not to, already preloaded (the restarted process itself), another allocator
    # chosen by the user, not installed
    assert allocator_environment({"AIAYN_ALLOCATOR": "system"}, library=lib) is None
    assert allocator_environment({"LD_PRELOAD": lib}, library=lib) is None
    assert allocator_environment({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, library=lib) is None
    monkeypatch.setattr("aiayn.memory.mimalloc_library", lambda: None)
    assert allocator_environment({}) is None
    with pytest.raises(ValueError, match="AIAYN_ALLOCATOR must be one of mimalloc, system, got 'jemalloc'"):
        allocator_environment({"AIAYN_ALLOCATOR": "jemalloc"}, library=lib)
    # translate keeps the C library's malloc unless asked for mimalloc; other commands restart
    assert allocator_environment({}, library=lib, command="translate") is None
    assert allocator_environment({"AIAYN_ALLOCATOR": "mimalloc"}, library=lib,
                                 command="translate")["LD_PRELOAD"] == lib
    assert allocator_environment({}, library=lib, command="train")["LD_PRELOAD"] == lib


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "AIAYN_ALLOCATOR")}
    return subprocess.run([sys.executable, "-m", "aiayn", *args], capture_output=True, text=True,
                          env={**environ, **env}, cwd=ROOT)


@pytest.mark.slow
@with_mimalloc
def test_the_command_restarts_on_mimalloc_unless_told_not_to():
    allocator = [ln for ln in run_cli("info", "--preset", "base").stdout.splitlines()
                 if ln.startswith("allocator")]
    assert allocator and allocator[0].split()[1] == "mimalloc"
    out = run_cli("info", "--preset", "base", AIAYN_ALLOCATOR="system").stdout
    assert "allocator       system malloc" in out
    bad = run_cli("info", "--preset", "base", AIAYN_ALLOCATOR="tcmalloc")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "aiayn: error: AIAYN_ALLOCATOR must be one of mimalloc, system, got 'tcmalloc'"]


def test_called_with_arguments_the_cli_never_restarts(capsys):
    from aiayn.cli import main
    from aiayn.memory import allocator_in_use

    assert main(["info", "--preset", "base"]) == 0  # an execve would have ended pytest here
    assert f"allocator       {allocator_in_use()}" in capsys.readouterr().out


@with_mimalloc
def test_mimalloc_keeps_steady_state_steps_from_page_faulting():
    # with its options (freed memory is never purged back to the kernel) mimalloc, too, reuses
    # the process's pages from step to step
    faults = int(run_python(STEP_FAULTS, LD_PRELOAD=mimalloc_library(), **MIMALLOC_OPTIONS)) / 20
    assert faults < 1024, faults
