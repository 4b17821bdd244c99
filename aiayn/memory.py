"""Process-wide CPU memory settings that keep a training run from page-faulting its time away.

PyTorch's CPU allocator hands every tensor to the C library's malloc and back on every step. With
glibc's defaults a training step of `multi30k` faulted in ~56,000 fresh 4 KiB pages: freed memory
went back to the kernel (glibc trims the heap top and mmaps the largest tensors) and was faulted in
again on the next step. Two settings remove most of it:

  - glibc keeps freed memory in the process (no trimming, a 256 MiB pad when the heap grows, a
    fixed 32 MiB threshold for mmapping one allocation) so steady-state steps reuse warm pages;
  - PyTorch backs allocations of 2 MiB and more with transparent huge pages (THP_MEM_ALLOC_ENABLE;
    512x fewer faults for the rest, fewer TLB misses).

Measured on this repo's CPU machine (2 cores, `benchmarks/bench_memory.py`): 25x fewer page
faults and 14-20% more training tokens/s, from the first minute to the last of an hour's run (the
slow decline of tokens/s over a long run is something else: it remains, in the same proportion).
The `aiayn` command applies them at startup; Python API users call `tune_memory()` before the
first `import torch`. `AIAYN_TUNE_MEMORY=0` turns them off. They change speed and memory only,
never results.
"""

from __future__ import annotations

import ctypes
import os
import sys

OPT_OUT = "AIAYN_TUNE_MEMORY"

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


def _glibc_mallopt(settings: dict[int, int]) -> bool:
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (only glibc has it; musl's mallopt is a no-op)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(k, v) == 1 for k, v in settings.items())
