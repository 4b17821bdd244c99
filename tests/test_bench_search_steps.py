"""benchmarks/search_steps.py counts a search without changing it: the counted pass translates
as a plain one does, its counts agree with each other (every live sentence holds `beam` rows at
each step, the first of them with one prefix), and the rules differ as the stopping bound says
they must."""

from __future__ import annotations

import sys
from pathlib import Path

from aiayn.data.model_dir import load_model
from aiayn.decoding import beam
from aiayn.decoding.beam import BeamSearch
from aiayn.decoding.common import source_batch
from aiayn.decoding.translate import Translator
from aiayn.model import cache

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import search_steps  # noqa: E402

from helpers import TABLES, A, B, TableModel  # noqa: E402

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
        # a sentence's first step: one prefix in its k rows, k - 1 of them empty
        assert c["dead"] == 2 * len(steps)
        assert 0 <= c["hopeless"] <= c["rows"] - c["dead"]
        if rule == "current":
            assert c["hopeless"] == 0  # counted under the exact rule only
        counted[rule] = sum(steps)
    assert counted["exact"] >= counted["current"]  # the exact bound never stops sooner


def test_no_hopeless_row_begins_an_answer(model_dir):
    """The rows counted hopeless under the exact rule are the ones a beam-by-beam bound could
    drop: none of their hypotheses begins a returned one (the n-best list included)."""
    loaded = load_model(model_dir)
    lines = LINES + ["a dog and a cat run in the park", "the men play", "a car", "two dogs"]
    for nbest, alpha in ((1, 0.0), (2, 0.0), (1, 1.0)):
        tr = Translator(loaded, early_stop="exact", beam_size=4, alpha=alpha)
        c = search_steps.count(tr, lines, nbest=nbest, keep_hopeless=True)
        assert c["hopeless"] == len(c["hopeless_prefixes"])
        assert c["answers"] == tr.search(tr.prepare(lines), nbest)  # counting changed nothing
        for i, prefix in c["hopeless_prefixes"]:
            for hyp in c["answers"][i]:
                assert tuple(hyp.tokens[: len(prefix)]) != prefix
        if (nbest, alpha) == (1, 0.0):
            # this random micro model rarely ends a hypothesis early: with alpha 0 (the bound is
            # the raw score itself) some rows are hopeless, so the check has rows to bite on
            assert c["hopeless"] > 0


def test_hopeless_rows_on_the_table_model():
    """The hand-built model's worked cases (tests/test_decoding_search.py): the live [C, A]
    after step 2 of key 11 is no worse than the finished [C] under the exact bound, and it wins
    at |Y| = 22, so no row is hopeless there (a bound by the current length would have marked
    it); key 10 with alpha 0 and two answers has one hopeless row, beginning neither answer."""
    for key, nbest, alpha, n_hopeless in ((11, 1, 1.0, 0), (10, 2, 0.0, 1)):
        search = BeamSearch(TableModel(TABLES), 2, alpha, 0.0, 30, nbest, "exact")
        search.add(*source_batch([[key]]), [key])
        marked, answer = [], None
        while search.sentences:
            dead, hopeless = search_steps._idle_rows(search)
            assert not (dead & hopeless).any()
            marked += [tuple(search.hist_tok[i, j, : int(search.t[i])].tolist())
                       for i, j in hopeless.nonzero().tolist()]
            for _, answer in search.step():
                pass
        assert len(marked) == n_hopeless
        assert len(answer) == nbest
        for prefix in marked:
            assert all(tuple(h.tokens[: len(prefix)]) != prefix for h in answer)
        if key == 10:  # alpha 0 ranks by raw score: [A] (.3) before [B, B, B] (.25)
            assert [h.tokens for h in answer] == [[A], [B, B, B]]
