"""benchmarks/train_systems.py runs end to end on a tiny workload for aiayn and torch.nn.Transformer
(the peers available in the test environment), with the sizing options the GPU script
(benchmarks/train_gpu.sh) passes: the harness is not otherwise exercised by the suite, and a
broken import in it went unnoticed once."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--config", "tiny", "--threads", "1", "--windows", "1", "--steps", "2", "--warmup", "1",
        "--pairs", "120", "--vocab", "600", "--max-tokens", "600", "--lengths", "5", "12", "--json"]


def run_system(system: str) -> dict:
    env = {**os.environ, "AIAYN_ALLOCATOR": "system", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_systems.py"), "--system", system, *ARGS],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("system", ["aiayn", "torch"])
def test_train_systems_runs_with_sizing_options(system):
    out = run_system(system)
    assert out["system"] == system and out["device"] == "cpu" and out["vocab"] == 600
    assert out["tok_per_s"] > 0 and math.isfinite(out["loss_first"]) and math.isfinite(out["loss_last"])
    # random ids over 600 classes: the first loss is near ln(600) (label smoothing adds a little)
    assert abs(out["loss_first"] - math.log(600)) < 1.0
    lo, hi = out["mean_lengths"]
    assert 6 <= lo <= 13 and 6 <= hi <= 13  # lengths 5..12 plus EOS
    # the tiny model at vocabulary 600: 3+3 layers of d_model 256, d_ff 1024, one tied 600 x 256 table
    assert 5.0e6 < out["params"] < 6.5e6
