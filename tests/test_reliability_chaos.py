"""The chaos harness in small: each command killed with SIGKILL twice (once at a random moment,
once just as it starts writing its output) on tiny fixtures; nothing may be lost or torn, and the
rerun must reproduce the uninterrupted result exactly. A kill that comes after the command
finished tests nothing: the harness then starts it again with an earlier kill, and the kills must
have hit live processes: every trial's last, and three in four of all. The documented run (50
trials per command) is `tools/chaos.py`; docs/experiments/chaos.md has its tallies."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO


@pytest.mark.slow
def test_two_kills_per_command_lose_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "tools" / "chaos.py"), "--trials", "2",
                           "--seed", "1", "--quick", "--workdir", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # | command | trials | ok | kills | hit a live process | killed while writing |
    #   finished before the kill | failures |
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in done.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| command")]
    assert {r[0] for r in rows} == {"train", "train-chart", "prepare", "average", "translate"}
    for command, trials, ok, kills, live, _, finished, failures in rows:
        assert (trials, ok, failures) == ("2", "2/2", "none"), command
        assert int(kills) == int(live) + int(finished), command
        # each trial ends at its first kill of a live process: none ran out of earlier kills
        assert live == trials, (command, done.stdout)
    kills, live = (sum(int(r[i]) for r in rows) for i in (3, 4))
    assert live >= 3 / 4 * kills, done.stdout
