"""The chaos benchmark in small: each command killed with SIGKILL twice (once at a random moment,
once just as it starts writing its output) on tiny fixtures; nothing may be lost or torn, and the
rerun must reproduce the uninterrupted result exactly. The documented run (50 trials per command)
is `benchmarks/chaos.py`; docs/experiments/chaos.md has its tallies."""

from __future__ import annotations

import sys

from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import chaos  # noqa: E402


def test_two_kills_per_command_lose_nothing(tmp_path):
    tallies = chaos.chaos(list(chaos.COMMANDS), trials=2, seed=1, quick=True, workdir=tmp_path,
                          log=lambda m: None)
    for command, t in tallies.items():
        assert (t.trials, t.ok) == (2, 2), (command, t.failures)
