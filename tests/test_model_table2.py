"""Table 2's training cost: the paper's count (time x GPUs x sustained TFLOPS) reproduces its
printed figures, and `aiayn info` prints it beside the analytic count for base and big."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from aiayn.config import PRESETS
from aiayn.model.counting import TABLE2, flops_per_target_token, training_flops

from helpers import run_cli


def test_the_papers_count_gives_table2():
    # 12 hours and 3.5 days on 8 P100s of 9.5 TFLOPS (Table 2 prints two significant figures)
    assert TABLE2["base"].flops == 12 * 3600 * 8 * 9.5e12
    assert TABLE2["big"].flops == 84 * 3600 * 8 * 9.5e12
    for cost in TABLE2.values():
        assert float(f"{cost.flops:.1e}") == cost.reported


def test_analytic_training_flops():
    cfg = replace(PRESETS["base"], vocab_size=37000)
    assert training_flops(cfg, 100_000) == flops_per_target_token(cfg) * 100_000 * 25_000
    assert training_flops(cfg, 10, 7, 30, 20) == flops_per_target_token(cfg, 30, 20) * 70


@pytest.mark.slow
def test_info_prints_table2_for_base_and_big():
    r = run_cli("info", "--preset", "C-N2", "--json")
    assert r.returncode == 0, r.stderr
    t2 = json.loads(r.stdout)["table2"]
    assert set(t2) == {"base", "big"}
    for name, steps in (("base", 100_000), ("big", 300_000)):
        cfg = replace(PRESETS[name], vocab_size=37000)
        assert t2[name]["analytic_flops"] == pytest.approx(training_flops(cfg, steps))
        assert t2[name]["paper_flops"] == TABLE2[name].flops
        assert t2[name]["paper_over_analytic"] == pytest.approx(
            TABLE2[name].flops / training_flops(cfg, steps))
    text = run_cli("info").stdout
    assert "Table 2, training cost" in text and "(Table 2: 3.3e+18)" in text
    assert "(Table 2: 2.3e+19)" in text
