"""Table 1 (`aiayn study table1`): the path lengths and sequential operations from each layer
kind's connectivity (aiayn/recipes/table1_paths.py), on sequences small enough to work out by
hand; the command end to end at a tiny size, its report redrawn, and the --out it refuses."""

from __future__ import annotations

import json
import math

import pytest

from aiayn.cli import main as cli_main
from aiayn.recipes import table1_paths as paths


def test_self_attention_connects_every_pair_in_one_layer():
    s = paths.path_lengths(paths.self_attention(), 16)
    assert (s.max_path, s.layers, s.connected) == (1, 1, 1.0)


@pytest.mark.parametrize("r", [1, 3, 5])
def test_restricted_attention_needs_n_over_r_layers(r):
    s = paths.path_lengths(paths.restricted(r), 16)
    assert s.max_path == s.layers == math.ceil(15 / r)  # positions 0 and 15, r at a time
    assert s.connected == 1.0


def test_recurrence_walks_the_sequence():
    s = paths.path_lengths(paths.recurrent(), 16)
    assert s.max_path == 16  # input 0 -> h_0, then 15 recurrent steps to h_15
    assert s.layers == 1  # a second layer never shortens a path
    assert s.connected == pytest.approx(136 / 256)  # only i >= j: the layer reads the past


@pytest.mark.parametrize("k, expected", [(3, 15), (5, 8)])
def test_contiguous_convolutions_need_n_over_k_layers(k, expected):
    s = paths.path_lengths(paths.convolution(k), 16)
    assert s.max_path == s.layers == expected  # (k - 1) / 2 positions further per layer


def test_dilated_convolutions_need_log_k_n_layers():
    # dilations 1, 3, 9 (27 >= 14 would be useless: the cycle restarts at 1)
    best, _ = paths.shortest_paths(paths.convolution(3, dilated=True), 14)
    assert best[0, 13] == 3  # 0 -> 1 -> 4 -> 13: one step of each dilation
    assert best[0, 2] == 4  # 0 -> 1, two layers with no step in range, -> 2 at dilation 1 again
    assert best[5, 5] == 1 and best[7, 4] == 2  # itself; 7 -> 7 -> 4
    far = [paths.path_lengths(paths.convolution(3, dilated=True), n).max_path for n in (81, 729)]
    assert far[1] - far[0] <= 2 * 2  # two more dilations per factor 9: logarithmic, not linear


def test_a_shallow_stack_leaves_pairs_unconnected():
    s = paths.path_lengths(paths.convolution(3), 16, max_layers=6)
    within = sum(abs(i - j) <= 6 for i in range(16) for j in range(16))
    assert s.connected == pytest.approx(within / 256) and s.max_path == 6


def test_sequential_operations():
    assert paths.sequential_operations(paths.recurrent(), 37) == 37
    for conn in (paths.self_attention(), paths.restricted(2), paths.convolution(3)):
        assert paths.sequential_operations(conn, 37) == 1


TINY = ["--set", "d=32", "heads=4", "r=2,4", "n_min=16", "n_max=32", "fit_from=16",
        "path_n_max=32", "min_seconds=0", "--threads", "1", "--no-progress"]


def test_study_table1_measures_reports_and_refuses_what_is_not_its_own(tmp_path, capsys):
    out = tmp_path / "t1"
    assert cli_main(["study", "table1", "--out", str(out), *TINY]) == 0
    result = json.loads((out / "complexity.json").read_text())
    assert result["settings"]["r"] == [2, 4] and result["settings"]["d"] == 32
    for name, row in result["rows"].items():
        assert [p["n"] for p in row["points"]] == [16, 32], name
        assert all(p["fwd_s"] > 0 and p["flops"] > 0 and p["reps"] >= 1 for p in row["points"])
    # self-attention's FLOPs grow faster in n than the GRU's (n^2 d against n d^2)
    flops = {k: [p["flops"] for p in v["points"]] for k, v in result["rows"].items()}
    sa, gru = flops["self-attention (core)"], flops["recurrent (GRU)"]
    assert sa[1] / sa[0] > gru[1] / gru[0]
    assert result["structure"]["self-attention"]["max_path"] == [1, 1]
    assert result["structure"]["recurrent (GRU)"]["max_path"] == [16, 32]
    page = (out / "complexity.md").read_text()
    assert "aiayn study table1" in page and "| restricted r=2 |" in page
    assert (out / "complexity.png").stat().st_size > 0
    capsys.readouterr()

    assert cli_main(["study", "table1", "--out", str(out), *TINY]) == 2  # never measured over
    assert "holds a Table 1 measurement" in capsys.readouterr().err
    (out / "complexity.md").unlink()
    assert cli_main(["study", "table1", "--out", str(out), "--report-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == result
    assert (out / "complexity.md").read_text() == page
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for argv, says in [(["--out", str(other)], "not empty"),
                       (["--out", str(tmp_path / "new"), "--report-only"], "no Table 1 measurement"),
                       (["--out", str(tmp_path / "new"), "--data", str(tmp_path)], "--data is Table 3's"),
                       (["--out", str(tmp_path / "new"), "--set", "width=3"], "--set width=3"),
                       (["--out", str(tmp_path / "new"), "--set", "r=3"], "two windows")]:
        assert cli_main(["study", "table1", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "t1"]  # nothing made
