"""Where a benchmark's figures come from: the CPU's name and the commit, for every report (one
copy for all of benchmarks/; torch-free)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_names() -> list[str]:
    """The "model name" of each logical CPU in /proc/cpuinfo ([] where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    return [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]


def cpu_name() -> str:
    """The CPU's model name (the platform's processor or architecture where /proc has none)."""
    names = cpu_names()
    return names[0] if names else (platform.processor() or platform.machine() or "unknown")


def commit() -> str:
    """The repository's HEAD, marked when tracked files have uncommitted changes."""
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
