"""benchmarks/complexity_paths.py: Table 1's path lengths and sequential operations from each
layer kind's connectivity, on sequences small enough to work out by hand."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import complexity_paths as paths  # noqa: E402


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
