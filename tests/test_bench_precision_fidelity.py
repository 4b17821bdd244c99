"""benchmarks/precision_fidelity.py: its divergence is what its docs say (KL and argmax against an
independent computation, over every target position and no padding), fp32 against itself
measures nothing, and int8 measures something."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiayn.data.model_dir import load_model
from aiayn.decoding.int8 import activation_levels, cpu_flags
from aiayn.decoding.precision import convert
from aiayn.special import BOS_ID, EOS_ID

from helpers import REPO, TEXTS, needs_int8

SCRIPT = REPO / "benchmarks" / "precision_fidelity.py"


def texts(tmp_path: Path) -> tuple[Path, Path]:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(t + "\n" for t in TEXTS[:6]), encoding="utf-8")
    ref.write_text("".join(" ".join(t.split()[::-1]) + "\n" for t in TEXTS[:6]), encoding="utf-8")
    return src, ref


def independent_row(model_dir: Path, src: Path, ref: Path, precision: str) -> dict:
    """One sentence at a time, no padding: torch's own KL(p_fp32 || p_prec) and argmax changes at
    every target position (pieces + EOS)."""
    loaded = load_model(model_dir)
    fp32, other = loaded.model.eval(), convert(load_model(model_dir).model.eval(), precision)
    kl = positions = moved = 0.0
    for s, r in zip(src.read_text(encoding="utf-8").splitlines(),
                    ref.read_text(encoding="utf-8").splitlines()):
        ids, out = loaded.src_tokenizer.encode(s) + [EOS_ID], loaded.tgt_tokenizer.encode(r)
        x, y = torch.tensor([ids]), torch.tensor([[BOS_ID] + out])
        with torch.inference_mode():
            p, q = (m(x, y).float().log_softmax(-1)[0] for m in (fp32, other))  # (T, V)
        kl += float(F.kl_div(q, p, log_target=True, reduction="sum"))
        positions += len(out) + 1
        moved += int((p.argmax(-1) != q.argmax(-1)).sum())
    return {"positions": positions, "kl_mnats": 1000 * kl / positions,
            "argmax_moved_pct": 100 * moved / positions}


@pytest.mark.slow
@needs_int8
def test_fidelity_rows_fp32_measures_nothing_int8_something(model_dir, tmp_path):
    src, ref = texts(tmp_path)
    out = tmp_path / "f.json"
    cmd = [sys.executable, str(SCRIPT), "--model", str(model_dir),
           "--src", str(src), "--ref", str(ref), "--precisions", "fp32", "int8",
           "--threads", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["fp32"]["kl_mnats"] == 0 and rows["fp32"]["argmax_moved_pct"] == 0
    assert rows["int8"]["kl_mnats"] > 0
    assert rows["int8"]["positions"] == rows["fp32"]["positions"] > 6  # every target token
    want = independent_row(model_dir, src, ref, "int8")
    assert rows["int8"]["positions"] == want["positions"]  # padding counts for nothing
    assert rows["int8"]["kl_mnats"] == pytest.approx(want["kl_mnats"], rel=1e-3)
    assert rows["int8"]["argmax_moved_pct"] == pytest.approx(want["argmax_moved_pct"])
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwrites
    # int8 as an AVX2 CPU computes it: 63 levels, coarser than 127 where this CPU has VNNI
    out63 = tmp_path / "f63.json"
    subprocess.run(cmd[:-1] + [str(out63), "--int8-levels", "63"], check=True, capture_output=True)
    rows63 = {r["system"]: r for r in json.loads(out63.read_text())["rows"]}
    assert set(rows63) == {"fp32", "int8, 63 levels"} and rows63["int8, 63 levels"]["kl_mnats"] > 0
    if activation_levels(cpu_flags()) == 127:
        assert rows63["int8, 63 levels"]["kl_mnats"] > rows["int8"]["kl_mnats"]
