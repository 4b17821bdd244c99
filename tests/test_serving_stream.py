"""Streaming beam search: the settled prefix the search reports after each step (on a hand-built
model, step by step; on a real one against a reference written here), and `/translate` with
`"stream": true` (server-sent events whose final event is the plain response)."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.data.model_dir import load_model
from aiayn.decoding.engine import SearchEngine
from aiayn.decoding.translate import Translator
from aiayn.serving.app import create_app
from aiayn.serving.model import ServedModel
from aiayn.serving.settings import ServeSettings
from aiayn.special import EOS_ID

from helpers import A, B, C, D, GatedModel, TableModel, reverser_model_dir, search_settings, summary

# Key 20 of a hand-built model. Beam 2, alpha 1, L = 10 (lp(n) = (5 + n) / 6):
# step 1: live [A] .3, [B] .7                                          -> settled []
# step 2: [A] EOS (.3, ranked 2nd of the 2k) finishes, score log(.3)/lp(2) = -1.032; live [B, C]
#         .42 and [B, D] .28 agree on [B], but the finished [A] may still win (the exact bound of
#         [B, C], log(.42)/lp(10) = -0.347, is above it)                  -> settled []
# step 3: [B, C] EOS (.294, ranked 1st) finishes, log(.294)/lp(3) = -0.918 beats [A]; live
#         [B, D, C] .28 and [B, C, A] .126                              -> settled [B]
# step 4: [B, C, A] EOS finishes (-1.381, below [B, C]); live [B, D, C, A] .28 (the other beam
#         has no candidate left); [B, C] still contends                 -> settled [B]
# step 5: [B, D, C, A] EOS (.28) scores log(.28)/lp(5) = -0.764 and wins; no beam is left: done.
# Greedy (beam 1): [B], [B, C], then [B, C] EOS: done.
STREAM_TABLE = {
    (): {A: 0.3, B: 0.7},
    (A,): {EOS_ID: 1.0},
    (B,): {C: 0.6, D: 0.4},
    (B, C): {EOS_ID: 0.7, A: 0.3},
    (B, D): {C: 1.0},
    (B, D, C): {A: 1.0},
    (B, C, A): {EOS_ID: 1.0},
    (B, D, C, A): {EOS_ID: 1.0},
}


def run_engine(settings_kw, watch: bool):
    """The engine over key 20 alone: the settled prefix after each step (when `watch`) and the
    hypotheses."""
    model = TableModel({20: STREAM_TABLE})
    engine = SearchEngine(model, search_settings(model, max_len_a=0.0, max_len_b=10, **settings_kw))
    engine.submit("s", [20])
    seen, found = [], None
    while engine.busy:
        for key, hyps in engine.step():
            found = hyps
        if watch and engine.live:
            (key, prefix), = engine.settled()
            seen.append(prefix)
    return seen, found


@pytest.mark.parametrize("settings_kw, expected, final", [
    (dict(beam_size=2, alpha=1.0), [[], [], [B], [B]], [B, D, C, A]),
    (dict(greedy=True), [[B], [B, C]], [B, C]),
])
def test_settled_prefixes_on_a_hand_built_model(settings_kw, expected, final):
    seen, found = run_engine(settings_kw, watch=True)
    assert seen == expected
    assert found[0].tokens == final
    _, unwatched = run_engine(settings_kw, watch=False)  # reading it changes nothing
    assert summary(found) == summary(unwatched)


def contenders_prefix(search) -> dict:
    """Reference, one sentence at a time in plain Python: the longest common prefix of the live
    beams with a finite score and the best finished hypothesis, if any."""
    out = {}
    for i, key in enumerate(search.keys):
        t = int(search.t[i])
        seqs = [search.hist_tok[i, j, :t].tolist() for j in range(search.k)
                if torch.isfinite(search.raw[i, j])]
        if torch.isfinite(search.pool.score[i, 0]):
            seqs.append(search.pool.tok[i, 0, : int(search.pool.length[i, 0])].tolist())
        n = 0
        while all(len(s) > n and s[n] == seqs[0][n] for s in seqs):
            n += 1
        out[key] = seqs[0][:n]
    return out


LINES = ["the cat sat on the mat", "a dog runs in the park", "die katze", "ein hund läuft im park",
         "the children play in the garden", "the mat", "a dog"]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A briefly trained model (a random one's beams rarely agree on anything)."""
    return load_model(reverser_model_dir(tmp_path_factory.mktemp("reverser")))


@pytest.mark.parametrize("beam", [1, 4])
def test_settled_prefix_on_a_real_model_grows_and_starts_the_final(loaded, beam):
    """Several sentences sharing one search, joining as others leave: after every step each
    sentence's settled prefix is the reference's, never shrinks, and starts its final best
    translation, which is the search's without the hook."""
    tr = Translator(loaded, beam_size=beam, batch_size=3)
    sources = tr.prepare(LINES)
    engine = tr.engine()
    for i, ids in enumerate(sources):
        engine.submit(i, ids)
    history: dict[int, list[list[int]]] = {i: [] for i in range(len(sources))}
    final = {}
    while engine.busy:
        for i, hyps in engine.step():
            final[i] = hyps[0].tokens
        settled = dict(engine.settled())
        assert settled == contenders_prefix(engine.search)
        for i, prefix in settled.items():
            history[i].append(prefix)
    assert [final[i] for i in range(len(sources))] == [h[0].tokens for h in tr.search(sources)]
    grew = 0
    for i, steps in history.items():
        assert steps, "every sentence was decoded"
        for before, after in zip(steps, steps[1:]):
            assert after[: len(before)] == before
        for prefix in steps:
            assert final[i][: len(prefix)] == prefix
        grew += len(steps[-1])
    assert grew > 0  # some prefix was settled before its sentence finished


def events_of(text: str) -> list[tuple[str, dict]]:
    """Server-sent events as (name, JSON data), read the way a client reads them."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((fields["event"], json.loads(fields["data"])))
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_streamed_answer_ends_with_the_plain_response(loaded, beam):
    served = ServedModel(Translator(loaded, batch_tokens=4000))
    best = [h[0].tokens if h else [] for h in
            Translator(loaded, beam_size=beam).search(served.prepare(LINES)[0])]
    with TestClient(create_app(served, ServeSettings(), None)) as client:
        for q in (LINES, LINES[0]):
            body = {"q": q, "beam_size": beam}
            plain = client.post("/translate", json=body)
            r = client.post("/translate", json={**body, "stream": True})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = events_of(r.text)
            assert [name for name, _ in events[:-1]] == ["prefix"] * (len(events) - 1)
            assert events[-1] == ("done", plain.json())
            shown: dict[int, int] = {}
            for _, data in events[:-1]:
                i, n = data["index"], data["pieces"]
                assert n > shown.get(i, 0)  # sent when it grows
                shown[i] = n
                assert data["text"] == served.detokenize(best[i][:n])  # the final's own pieces
            if isinstance(q, list):
                assert shown, "some prefix was streamed"
        if beam > 1:  # n-best streams too: the prefixes are the best translation's
            body = {"q": LINES, "beam_size": beam, "nbest": 2}
            plain = client.post("/translate", json=body).json()
            events = events_of(client.post("/translate", json={**body, "stream": True}).text)
            assert events[-1] == ("done", plain)
            for _, data in events[:-1]:
                assert data["text"] == served.detokenize(best[data["index"]][: data["pieces"]])


def test_a_bad_stream_value_is_a_one_line_400(loaded):
    with TestClient(create_app(ServedModel(Translator(loaded)), ServeSettings(), None)) as client:
        for value in ("yes", 1, None):
            r = client.post("/translate", json={"q": "a dog", "stream": value})
            assert r.status_code == 400 and list(r.json()) == ["error"]
            assert r.json()["error"].startswith("stream: ") and "\n" not in r.json()["error"]


def test_a_stream_that_times_out_ends_with_one_error_event(loaded):
    """The stream has begun (200) when the request timeout passes: its last event is the
    one-line error, and the server goes on answering."""
    served = GatedModel(Translator(loaded))
    with TestClient(create_app(served, ServeSettings(timeout_s=0.5, max_wait_ms=0), None)) as client:
        served.gate.clear()
        r = client.post("/translate", json={"q": "a dog", "stream": True})
        served.gate.set()
        assert r.status_code == 200
        name, data = events_of(r.text)[-1]
        assert name == "error" and list(data) == ["error"] and "timeout" in data["error"]
        assert client.post("/translate", json={"q": "a dog"}).status_code == 200
