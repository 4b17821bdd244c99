"""Confidence of every output: the sentence log-probability, the length-normalised score the beam
ranked by and the per-piece probabilities the search computed (`aiayn.decoding.translate.confidence`),
checked against a teacher-forced forward pass; `aiayn translate --format jsonl` and `/translate`'s
`"scores": true` carry them, and leave today's outputs unchanged when not asked."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator, confidence
from aiayn.serving.app import create_app
from aiayn.serving.model import ServedModel
from aiayn.serving.settings import ServeSettings

LINES = ["the cat sat on the mat", "", "a dog runs in the park", "die katze",
         "ein hund läuft im park", "the children play in the garden", "   ", "a dog"]
BOS, EOS = 2, 3


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(model_dir)


def teacher_forced(model, src: list[int], tokens: list[int], complete: bool) -> np.ndarray:
    """The reference: the full model run once on [BOS] + tokens, log-softmax in float64, the
    log-probability of each output piece (and EOS when complete) gathered from it."""
    src_t = torch.tensor([src + [EOS]])
    tgt_in = torch.tensor([[BOS] + tokens])
    with torch.no_grad():
        logits = model(src_t, tgt_in)[0].double()  # (T, V)
    logp = torch.log_softmax(logits, dim=-1)
    targets = tokens + [EOS] if complete else tokens
    steps = len(targets)
    return logp[torch.arange(steps), torch.tensor(targets)].numpy()


def test_token_logprobs_are_the_models_and_the_scores_follow(loaded):
    alpha = 0.6
    tr = Translator(loaded, precision="fp32", beam_size=3, alpha=alpha)
    sources = tr.prepare(LINES)
    found = tr.search(sources, nbest=3)
    checked = 0
    for src, hyps in zip(sources, found):
        for h in hyps:
            c = confidence(h)
            if not src:  # a blank line: nothing searched
                assert c == {"score": 0.0, "logprob": 0.0, "token_probs": []}
                continue
            tlp = np.asarray(h.token_logprobs, dtype=np.float64)
            assert len(tlp) == len(h.tokens) + int(h.complete)
            ref = teacher_forced(loaded.model, src, h.tokens, h.complete)
            np.testing.assert_allclose(tlp, ref, atol=2e-5)
            # the sentence log-probability is their sum; the score divides by the GNMT penalty
            assert c["logprob"] == pytest.approx(float(tlp.sum()), abs=1e-4)
            assert c["score"] == pytest.approx(c["logprob"] / ((5 + len(tlp)) / 6) ** alpha,
                                               rel=1e-6)
            np.testing.assert_allclose(c["token_probs"], np.exp(ref), rtol=1e-4, atol=1e-7)
            checked += 1
    assert checked >= 10


def test_greedy_score_is_the_logprob(loaded):
    tr = Translator(loaded, precision="fp32", greedy=True)
    sources = tr.prepare(LINES[:1])
    (h,), = tr.search(sources)
    ref = teacher_forced(loaded.model, sources[0], h.tokens, h.complete)
    assert h.score == h.logprob == pytest.approx(float(ref.sum()), abs=1e-4)


def test_a_sentences_confidence_does_not_depend_on_its_neighbours(loaded):
    tr = Translator(loaded, precision="fp32", beam_size=4)
    together = [[confidence(h) for h in hyps] for hyps in tr.search(tr.prepare(LINES), nbest=2)]
    alone = [[confidence(h) for h in tr.search(tr.prepare([line]), nbest=2)[0]] for line in LINES]
    assert together == alone


def _cli(model_dir, tmp_path, name: str, *extra: str) -> str:
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / name
    assert cli_main(["translate", "--precision", "fp32", "--model", str(model_dir), "--input",
                     str(src), "--output", str(out), "--beam", "3", *extra]) == 0
    return out.read_text(encoding="utf-8")


def test_translate_format_jsonl(model_dir, loaded, tmp_path):
    text = _cli(model_dir, tmp_path, "default.txt")
    assert _cli(model_dir, tmp_path, "text.txt", "--format", "text") == text  # the default
    tr = Translator(loaded, precision="fp32", beam_size=3)
    assert text.split("\n")[:-1] == tr.translate(LINES)  # unchanged without the option

    rows = [json.loads(line) for line in _cli(model_dir, tmp_path, "a.jsonl", "--format",
                                              "jsonl").splitlines()]
    assert [r["index"] for r in rows] == list(range(len(LINES)))
    assert [r["src"] for r in rows] == LINES
    assert [r["tgt"] for r in rows] == tr.translate(LINES)
    found = tr.search(tr.prepare(LINES), nbest=1)
    for r, hyps in zip(rows, found):
        assert set(r) == {"index", "src", "tgt", "score", "logprob", "token_probs"}
        assert {k: r[k] for k in ("score", "logprob", "token_probs")} == confidence(hyps[0])

    # n-best: the list, best first, each with its own confidence; the text format's scores
    nbest = [json.loads(line) for line in _cli(model_dir, tmp_path, "n.jsonl", "--format",
                                               "jsonl", "--nbest", "3").splitlines()]
    rows_text = _cli(model_dir, tmp_path, "n.txt", "--nbest", "3").splitlines()
    assert sum(len(r["nbest"]) for r in nbest) == len(rows_text)
    for r, hyps in zip(nbest, tr.search(tr.prepare(LINES), nbest=3)):
        assert r["nbest"] == [{"tgt": tr.detokenize(h.tokens), **confidence(h)} for h in hyps]
        assert r["tgt"] == r["nbest"][0]["tgt"] and r["score"] == r["nbest"][0]["score"]
        assert [e["score"] for e in r["nbest"]] == sorted((e["score"] for e in r["nbest"]),
                                                          reverse=True)
    for row in rows_text:
        index, score, tgt = row.split("\t")
        assert any(e["tgt"] == tgt and f"{e['score']:.6f}" == score
                   for e in nbest[int(index)]["nbest"])

    # alignment: the line --alignment prints after |||, beside the confidence
    hard = _cli(model_dir, tmp_path, "h.txt", "--alignment", "hard").splitlines()
    aligned = [json.loads(line) for line in _cli(model_dir, tmp_path, "h.jsonl", "--format",
                                                 "jsonl", "--alignment", "hard").splitlines()]
    for line, r in zip(hard, aligned):
        tgt, pairs = line.split(" ||| ")
        assert r["tgt"] == tgt and r["alignment"] == pairs
        assert set(r) == {"index", "src", "tgt", "score", "logprob", "token_probs", "alignment"}
    assert [r["logprob"] for r in aligned] == [r["logprob"] for r in rows]


def test_translate_format_is_checked(model_dir, capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["translate", "--model", str(model_dir), "--format", "xml"])
    assert e.value.code == 2 and "--format" in capsys.readouterr().err


def test_translate_endpoint_scores_on_request(loaded):
    tr = Translator(loaded, batch_tokens=4000)
    client = TestClient(create_app(ServedModel(tr), ServeSettings()))
    want = tr.search(tr.prepare(LINES), nbest=2)
    with client:
        plain = client.post("/translate", json={"q": LINES, "nbest": 2}).json()
        scored = client.post("/translate", json={"q": LINES, "nbest": 2, "scores": True}).json()
        bad = client.post("/translate", json={"q": "a dog", "scores": "yes"})
    assert bad.status_code == 400 and list(bad.json()) == ["error"]
    assert bad.json()["error"].startswith("scores:")
    assert scored["translatedText"] == plain["translatedText"]
    for p, s, hyps in zip(plain["translations"], scored["translations"], want):
        # without the field: the keys of before, nothing more
        assert set(p) == {"src", "tgt", "score", "nbest"}
        assert all(set(e) == {"tgt", "score"} for e in p["nbest"])
        # with it: the same answer, each hypothesis with its confidence
        assert {k: s[k] for k in p} == {**p, "nbest": s["nbest"]}
        assert [{k: e[k] for k in ("tgt", "score")} for e in s["nbest"]] == p["nbest"]
        for e, h in zip(s["nbest"], hyps):
            c = confidence(h)
            assert e["logprob"] == c["logprob"] and e["token_probs"] == c["token_probs"]
            assert e["score"] == round(c["score"], 6)
        assert s["logprob"] == s["nbest"][0]["logprob"]
        assert s["token_probs"] == s["nbest"][0]["token_probs"]
        assert math.isclose(math.fsum(math.log(q) for q in s["token_probs"]), s["logprob"],
                            abs_tol=1e-4)
