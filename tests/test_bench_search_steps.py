"""benchmarks/search_steps.py counts a search without changing it: the counted pass translates
as a plain one does, its counts agree with each other (every live sentence holds `beam` rows at
each step), and the rules differ as the stopping bound says they must."""

from __future__ import annotations

import sys
from pathlib import Path

from aiayn.decoding import beam
from aiayn.decoding.translate import Translator
from aiayn.model import cache
from aiayn.model.io import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import search_steps  # noqa: E402

LINES = ["a dog runs", "the cat", "", "two men play in the park", "a red car"]
ORIGINAL = {"step": beam.BeamSearch.step, "reorder": cache.KVCache.reorder}


def test_counts_agree_and_leave_the_search_unchanged(model_dir):
    loaded = load_model(model_dir)
    counted = {}
    for rule in ("exact", "current"):
        tr = Translator(loaded, early_stop=rule, beam_size=3, alpha=1.0)
        plain = tr.translate(LINES)
        c = search_steps.count(tr, LINES)
        assert beam.BeamSearch.step is ORIGINAL["step"]  # wrappers removed
        assert cache.KVCache.reorder is ORIGINAL["reorder"]
        assert tr.translate(LINES) == plain
        assert c["beam"] == 3
        assert len(c["sentences"]) == 4  # the blank line never reaches the search
        steps = [s for s, _ in c["sentences"]]
        assert c["rows"] == 3 * sum(steps)
        assert all(s >= n for s, n in c["sentences"])  # no output longer than its steps
        assert 0 <= c["shared_parent"] <= c["reorder_rows"]
        assert 0 <= c["new_parent"] <= c["reorder_rows"]
        counted[rule] = sum(steps)
    assert counted["exact"] >= counted["current"]  # the exact bound never stops sooner
