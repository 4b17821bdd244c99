"""tools/gpu_micro.py, the microbenchmark that decides the GPU step's redesign, run as a
command on the CPU at a tiny size: every row is in its JSON (measured, or saying why not), the
layouts' attention outputs and the two losses agree, a bad --data is one line and exit 2, the
budget skips rows, and benchmarks/gpu_session.sh runs it first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, tiny_dataset

SCRIPT = REPO / "tools" / "gpu_micro.py"
ROWS = {"attention": ["masked", "packed varlen", "equal-length buckets"],
        "loss": ["label_smoothed_loss", "linear_cross_entropy chunked"],
        "step": ["eager", "CUDA graph", "reduce-overhead compile"]}
TINY = ["--config", "tiny", "--dtype", "fp32", "--device", "cpu", "--reps", "1", "--warmup", "0"]


def micro(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIAYN_ALLOCATOR": "system", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def rows_by_name(report: dict) -> dict:
    got = {(r["part"], r["variant"]): r for r in report["rows"]}
    assert len(got) == len(report["rows"]), "a row twice"
    assert set(got) == {(p, v) for p, vs in ROWS.items() for v in vs}
    return got


def test_a_bad_data_directory_is_one_line_and_exit_2(tmp_path):
    r = micro(*TINY, "--data", str(tmp_path / "nowhere"), timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nowhere" in lines[0] and "aiayn prepare" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_the_gpu_session_runs_the_microbenchmark_first():
    session = REPO / "benchmarks" / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(session)], capture_output=True).returncode == 0
    commands, in_function = [], False  # what runs, in order: the lines outside function bodies
    for ln in session.read_text().splitlines():
        if re.match(r"^\w+\(\) \{\s*$", ln):
            in_function = True
        elif in_function and ln.startswith("}"):
            in_function = False
        elif not in_function and ln.strip() and not ln.lstrip().startswith("#"):
            commands.append(ln)
    first = next(i for i, ln in enumerate(commands) if "tools/gpu_micro.py" in ln)
    later = [i for i, ln in enumerate(commands)
             if any(s in ln for s in ("train_gpu.sh", "gpu_e2e.sh", "profile_step.py", "compiled_rows"))]
    assert later and first < min(later)


@pytest.mark.slow
def test_every_row_is_reported_and_the_variants_agree_on_the_cpu(tmp_path):
    out = tmp_path / "micro.json"
    r = micro(*TINY, "--lengths", "multi30k", "--tokens", "200", "--vocab", "300", "--updates", "2",
              "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["torch"] and report["commit"]
    assert set(report["apis"]) >= {"varlen_attn", "linear_cross_entropy", "cuda_graphs"}
    b = report["batches"]
    assert b["updates"] == 2 and b["micro_batches"] == 2 and b["sentences"] > 2
    # aiayn's sampler: at most 200 padded tokens a side per micro-batch
    assert all(s[0] * s[1] <= 200 and t[0] * t[1] <= 200 for s, t in b["shapes"])
    rows = rows_by_name(report)
    for row in rows.values():
        assert row["config"] == "tiny"
        if row["status"] == "ok":
            assert row["ms"] > 0 and row["tokens"] > 0
        else:  # not measured here: it says why
            assert row["status"] in ("unavailable", "needs CUDA") and row["reason"], row
    for part, variants in ROWS.items():
        assert rows[(part, variants[0])].get("today") and rows[(part, variants[0])]["status"] == "ok"

    # attention: the buckets, and the packed layout through varlen_attn's meaning written out,
    # give today's outputs on every real token
    assert rows[("attention", "equal-length buckets")]["status"] == "ok"
    assert rows[("attention", "equal-length buckets")]["max_abs_diff"] < 1e-5
    assert rows[("attention", "equal-length buckets")]["speedup"] > 0
    packed = rows[("attention", "packed varlen")]
    assert packed["status"] in ("needs CUDA", "unavailable")
    if packed["status"] == "needs CUDA":
        assert packed["max_abs_diff"] < 1e-5
    # computed positions: padded for today, real tokens only for the packed layout
    assert rows[("attention", "masked")]["computed_tokens"] >= rows[("attention", "masked")]["tokens"]

    # the loss: the chunked projection plus the smoothing term is aiayn's label-smoothed loss
    chunked = rows[("loss", "linear_cross_entropy chunked")]
    if report["apis"]["linear_cross_entropy"]["available"]:
        assert chunked["status"] == "ok", chunked
        c = chunked["check"]
        today, theirs = c["loss_per_token"]
        assert 1.0 < today < 20 and abs(today - theirs) < 1e-4 * today
        assert c["max_abs_diff_grad_hidden"] <= 1e-4 * c["max_abs_grad_hidden"]
        assert c["max_abs_diff_grad_weight"] <= 1e-4 * c["max_abs_grad_weight"]
    else:
        assert chunked["status"] == "unavailable" and "unavailable in torch" in chunked["reason"]

    # the step: eager here; graphs need CUDA
    assert rows[("step", "eager")]["status"] == "ok"
    for variant in ("CUDA graph", "reduce-overhead compile"):
        assert rows[("step", variant)]["status"] == "needs CUDA"
    # the printed table has every row
    table = [ln for ln in r.stdout.splitlines() if ln.startswith("| tiny |")]
    assert len(table) == len(rows)


@pytest.mark.slow
def test_a_prepared_dataset_gives_the_batches_and_the_budget_skips_rows(tmp_path):
    data = tiny_dataset(tmp_path / "raw")
    out = tmp_path / "micro.json"
    r = micro(*TINY, "--data", str(data), "--tokens", "300", "--updates", "1", "--budget-s", "0",
              "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert str(data) in report["batches"]["source"] and report["batches"]["sentences"] > 1
    rows = rows_by_name(report)
    assert all(row["status"] == "skipped" and "--budget-s" in row["reason"] for row in rows.values())
    # the report is not overwritten without --overwrite
    again = micro(*TINY, "--data", str(data), "--out", str(out), timeout=60)
    assert again.returncode == 2 and "--overwrite" in again.stderr
