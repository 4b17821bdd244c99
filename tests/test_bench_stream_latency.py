"""benchmarks/stream_latency.py against `aiayn serve` on a briefly trained reverser, on loopback: it
picks the sentences nearest the word count, every streamed final equals the plain answer, and its
figures are consistent (first words no later than the final event, p50 no more than p99, every
concurrent request answered)."""

from __future__ import annotations

import json

import pytest

from helpers import REPO, TEXTS, reverser_model_dir, run_script

SCRIPT = REPO / "benchmarks" / "stream_latency.py"


@pytest.mark.slow
@pytest.mark.parametrize("beam", [None, 1])
def test_streamed_equals_plain_and_figures_are_consistent(tmp_path, beam):
    """The model's beam (4), and greedy search, which settles a piece at every step."""
    model = reverser_model_dir(tmp_path / "rev")
    lines = ["a dog", "", TEXTS[0], "the cat runs in the big green garden today", TEXTS[1],
             TEXTS[0], "die kinder spielen im garten", "ein hund", TEXTS[4]]
    (tmp_path / "s.txt").write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    out = tmp_path / "s.json"
    args = ["--model", str(model), "--sentences", str(tmp_path / "s.txt"), "--words", "6",
            "--n", "4", "--clients", "3", "--per-client", "2", "--threads", "1", "--out", str(out)]
    args += [] if beam is None else ["--beam-size", str(beam)]
    done = run_script(SCRIPT, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| streamed, first words |" in done.stdout
    r = json.loads(out.read_text(encoding="utf-8"))
    assert {"commit", "clean", "machine"} <= set(r) and r["machine"]

    # the 4 distinct lines nearest 6 words (6, 6, 6 and 5; the earlier of the 9- and 2-word
    # lines would come next), in file order
    want = [TEXTS[0], TEXTS[1], "die kinder spielen im garten", TEXTS[4]]
    assert [x["sentence"] for x in r["rows"]] == want and r["n"] == 4
    assert r["word_counts"] == [5, 6, 6, 6]

    assert r["streamed_equals_plain"] is True
    assert r["concurrent_differs_from_plain"] == {"streamed": 0, "plain": 0}
    s = r["one_at_a_time"]
    assert s["failed"] == 0 and s["streamed_differs_from_plain"] == 0
    for x in r["rows"]:
        assert x["streamed_text"] == x["plain_text"] is not None
        assert 0 < x["first_words_s"] <= x["streamed_final_s"]
        assert 0 < x["plain_headers_s"] <= x["plain_s"]
        # no prefix with text before the final event: the first words came with it
        assert not x["first_words_came_with_final"] or x["first_words_s"] == x["streamed_final_s"]
    assert [x["plain_first"] for x in r["rows"]] == [True, False, True, False]
    assert r["beam_size"] == beam
    assert 0 <= s["first_words_came_with_final"] <= (4 if beam is None else 3)  # greedy streams
    assert s["median_first_words_s"] <= s["median_streamed_final_s"]
    assert s["median_first_words_over_plain"] > 0

    assert [lv["streamed"] for lv in r["concurrent"]] == [True, False]
    for lv in r["concurrent"]:
        assert lv["requests"] == 6 and lv["failed"] == 0 and lv["clients"] == 3
        assert 0 < lv["p50_s"] <= lv["p99_s"]
    assert r["p99_streamed_over_plain"] > 0
