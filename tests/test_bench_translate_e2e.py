"""benchmarks/translate_e2e.py's CTranslate2 row searches the lengths aiayn searches: its calls
cap every sentence's output at least at aiayn's own cap, and at most at the cap of the longest
source in its call (no CTranslate2 needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from aiayn.decoding.common import max_output_lengths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import translate_e2e  # noqa: E402


def test_ct2_calls_cap_outputs_as_aiayn_does():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (203,), generator=g).tolist()
    for a, b in ((1.0, 50), (1.5, 10), (0.0, 7)):
        groups = translate_e2e.capped_groups(lengths, 64, (a, b))
        seen = [i for group, _ in groups for i in group]
        assert sorted(seen) == list(range(len(lengths)))  # every sentence once
        assert all(len(group) <= 64 for group, _ in groups)
        assert [lengths[i] for i in seen] == sorted(lengths, reverse=True)  # longest first
        mask = torch.zeros(len(lengths), 61, dtype=torch.bool)  # pieces + EOS, as aiayn counts
        for i, n in enumerate(lengths):
            mask[i, : n + 1] = True
        own = max_output_lengths(mask, a, b).tolist()
        for group, limit in groups:
            assert limit == max(own[i] for i in group)  # the longest source's cap, nobody cut short


def test_output_cap_reads_the_models_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_len_a": 1.2, "max_len_b": 30}))
    assert translate_e2e.output_cap(tmp_path) == (1.2, 30)
