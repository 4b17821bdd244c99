"""benchmarks/precision_fidelity.py and benchmarks/bleu_noise.py: the divergence and the noise
are what their docs say (hand-computed KL, per-row noise of the stated size), fp32 against itself
measures nothing, int8 measures something, and noise of size 0 moves no sacreBLEU."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import bleu_noise  # noqa: E402
import precision_fidelity  # noqa: E402

from aiayn.decoding.int8 import activation_levels, cpu_flags  # noqa: E402

from helpers import TEXTS, needs_int8  # noqa: E402


def test_divergence_by_hand():
    ref = torch.tensor([[0.6, 0.4, 0.0], [0.5, 0.25, 0.25]]).log()
    got = torch.tensor([[0.3, 0.7, 0.0], [0.5, 0.25, 0.25]]).log()
    kl, n, moved = precision_fidelity.divergence(ref, got, torch.tensor([True, True]))
    assert kl == pytest.approx(0.6 * math.log(2) + 0.4 * math.log(4 / 7), abs=1e-6)
    assert (n, moved) == (2, 1)
    # the positions `keep` leaves out count for nothing
    assert precision_fidelity.divergence(ref, got, torch.tensor([False, True])) == (
        pytest.approx(0.0, abs=1e-7), 1, 0)


def test_noise_is_per_row_of_the_stated_size_and_seeded():
    model = torch.nn.Sequential(torch.nn.Linear(4000, 3), torch.nn.LayerNorm(3))
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(3, 4000) * torch.tensor([[0.1], [1.0], [10.0]]))
    before = [p.detach().clone() for p in model.parameters()]
    again = copy.deepcopy(model)
    bleu_noise.perturb(model, 2.0, seed=1)
    delta = model[0].weight.detach() - before[0]
    expected = before[0].abs().amax(dim=1) * 2.0 / 127 / math.sqrt(12)  # (3,)
    torch.testing.assert_close(delta.std(dim=1), expected, rtol=0.05, atol=0)
    assert all(torch.equal(p, b) for p, b in zip(list(model.parameters())[1:], before[1:]))
    bleu_noise.perturb(again, 2.0, seed=1)  # the same seed, the same noise
    assert torch.equal(again[0].weight, model[0].weight)


def test_spread():
    s = bleu_noise.spread([0.1, -0.3, 0.2])
    assert s["mean"] == pytest.approx(0.0, abs=1e-12)
    assert s["sd"] == pytest.approx(math.sqrt((0.01 + 0.09 + 0.04) / 2))
    assert s["max_abs"] == pytest.approx(0.3)


def texts(tmp_path: Path) -> tuple[Path, Path]:
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(t + "\n" for t in TEXTS[:6]), encoding="utf-8")
    ref.write_text("".join(" ".join(t.split()[::-1]) + "\n" for t in TEXTS[:6]), encoding="utf-8")
    return src, ref


@needs_int8
def test_fidelity_rows_fp32_measures_nothing_int8_something(model_dir, tmp_path):
    src, ref = texts(tmp_path)
    out = tmp_path / "f.json"
    cmd = [sys.executable, str(BENCH / "precision_fidelity.py"), "--model", str(model_dir),
           "--src", str(src), "--ref", str(ref), "--precisions", "fp32", "int8",
           "--threads", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["fp32"]["kl_mnats"] == 0 and rows["fp32"]["argmax_moved_pct"] == 0
    assert rows["int8"]["kl_mnats"] > 0
    assert rows["int8"]["positions"] == rows["fp32"]["positions"] > 6  # every target token
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwrites
    # int8 as an AVX2 CPU computes it: 63 levels, coarser than 127 where this CPU has VNNI
    out63 = tmp_path / "f63.json"
    subprocess.run(cmd[:-1] + [str(out63), "--int8-levels", "63"], check=True, capture_output=True)
    rows63 = {r["system"]: r for r in json.loads(out63.read_text())["rows"]}
    assert set(rows63) == {"fp32", "int8, 63 levels"} and rows63["int8, 63 levels"]["kl_mnats"] > 0
    if activation_levels(cpu_flags()) == 127:
        assert rows63["int8, 63 levels"]["kl_mnats"] > rows["int8"]["kl_mnats"]


def test_noise_of_size_zero_moves_no_bleu(model_dir, tmp_path):
    src, ref = texts(tmp_path)
    out = tmp_path / "n.json"
    subprocess.run([sys.executable, str(BENCH / "bleu_noise.py"), "--model", str(model_dir),
                    "--pairs", str(src), str(ref), "--seeds", "2", "--scale", "0",
                    "--threads", "1", "--out", str(out)], check=True, capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    assert list(rows) == ["exact src.txt"]
    assert rows["exact src.txt"]["deltas"] == [0.0, 0.0]
