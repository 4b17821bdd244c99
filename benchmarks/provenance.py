"""Where a benchmark's figures come from: the CPU's name and the commit, for every report (one
copy for all of benchmarks/; torch-free)."""

from __future__ import annotations

import os
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


def tree(repo: Path = REPO) -> tuple[str | None, bool | None]:
    """HEAD's short hash in checkout `repo` and whether its tracked files are as committed;
    (None, None) where it is not a git checkout."""
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode != 0:
        return None, None
    return head.stdout.strip(), not git("status", "--porcelain", "--untracked-files=no").stdout.strip()


def commit(repo: Path = REPO) -> str:
    """The repository's HEAD, marked when tracked files have uncommitted changes."""
    head, clean = tree(repo)
    if head is None:
        return "unknown (not a git checkout)"
    return head + ("" if clean else " (with uncommitted changes)")


def stamp(repo: Path = REPO) -> dict:
    """The fields every results file records: {"commit": "abc1234", "clean": True,
    "machine": "AMD EPYC, 2 cores"}; commit and clean are None outside a git checkout.
    A figure quoted in the README or a guide needs a file with "clean": true."""
    head, clean = tree(repo)
    return {"commit": head, "clean": clean, "machine": f"{cpu_name()}, {os.cpu_count()} cores"}


def stamp_line(fields: dict) -> str:
    """The markdown line of `stamp()`'s fields: "Commit: abc1234, clean tree; machine: ..."."""
    tree_state = {True: "clean tree", False: "with uncommitted changes"}.get(fields.get("clean"),
                                                                              "tree not recorded")
    return (f"Commit: {fields.get('commit') or 'not recorded'}, {tree_state}; "
            f"machine: {fields.get('machine') or 'not recorded'}")
