"""The HTTP API in-process (FastAPI's ASGI test client) on a tiny saved model: the same translations
as `Translator` (alone and batched), the response shapes, one-line 4xx errors, the bounded queue,
the timeout, the API key and the Prometheus metrics."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator
from aiayn.serving.app import create_app, key_matches
from aiayn.serving.model import ServedModel
from aiayn.serving.settings import ServeSettings

from helpers import GatedModel, needs_int8, wait_until

LINES = ["the cat sat on the mat", "", "a dog runs in the park", "die katze", "ein hund läuft im park",
         "the children play in the garden", "the mat", "a dog"]


@pytest.fixture(scope="module")
def loaded(model_dir):
    loaded = load_model(model_dir)
    loaded.meta = {"src_lang": "en", "tgt_lang": "de", "step": 7}
    return loaded


@pytest.fixture(scope="module")
def alone(loaded):
    """Each line translated by itself with aiayn translate's Translator."""
    return [Translator(loaded).translate([line])[0] for line in LINES]


def client_for(loaded, served_cls=ServedModel, api_key=None, **settings
               ) -> tuple[TestClient, ServedModel]:
    served = served_cls(Translator(loaded, batch_tokens=settings.get("batch_tokens", 4000)))
    return TestClient(create_app(served, ServeSettings(**settings), api_key)), served


def metrics_of(client, headers=None) -> dict[str, float]:
    """Every sample of /metrics as {'name{label=value,...}': value}."""
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_health_info_and_page(loaded):
    client, _ = client_for(loaded)
    with client:
        assert client.get("/health").json() == {"status": "ok", "queue_sentences": 0}
        info = client.get("/info").json()
        assert (info["source_language"], info["target_language"], info["step"]) == ("en", "de", 7)
        assert info["parameters"] == sum(p.numel() for p in loaded.model.parameters())
        assert info["decoding"]["beam_size"] == loaded.cfg.beam_size
        assert info["alignment"] is True and info["api_key_required"] is False
        page = client.get("/")
        assert page.status_code == 200 and "<textarea" in page.text
        assert "connect-src 'self'" in page.headers["content-security-policy"]
        # Self-contained: no address of another host anywhere in the page.
        assert "http://" not in page.text and "https://" not in page.text and "//cdn" not in page.text


@pytest.mark.parametrize("precision", ["bf16", pytest.param("int8", marks=needs_int8)])
def test_precision_and_early_stop_apply_to_every_request(model_dir, precision):
    """The server's --precision and --early-stop: the translations of a Translator with the same
    settings, for the default search and for a request's own beam size."""
    loaded = load_model(model_dir)  # converted in place: not the module's shared model
    served = ServedModel(Translator(loaded, precision=precision, early_stop="current"))
    ref = Translator(load_model(model_dir), precision=precision, early_stop="current")
    ref_beam2 = Translator(load_model(model_dir), precision=precision, early_stop="current",
                           beam_size=2)
    with TestClient(create_app(served, ServeSettings(), None)) as client:
        info = client.get("/info").json()["decoding"]
        assert (info["precision"], info["early_stop"]) == (precision, "current")
        got = client.post("/translate", json={"q": LINES}).json()["translatedText"]
        assert got == ref.translate(LINES)
        got2 = client.post("/translate", json={"q": LINES, "beam_size": 2}).json()["translatedText"]
        assert got2 == ref_beam2.translate(LINES)
    assert served.translator(2, 0.6).precision == precision


def test_translations_are_those_of_translator(loaded, alone):
    client, _ = client_for(loaded)
    with client:
        r = client.post("/translate", json={"q": LINES[0]})
        assert r.status_code == 200
        body = r.json()
        assert body["translatedText"] == alone[0]  # a string in, a string out
        (item,) = body["translations"]
        assert item["src"] == LINES[0] and item["tgt"] == alone[0] and len(item["nbest"]) == 1
        r = client.post("/translate", json={"q": LINES})
        assert r.json()["translatedText"] == alone  # a list in, a list out, blank lines kept
        # n-best and search settings: the same as Translator with the same settings.
        tr = Translator(loaded, beam_size=3, alpha=0.0)
        want = tr.translate_nbest(LINES, 3)
        got = client.post("/translate", json={"q": LINES, "beam_size": 3, "alpha": 0, "nbest": 3}).json()
        for item, entries in zip(got["translations"], want):
            assert [h["tgt"] for h in item["nbest"]] == [text for _, text in entries]
            assert [h["score"] for h in item["nbest"]] == pytest.approx([s for s, _ in entries], abs=1e-5)
            assert item["tgt"] == entries[0][1] and item["score"] == item["nbest"][0]["score"]


def test_concurrent_requests_share_one_search_and_keep_their_own_results(loaded, alone):
    """Hold the worker in the first request's first decoding step, send the rest concurrently,
    release: they all join the running search at its next step, and every answer equals the
    sentence translated alone."""
    client, served = client_for(loaded, GatedModel, max_wait_ms=0)
    with client, ThreadPoolExecutor(len(LINES)) as pool:
        served.gate.clear()
        first = pool.submit(client.post, "/translate", json={"q": LINES[0]})
        assert served.entered.wait(30)
        rest = [pool.submit(client.post, "/translate", json={"q": [line]}) for line in LINES[1:]]
        batcher = client.app.state.batcher
        wait_until(lambda: batcher.pending == len(LINES) - 1, what="the requests to queue")
        served.gate.set()
        answers = [first.result(60).json()["translatedText"]]
        answers += [f.result(60).json()["translatedText"][0] for f in rest]
        assert answers == alone
        m = metrics_of(client)
        steps = m["aiayn_batch_requests_count{}"]
        assert m["aiayn_batch_requests_bucket{le=1.0}"] >= 1  # the first request's step alone
        assert m["aiayn_batch_requests_bucket{le=4.0}"] < steps  # ... then steps of all 8
        assert m["aiayn_sentences_translated_total{}"] == len(LINES)


ERRORS = [  # (body, extra headers, status, words in the error)
    (b'{"q": "a cat"', {}, 400, "malformed JSON"),
    (b'{"q": "\xffcat"}', {}, 400, "not valid UTF-8"),
    (b"", {}, 400, "empty request body"),
    (b'"just a string"', {}, 400, "valid dictionary"),
    (b'{"q": 42}', {}, 400, "q: must be a string or a list of strings"),
    (b'{"q": ["a", 1]}', {}, 400, "item 1 is int"),
    (b'{"q": "a", "nbest": "2"}', {}, 400, "nbest: Input should be a valid integer"),
    (b'{"q": ""}', {}, 400, "empty text"),
    (b'{"q": "a", "nbest": 9}', {}, 400, "nbest: must be between 1 and the beam size"),
    (b'{"q": "a", "source": "fr"}', {}, 400, "this model translates en -> de, not 'fr'"),
    (b'{"q": "a", "target": "en"}', {}, 400, "not 'en'"),
    (json.dumps({"q": "x" * 101}).encode(), {}, 413, "101 characters"),
    (json.dumps({"q": ["a"] * 5}).encode(), {}, 413, "5 texts"),
    (b'{"q": "a"}' + b" " * 20_000, {}, 413, "request body of"),
]


def test_alignments_over_http_equal_aiayn_translate_alignment(loaded, model_dir):
    """`"alignment": true` returns, per text, the cross-attention of the last decoder layer
    (heads averaged) behind the best translation and the hard word alignment, the same as
    `Translator.align` (what `aiayn translate --alignment` prints) gives each sentence; an
    ensemble's members attend each their own way: 501."""
    from aiayn.decoding.ensemble import load_models

    texts = [line for line in LINES if line][:4]
    want = Translator(loaded).align(texts)
    client, _ = client_for(loaded)
    with client:
        r = client.post("/translate", json={"q": texts, "alignment": True})
        assert r.status_code == 200, r.text
        items = r.json()["translations"]
        plain = client.post("/translate", json={"q": texts}).json()["translations"]
    for item, a, p in zip(items, want, plain):
        assert item["tgt"] == a.translation == p["tgt"] and "alignment" not in p
        assert item["alignment"] == a.format("hard")
        att = item["attention"]
        assert (att["src_pieces"], att["tgt_pieces"]) == (a.src_pieces, a.tgt_pieces)
        assert np.allclose(np.array(att["weights"]), a.attention, atol=1e-6)
    ensemble = load_models([model_dir, model_dir])
    client, _ = client_for(ensemble)
    with client:
        assert client.get("/info").json()["alignment"] is False
        r = client.post("/translate", json={"q": "a cat", "alignment": True})
        assert r.status_code == 501 and "ensemble" in r.json()["error"]


@pytest.mark.parametrize("body, headers, status, words", ERRORS)
def test_bad_requests_get_a_one_line_json_error(loaded, body, headers, status, words):
    client, _ = client_for(loaded, max_chars=100, max_sentences=4, max_queue=8)
    with client:
        r = client.post("/translate", content=body, headers=headers)
        assert r.status_code == status, r.text
        assert list(r.json()) == ["error"] and words in r.json()["error"], r.text
        assert "\n" not in r.json()["error"]


def test_unknown_paths_and_methods_are_json_too(loaded):
    client, _ = client_for(loaded)
    with client:
        assert client.get("/nope").json() == {"error": "Not Found"}
        r = client.get("/translate")
        assert r.status_code == 405 and r.json() == {"error": "Method Not Allowed"}
        ok = client.post("/translate", json={"q": "a dog", "source": "auto", "target": "de"})
        assert ok.status_code == 200


def test_a_full_queue_answers_503_with_retry_after(loaded):
    client, served = client_for(loaded, GatedModel, max_sentences=2, max_queue=2, max_wait_ms=0)
    with client, ThreadPoolExecutor(2) as pool:
        served.gate.clear()
        running = pool.submit(client.post, "/translate", json={"q": "a dog"})
        assert served.entered.wait(30)
        waiting = pool.submit(client.post, "/translate", json={"q": ["the cat", "the mat"]})
        wait_until(lambda: client.app.state.batcher.pending == 2, what="the queue to fill")
        r = client.post("/translate", json={"q": "die katze"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "busy" in r.json()["error"]
        served.gate.set()
        assert running.result(60).status_code == 200 and waiting.result(60).status_code == 200
        assert client.post("/translate", json={"q": "die katze"}).status_code == 200
        m = metrics_of(client)
        assert m["aiayn_http_errors_total{reason=unavailable}"] == 1
        assert m["aiayn_http_requests_total{code=503,path=/translate}"] == 1


def test_the_timeout_answers_504_and_frees_the_place(loaded):
    client, served = client_for(loaded, GatedModel, timeout_s=0.5, max_wait_ms=0)
    batcher = client.app.state.batcher
    with client, ThreadPoolExecutor(2) as pool:
        served.gate.clear()
        running = pool.submit(client.post, "/translate", json={"q": "a dog"})
        assert served.entered.wait(30)
        queued = client.post("/translate", json={"q": ["the cat", "the mat"]})
        assert queued.status_code == 504 and "timeout" in queued.json()["error"]
        assert batcher.pending == 0  # its sentences left the queue
        assert running.result(60).status_code == 504  # still running: its answer is dropped
        served.gate.set()
        assert client.post("/translate", json={"q": "the cat"}).status_code == 200


def test_the_api_key(loaded):
    client, _ = client_for(loaded, api_key="s3cret-key")
    good = [{"X-API-Key": "s3cret-key"}, {"Authorization": "Bearer s3cret-key"}]
    with client:
        for headers in [{}, {"X-API-Key": "s3cret"}, {"Authorization": "Bearer wrong"},
                        {"Authorization": "Basic s3cret-key"}]:
            r = client.post("/translate", json={"q": "a dog"}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert "API key" in r.json()["error"]
            assert client.get("/metrics", headers=headers).status_code == 401
        for headers in good:
            assert client.post("/translate", json={"q": "a dog"}, headers=headers).status_code == 200
        body_key = client.post("/translate", json={"q": "a dog", "api_key": "s3cret-key"})
        assert body_key.status_code == 200  # LibreTranslate's way
        assert client.get("/metrics", headers=good[0]).status_code == 200
        assert client.get("/health").status_code == client.get("/").status_code == 200
        assert client.get("/info").json()["api_key_required"] is True


def test_key_matches():
    assert key_matches("abc", "abc") and not key_matches("abd", "abc")
    assert not key_matches(None, "abc") and not key_matches("", "abc") and key_matches("é", "é")


def test_metrics_count_requests_errors_and_latency(loaded):
    client, _ = client_for(loaded)
    with client:
        for q in ["a dog", ["the cat", "die katze"], "the mat"]:
            assert client.post("/translate", json={"q": q}).status_code == 200
        client.post("/translate", content=b"{")
        client.post("/translate", json={"q": 1})
        client.get("/health")
        m = metrics_of(client)
    assert m["aiayn_http_requests_total{code=200,path=/translate}"] == 3
    assert m["aiayn_http_requests_total{code=400,path=/translate}"] == 2
    assert m["aiayn_http_requests_total{code=200,path=/health}"] == 1
    assert m["aiayn_http_errors_total{reason=bad_request}"] == 2
    assert m["aiayn_translate_latency_seconds_count{}"] == 3
    assert m["aiayn_translate_latency_seconds_bucket{le=+Inf}"] == 3
    assert m["aiayn_sentences_translated_total{}"] == 4
    assert m["aiayn_queue_sentences{}"] == 0
