"""`POST /translate` with a `glossary`: its target terms in the translations, the same answers as
`Translator` with the glossary (alone, concurrent, streamed), a text without a term answered
exactly as without a glossary, constrained and plain requests never in one engine, the batcher
handing each sentence its phrases, and every malformed glossary or format a one-line 4xx."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from aiayn.data.model_dir import load_model
from aiayn.decoding.glossary import Glossary
from aiayn.decoding.translate import Translator
from aiayn.serving.app import create_app
from aiayn.serving.batcher import Batcher
from aiayn.serving.model import ServedModel
from aiayn.serving.schema import MAX_GLOSSARY_ENTRIES, MAX_TERM_CHARS
from aiayn.serving.settings import ServeSettings

from helpers import GatedModel, wait_until

LINES = ["the cat sat on the mat", "a dog runs in the park", "the mat", "", "die katze",
         "the cat and the dog"]
GLOSSARY = [["cat", "garten"], ["dog", "kinder"]]


def has_term(line: str) -> bool:
    return any(src in line.split() for src, _ in GLOSSARY)


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(model_dir)


def translator(loaded, **options) -> Translator:
    return Translator(loaded, precision="fp32", batch_tokens=4000, **options)


@pytest.fixture(scope="module")
def client(loaded):
    with TestClient(create_app(ServedModel(translator(loaded)), ServeSettings(), None)) as c:
        yield c


def test_each_term_is_in_its_translation_as_translate_gives_it(client, loaded):
    """A list of pairs and an object give the same answer: `Translator`'s with the glossary
    (the `aiayn translate --glossary` path), each source term's target term in its text's
    translation, where the plain search would not put every one."""
    tr = translator(loaded)
    want = tr.hypotheses(LINES, glossary=Glossary.of(GLOSSARY))
    plain = tr.translate(LINES)
    for glossary in (GLOSSARY, dict(GLOSSARY)):
        r = client.post("/translate", json={"q": LINES, "glossary": glossary})
        assert r.status_code == 200
        body = r.json()
        assert body["translatedText"] == [tr.detokenize(h[0].tokens) for h in want]
        for item, hyps in zip(body["translations"], want):
            assert item["score"] == pytest.approx(float(hyps[0].score), abs=1e-5)
    forced = 0
    for line, tgt, free in zip(LINES, body["translatedText"], plain):
        for src, term in GLOSSARY:
            if src in line.split():
                assert term in tgt, (line, tgt)
                forced += term not in free
    assert forced, "some term is in a translation only because of the glossary"


def test_a_text_without_a_term_is_translated_as_without_a_glossary(client):
    """In a request with terms elsewhere, a text without one gets the plain answer bit for bit
    (n-best and scores included); a request with no term anywhere, or an empty glossary, gets
    the plain response whole."""
    body = {"q": LINES, "beam_size": 3, "nbest": 2, "scores": True}
    plain = client.post("/translate", json=body).json()
    mixed = client.post("/translate", json={**body, "glossary": GLOSSARY}).json()
    assert [has_term(line) for line in LINES] == [True, True, False, False, False, True]
    for line, a, b in zip(LINES, plain["translations"], mixed["translations"]):
        if not has_term(line):
            assert a == b
    free = [line for line in LINES if not has_term(line)]
    want = client.post("/translate", json={"q": free}).json()
    for glossary in (GLOSSARY, [], {}):
        assert client.post("/translate", json={"q": free, "glossary": glossary}).json() == want


class RecordingModel(GatedModel):
    """A gated served model that records each engine it makes: (its key, lexical or not)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.engines: list = []

    def search_engine(self, key):
        engine = super().search_engine(key)
        self.engines.append((key, engine.lexical))
        return engine


def test_constrained_and_plain_requests_never_share_an_engine(loaded):
    """Hold the worker while a plain and a glossary request of the same search settings wait,
    release: each gets its own engine (a lexical one for the glossary's), and both answers are
    the ones each gets alone."""
    served = RecordingModel(translator(loaded))
    tr = translator(loaded)
    with TestClient(create_app(served, ServeSettings(max_wait_ms=0), None)) as client, \
            ThreadPoolExecutor(3) as pool:
        served.gate.clear()
        first = pool.submit(client.post, "/translate", json={"q": "die katze"})
        assert served.entered.wait(30)
        plain = pool.submit(client.post, "/translate", json={"q": LINES})
        glossed = pool.submit(client.post, "/translate", json={"q": LINES, "glossary": GLOSSARY})
        wait_until(lambda: client.app.state.batcher.pending == 2 * len(LINES),
                   what="both requests to queue")
        served.gate.set()
        assert first.result(60).status_code == 200
        assert plain.result(60).json()["translatedText"] == tr.translate(LINES)
        assert glossed.result(60).json()["translatedText"] == tr.translate(
            LINES, glossary=Glossary.of(GLOSSARY))
    keys = {key: lexical for key, lexical in served.engines}
    assert len(served.engines) == len(keys) == 2
    assert sorted((key.glossary, lexical) for key, lexical in keys.items()) == [
        (False, False), (True, True)]


def events_of(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.split("\n"))
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def test_a_streamed_glossary_request_ends_with_the_plain_response(client, loaded):
    """With a glossary, `"stream": true` still sends settled prefixes of the final translation,
    and its `done` is the non-streamed response with the same glossary."""
    tr = translator(loaded, beam_size=4)
    best = [h[0].tokens if h else [] for h in tr.hypotheses(LINES, glossary=Glossary.of(GLOSSARY))]
    body = {"q": LINES, "beam_size": 4, "glossary": GLOSSARY}
    want = client.post("/translate", json=body).json()
    r = client.post("/translate", json={**body, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = events_of(r.text)
    assert events[-1] == ("done", want)
    assert {name for name, _ in events[:-1]} == {"prefix"}  # some prefix was streamed
    for _, data in events[:-1]:
        assert data["text"] == tr.detokenize(best[data["index"]][: data["pieces"]])


class PhraseEngine:
    """Records what the batcher submits; each sentence finishes at the first step."""

    def __init__(self, key):
        self.submitted: list[tuple] = []
        self.waiting: list = []

    def submit(self, key, ids, *phrases):
        self.submitted.append((list(ids), *phrases))
        self.waiting.append(key)

    @property
    def busy(self):
        return bool(self.waiting)

    def joinable(self, groups):
        return len(groups)

    def step(self):
        done, self.waiting = [(key, ["ok"]) for key in self.waiting], []
        return done


def test_the_batcher_hands_each_sentence_its_phrases():
    engines = {}

    def engine(key):
        engines[key] = PhraseEngine(key)
        return engines[key]

    batcher = Batcher(engine, max_wait=0)
    batcher.start()
    try:
        with pytest.raises(ValueError, match="2 lists of phrases for 1 sentences"):
            batcher.submit("g", [[5]], phrases=[[], []])
        glossed = batcher.submit("g", [[5, 6], [7]], phrases=[[[9, 10]], []])
        plain = batcher.submit("p", [[8]])
        assert glossed.future.result(30) == [["ok"], ["ok"]]
        assert plain.future.result(30) == [["ok"]]
    finally:
        batcher.stop()
    assert engines["g"].submitted == [([5, 6], [[9, 10]]), ([7], [])]
    assert engines["p"].submitted == [([8],)]  # a job without phrases: submit(key, ids)


def test_terms_that_cannot_fit_name_their_text(client):
    """The micro model's translations hold at most a few pieces: a long target term is refused
    with a 400 naming the text, before anything is searched."""
    long_term = " ".join(["garten"] * 12)
    r = client.post("/translate", json={"q": ["the mat", "the cat"], "glossary": {"cat": long_term}})
    assert r.status_code == 400 and list(r.json()) == ["error"]
    assert r.json()["error"].startswith("q[1]: its glossary terms take ")
    assert "\n" not in r.json()["error"]


TOO_MANY = [[f"w{i}", "x"] for i in range(MAX_GLOSSARY_ENTRIES + 1)]


@pytest.mark.parametrize("fields, status, words", [
    ({"glossary": "cat"}, 400, "glossary: must be a list of [source term, target term] pairs"),
    ({"glossary": 3}, 400, "glossary: must be a list"),
    ({"glossary": ["cat", "garten"]}, 400, "glossary: item 0 is not a [source term, target term] pair"),
    ({"glossary": [["cat"]]}, 400, "glossary: item 0 is not a [source term, target term] pair"),
    ({"glossary": [["a", "b"], ["cat", "garten", "x"]]}, 400, "glossary: item 1 is not a"),
    ({"glossary": [{"cat": "garten"}]}, 400, "glossary: item 0 is not a"),
    ({"glossary": [["cat", 3]]}, 400, "glossary: item 0: the target term is int, not a string"),
    ({"glossary": [[None, "x"]]}, 400, "glossary: item 0: the source term is NoneType"),
    ({"glossary": {"cat": None}}, 400, "glossary: entry 'cat': the target term is NoneType"),
    ({"glossary": {"cat": ["garten"]}}, 400, "glossary: entry 'cat': the target term is list"),
    ({"glossary": [["", "garten"]]}, 400, "glossary: item 0: the source term is empty"),
    ({"glossary": {"cat": "  "}}, 400, "glossary: entry 'cat': the target term is empty"),
    ({"glossary": [["cat", "gar\nten"]]}, 400, "glossary: item 0: the target term holds a line break"),
    ({"glossary": [["cat", "a"], [" cat ", "b"]]}, 400,
     "glossary: item 1 repeats the source term 'cat' of item 0"),
    ({"glossary": TOO_MANY}, 413,
     f"glossary: {MAX_GLOSSARY_ENTRIES + 1} entries; this server takes at most {MAX_GLOSSARY_ENTRIES}"),
    ({"glossary": {"cat": "x" * (MAX_TERM_CHARS + 1)}}, 413,
     f"has {MAX_TERM_CHARS + 1} characters; this server takes at most {MAX_TERM_CHARS} a term"),
    ({"format": "doc"}, 400, "format: must be 'text' or 'document', got 'doc'"),
    ({"format": "Document"}, 400, "format: must be 'text' or 'document'"),
    ({"format": 1}, 400, "format: must be 'text' or 'document', got int"),
    ({"format": None}, 400, "format: must be 'text' or 'document', got NoneType"),
    ({"format": "document", "nbest": 2}, 400, "nbest: not with format 'document'"),
    ({"format": "document", "alignment": True}, 400, "alignment: not with format 'document'"),
    ({"format": "document", "stream": True}, 400, "stream: not with format 'document'"),
    ({"q": "two\nlines"}, 400, "q[0]: a line break; send one line per text"),
    ({"q": "two\nlines", "format": "text"}, 400, "\"format\": \"document\" for paragraphs"),
])
def test_a_bad_glossary_or_format_is_a_one_line_4xx(client, fields, status, words):
    r = client.post("/translate", json={"q": "the cat", "beam_size": 2, **fields})
    assert r.status_code == status and list(r.json()) == ["error"], r.text
    message = r.json()["error"]
    assert words in message and "\n" not in message, message


def test_a_lone_surrogate_in_a_term_is_a_one_line_400(client):
    for glossary in ('[["cat", "\\ud800"]]', '{"\\udfff x": "garten"}'):
        r = client.post("/translate", content=f'{{"q": "the cat", "glossary": {glossary}}}'.encode())
        assert r.status_code == 400 and list(r.json()) == ["error"]
        assert "term is not valid Unicode (a lone surrogate" in r.json()["error"]
