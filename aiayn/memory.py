"""Process-wide CPU memory settings that keep a training run from page-faulting its time away.

PyTorch's CPU allocator hands every tensor to the C library's malloc and back on every step. With
glibc's defaults, freed memory goes back to the kernel (glibc trims the heap top and mmaps the
largest tensors) and is faulted in again on the next step. Two settings keep it in the process:

  - glibc keeps freed memory (no trimming, a 256 MiB pad when the heap grows, a fixed 32 MiB
    threshold for mmapping one allocation), so steady-state steps reuse warm pages;
  - PyTorch backs allocations of 2 MiB and more with transparent huge pages
    (THP_MEM_ALLOC_ENABLE: 512x fewer faults for those, fewer TLB misses).

The allocator is the second part. Batches of variable length give tensors of ever new sizes, and
glibc's best-fit heap fills with free chunks of every size between the live ones, so large
requests get slower as a run goes on. mimalloc (size classes instead of one best-fit list) does not
fragment that way, so the `aiayn` command re-executes itself once at startup with mimalloc
preloaded (`LD_PRELOAD`; the `cmeel-mimalloc` wheel, a dependency on Linux), keeping freed memory
in the process as above (`MIMALLOC_PURGE_DELAY=-1`). `AIAYN_ALLOCATOR=system` keeps the C
library's malloc (`aiayn translate` keeps it unless asked for mimalloc: `SYSTEM_MALLOC_COMMANDS`);
`AIAYN_TUNE_MEMORY=0` turns the glibc and huge-page settings off. Python API users call
`tune_memory()` before the first `import torch` (and preload mimalloc themselves).

These settings change speed and memory only. A different allocator places tensors at other
addresses, where oneDNN's kernels may round differently: runs agree to ~1e-3 in loss after
hundreds of steps, not bit for bit (a run and its `--resume` stay on one allocator). What each
setting gains, measured, with the commands: docs/experiments/performance.md.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import sys

OPT_OUT = "AIAYN_TUNE_MEMORY"
ALLOCATOR = "AIAYN_ALLOCATOR"  # "mimalloc" (the default where installed) or "system"
ALLOCATORS = ("mimalloc", "system")
# Commands whose default is the C library's malloc: decoding a file allocates tensors of ever new
# sizes too, but briefly, and mimalloc's kept memory only added to its peak (`aiayn translate` of
# Multi30k's test set: the same time within noise, 15-20% more peak RSS; the measurement is in
# docs/experiments/decoding.md). AIAYN_ALLOCATOR=mimalloc still asks for it.
SYSTEM_MALLOC_COMMANDS = frozenset({"translate"})
# Set when absent (a user's own value wins): keep freed memory (no purging back to the kernel, as
# the glibc settings above do) and back large spans with huge pages
MIMALLOC_OPTIONS = {"MIMALLOC_PURGE_DELAY": "-1", "MIMALLOC_ALLOW_LARGE_OS_PAGES": "1"}

# mallopt(3) parameter numbers, from glibc's malloc.h
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_GLIBC_SETTINGS = {
    _M_MMAP_THRESHOLD: 32 << 20,  # glibc's largest; bigger tensors are mmapped (and THP-backed)
    _M_TRIM_THRESHOLD: 2**31 - 1,  # the largest int: never give the heap top back to the kernel
    _M_TOP_PAD: 256 << 20,  # grow the heap in large steps
}


def tune_memory(environ=os.environ) -> list[str]:
    """Apply the settings above to this process; returns what was applied (names), [] when turned
    off or unsupported. Idempotent. Effective for PyTorch's huge pages only if torch has not
    allocated yet (call it before `import torch`); the malloc settings apply at any time."""
    if environ.get(OPT_OUT, "1") == "0":
        return []
    applied = []
    if sys.platform.startswith("linux"):
        # c10 reads it once, at its first CPU allocation; an explicit user setting wins
        if "torch" not in sys.modules and environ.setdefault("THP_MEM_ALLOC_ENABLE", "1") == "1":
            applied.append("THP_MEM_ALLOC_ENABLE")
        if _glibc_mallopt(_GLIBC_SETTINGS):
            applied.append("mallopt")
    return applied


def mimalloc_library() -> str | None:
    """Path of the libmimalloc.so installed by the `cmeel-mimalloc` wheel; None when absent."""
    try:
        files = importlib.metadata.files("cmeel-mimalloc") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    libs = sorted((f for f in files if f.name.startswith("libmimalloc.so")), key=lambda f: len(f.name))
    for f in libs:
        path = str(f.locate())
        if os.path.exists(path):
            return path
    return None


def allocator_environment(environ=os.environ, library: str | None = None,
                          command: str | None = None) -> dict[str, str] | None:
    """The environment under which to re-execute this process with mimalloc preloaded, or None when
    it should run as it is (Linux only; `AIAYN_ALLOCATOR=system`, or unset for a `command` in
    `SYSTEM_MALLOC_COMMANDS`; mimalloc, jemalloc or tcmalloc already preloaded; the library not
    installed). `library` defaults to `mimalloc_library()`. Raises ValueError for an unknown
    AIAYN_ALLOCATOR."""
    choice = environ.get(ALLOCATOR, "system" if command in SYSTEM_MALLOC_COMMANDS else "mimalloc")
    if choice not in ALLOCATORS:
        raise ValueError(f"{ALLOCATOR} must be one of {', '.join(ALLOCATORS)}, got {choice!r}")
    preload = environ.get("LD_PRELOAD", "")
    if choice == "system" or not sys.platform.startswith("linux") or any(
            name in preload for name in ("libmimalloc", "jemalloc", "tcmalloc")):  # chosen already
        return None
    library = library or mimalloc_library()
    if library is None:
        return None
    return {**MIMALLOC_OPTIONS, **environ, "LD_PRELOAD": f"{library}:{preload}" if preload else library}


def restart_with_allocator(args: list[str], command: str | None = None) -> None:
    """Replace this process (same PID) by `args` run with mimalloc preloaded, when
    `allocator_environment()` says so for `command`; returns only when it does not. Call it
    before anything."""
    env = allocator_environment(command=command)
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(args[0], args, env)


def allocator_in_use() -> str:
    """'mimalloc' when libmimalloc is loaded in this process, else 'system malloc'."""
    try:
        with open("/proc/self/maps") as f:
            return "mimalloc" if "libmimalloc" in f.read() else "system malloc"
    except OSError:
        return "system malloc"


def _glibc_mallopt(settings: dict[int, int]) -> bool:
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it; musl's mallopt is a no-op)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(k, v) == 1 for k, v in settings.items())
