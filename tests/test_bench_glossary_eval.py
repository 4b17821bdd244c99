"""benchmarks/glossary_eval.py on a briefly trained reverser: the terms it constrains are
reference words the unconstrained translation missed, a sentence that misses none is left out,
and its coverage, sacreBLEU and timing figures are what its own outputs give."""

from __future__ import annotations

import json
import statistics

import pytest
import sacrebleu

from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator

from helpers import REPO, TEXTS, reverser_model_dir, run_script

SCRIPT = REPO / "benchmarks" / "glossary_eval.py"
PUNCT = ".,;:!?\"'()"


def words(text: str) -> list[str]:
    return [w.strip(PUNCT) for w in text.split() if w.strip(PUNCT)]


@pytest.mark.slow
def test_terms_coverage_bleu_and_timing(tmp_path):
    model = reverser_model_dir(tmp_path / "rev")
    srcs = TEXTS[:5] + ["", "the cat runs in the garden"]
    # the model's own translation of line 2 as its reference: nothing to constrain there
    own = Translator(load_model(model), precision="fp32").translate(srcs)
    refs = [" ".join(s.split()[::-1]) + "." for s in srcs]
    refs[1], refs[5] = own[1], ""
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in srcs), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    out = tmp_path / "g.json"
    args = ["--model", str(model), "--src", str(tmp_path / "src.txt"), "--ref",
            str(tmp_path / "ref.txt"), "--terms", "2", "--seed", "3", "--repeats", "2",
            "--precision", "fp32", "--out", str(out)]
    done = run_script(SCRIPT, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| sacreBLEU, whole test set (7) |" in done.stdout
    r = json.loads(out.read_text(encoding="utf-8"))
    assert {"commit", "clean", "machine"} <= set(r) and r["machine"]

    records = r["constrained"]
    lines = [c["line"] - 1 for c in records]
    assert r["sentences"] == len(srcs) and r["sentences_constrained"] == len(records) > 0
    assert 1 not in lines and 5 not in lines  # nothing missed; a blank line
    assert r["terms_constrained"] == sum(len(c["terms"]) for c in records)
    for i in range(len(srcs)):
        missed = [w for w in words(refs[i]) if sum(ch.isalpha() for ch in w) >= 3
                  and w not in words(own[i])]
        if i in lines:
            c = records[lines.index(i)]
            assert c["unconstrained"] == own[i]
            assert 1 <= len(c["terms"]) <= min(2, len(missed))
            assert set(c["terms"]) <= set(missed)
        elif srcs[i]:
            assert not missed

    hits = sum(t in words(c["constrained"]) for c in records for t in c["terms"])
    assert 0 <= r["term_coverage_pct"] <= 100
    assert r["term_coverage_pct"] == pytest.approx(100 * hits / r["terms_constrained"], abs=0.01)
    assert r["term_coverage_unconstrained_pct"] == 0 and r["unconstrained_rerun_differs"] == 0
    assert r["repeats_identical"] is True and r["terms_dropped_for_length"] == 0

    def bleu(hyps, refs_):
        return round(sacrebleu.corpus_bleu(hyps, [refs_]).score, 2)

    set_refs = [refs[i] for i in lines]
    whole = list(own)
    for i, c in zip(lines, records):
        whole[i] = c["constrained"]
    assert r["bleu"] == {
        "constrained_set": {"unconstrained": bleu([own[i] for i in lines], set_refs),
                            "constrained": bleu([c["constrained"] for c in records], set_refs)},
        "whole_test_set": {"unconstrained": bleu(own, refs), "constrained": bleu(whole, refs)}}
    assert r["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")

    for kind in ("unconstrained", "constrained"):
        assert len(r["seconds"][kind]) == 2 and min(r["seconds"][kind]) > 0
        assert r["median_seconds"][kind] == pytest.approx(statistics.median(r["seconds"][kind]),
                                                          abs=1e-4)
    ratio = r["median_seconds"]["constrained"] / r["median_seconds"]["unconstrained"]
    assert r["time_ratio_constrained"] == pytest.approx(ratio, rel=1e-2)

    again = run_script(SCRIPT, *args)
    assert again.returncode != 0 and "exists" in again.stderr  # never overwrites
