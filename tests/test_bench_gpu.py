"""benchmarks/gpu_e2e.sh (the WMT user's pipeline, killed once and resumed) run on the CPU at a tiny
size, as CI can run it, and benchmarks/gpu_table.py's table from a train_gpu.sh run's lines."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from helpers import REPO, free_port, pair


@pytest.mark.slow
def test_the_gpu_pipeline_script_runs_on_the_cpu_at_a_tiny_size(tmp_path):
    data = tmp_path / "m30k"
    data.mkdir()
    rng = random.Random(0)
    for name, n in (("train", 300), ("val", 30), ("test_2016_flickr", 30)):
        pairs = [pair(rng) for _ in range(n)]
        (data / f"{name}.en").write_text("".join(p[0] + "\n" for p in pairs))
        (data / f"{name}.de").write_text("".join(p[1] + "\n" for p in pairs))
    out = tmp_path / "out"
    # a budget in updates, a checkpoint every 10, and the kill as soon as the first one appears:
    # the same run on a loaded machine as on an idle one
    steps, save_every = 200, 10
    env = {**os.environ, "DATA": str(data), "OUT": str(out), "DEVICE": "cpu", "PRECISION": "fp32",
           "STEPS": str(steps), "SAVE_EVERY": str(save_every), "KILL_AFTER": "0", "VOCAB": "300",
           "PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1", "PET_MASTER_PORT": str(free_port()),  # torchrun's --master-port
           "SET": "d_model=32 d_ff=64 n_layers=1 n_heads=4 max_tokens=400 max_len_b=10"}
    r = subprocess.run(["bash", "benchmarks/gpu_e2e.sh"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    report = (out / "e2e.txt").read_text()
    assert "killed the first session after: step_" in report and "resuming" in report
    # the kill reached the trainer (torchrun starts it in a session of its own): the first session
    # never finished, and the second continued from its last checkpoint to the end of the budget
    assert "done:" not in (out / "train1.log").read_text()
    resumed_at = int(report.split("resuming ")[1].split(" at step ")[1].split()[0])
    done_at = int(report.split("done: ")[1].split()[0])
    assert 0 < resumed_at < done_at == steps and resumed_at % save_every == 0, report
    assert "averaged" in report and "BLEU" in report
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_updates"] == 0 and summary["stopped_by"] == "max_steps"
    assert (out / "dev.jsonl").read_text().count('"dev"') >= 1


def test_the_gpu_table_names_the_gpu_and_compares_with_torchs_best(tmp_path):
    rows = [{"system": "matmul", "tflops": 800.0, "gpu": "NVIDIA H100", "torch": "2.11",
             "commit": "abc1234", "clean": True, "machine": "Test CPU, 2 cores"},
            {"system": "torch", "config": "base", "tok_per_s": 100.0, "flops_per_tok": 4e9,
             "peak_gpu_mem_gb": 10.0},
            {"system": "torch", "config": "base", "tok_per_s": 150.0, "flops_per_tok": 4e9,
             "peak_gpu_mem_gb": 9.0, "compiled": True},
            {"system": "aiayn", "config": "base", "tok_per_s": 300.0, "flops_per_tok": 4e9,
             "peak_gpu_mem_gb": 6.0},
            {"system": "aiayn", "config": "base", "tok_per_s": 200.0, "flops_per_tok": 4e9,
             "peak_gpu_mem_gb": 7.0, "eager_loss": True},
            {"system": "aiayn", "config": "big", "failed": "aiayn: exit 124 (cap 150s)"}]
    lines = tmp_path / "train_gpu.jsonl"  # train_gpu.sh's log: JSON lines among others
    lines.write_text("starting\n" + "".join(json.dumps(r) + "\n" for r in rows))
    text = subprocess.run([sys.executable, "benchmarks/gpu_table.py", str(lines), "1000"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    assert "NVIDIA H100" in text and "800.0 TFLOP/s measured" in text
    assert "Commit: abc1234, clean tree; machine: Test CPU, 2 cores" in text  # the run's provenance
    line = next(x for x in text.splitlines() if x.startswith("| base | aiayn eager"))
    assert "| 300 |" in line and "| 0.1% |" in line and "| 0.1% |" in line and "2.00x" in line
    assert "torch compiled" in text and "exit 124" in text
    line = next(x for x in text.splitlines() if x.startswith("| base | aiayn eager, eager loss"))
    assert "| 200 |" in line and "1.33x" in line
