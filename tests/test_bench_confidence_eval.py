"""benchmarks/confidence_eval.py on a briefly trained reverser: its signals are the search's own
(`confidence`), its chrF sacrebleu's, its correlations those of an independent computation (ties
ranked by their mean rank), and its threshold table what its rows give."""

from __future__ import annotations

import json
import math

import pytest
import sacrebleu

from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator, confidence

from helpers import REPO, TEXTS, reverser_model_dir, run_script

SCRIPT = REPO / "benchmarks" / "confidence_eval.py"


def mean_ranks(x: list[float]) -> list[float]:
    """1-based ranks, each tie the mean of the ranks it spans (written out, no numpy)."""
    return [sum(1 for v in x if v < a) + (sum(1 for v in x if v == a) + 1) / 2 for a in x]


def pearson(x: list[float], y: list[float]) -> float | None:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


@pytest.mark.slow
def test_signals_correlations_and_thresholds(tmp_path):
    model = reverser_model_dir(tmp_path / "rev")
    # a line twice: ties in every signal and in chrF, ranked by their mean rank
    srcs = TEXTS + ["", "the cat runs in the garden", "a dog", TEXTS[1], "die katze im park"]
    refs = [" ".join(s.split()[::-1]) for s in srcs]
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in srcs), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    done = run_script(SCRIPT, "--model", str(model), "--src", str(tmp_path / "src.txt"),
                      "--ref", str(tmp_path / "ref.txt"), "--precision", "fp32", "--out",
                      str(out), "--plot", str(png))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| score |" in done.stdout and "| top 50% |" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = json.loads(out.read_text(encoding="utf-8"))
    assert {"commit", "clean", "machine"} <= set(r) and r["machine"]

    rows = r["rows"]
    assert r["sentences"] == len(rows) == len(srcs) - 1  # the blank line is left out
    assert [x["line"] for x in rows] == [i + 1 for i, s in enumerate(srcs) if s]
    tr = Translator(load_model(model), precision="fp32")
    found = tr.search(tr.prepare(srcs))
    for x in rows:
        hyp = found[x["line"] - 1][0]
        c = confidence(hyp)
        assert x["hyp"] == tr.detokenize(hyp.tokens)
        assert x["score"] == pytest.approx(c["score"], abs=1e-5)
        assert x["logprob"] == pytest.approx(c["logprob"], abs=1e-5)
        assert x["mean_token_prob"] == pytest.approx(sum(c["token_probs"]) / len(c["token_probs"]))
        assert x["min_token_prob"] == pytest.approx(min(c["token_probs"]))
        assert 0 < x["min_token_prob"] <= x["mean_token_prob"] <= 1
        assert x["chrf"] == pytest.approx(
            sacrebleu.sentence_chrf(x["hyp"], [refs[x["line"] - 1]]).score)
    assert r["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")

    chrf = [x["chrf"] for x in rows]
    for signal in ("score", "logprob", "mean_token_prob", "min_token_prob"):
        values = [x[signal] for x in rows]
        got = r["correlation_with_chrf"][signal]
        for name, want in (("pearson", pearson(values, chrf)),
                           ("spearman", pearson(mean_ranks(values), mean_ranks(chrf)))):
            if want is None:
                assert got[name] is None
            else:
                assert -1 <= got[name] <= 1 and got[name] == pytest.approx(want, abs=1e-9)

    ranked = sorted(rows, key=lambda x: -x["score"])
    assert [t["keep_pct"] for t in r["thresholds"]] == [100, 90, 80, 70, 50]
    for t in r["thresholds"]:
        n = t["kept"]
        assert n + t["dropped"] == len(rows) and n == max(1, round(len(rows) * t["keep_pct"] / 100))
        kept, dropped = ranked[:n], ranked[n:]
        assert t["kept_mean_chrf"] == pytest.approx(sum(x["chrf"] for x in kept) / n, abs=0.006)
        assert t["kept_bleu"] == pytest.approx(sacrebleu.corpus_bleu(
            [x["hyp"] for x in kept], [[refs[x["line"] - 1] for x in kept]]).score, abs=0.006)
        if dropped:
            assert t["dropped_mean_chrf"] == pytest.approx(
                sum(x["chrf"] for x in dropped) / len(dropped), abs=0.006)
        else:
            assert t["dropped_mean_chrf"] is None and t["dropped_bleu"] is None
    assert r["thresholds"][0]["dropped"] == 0
