"""`POST /translate` with `"format": "document"`: each text a document whose lines are paragraphs;
the line structure comes back as sent, each paragraph's translation is its sentences' translated
alone and joined by spaces (as `aiayn translate --documents`), a sentence too long for the model
is split, not truncated, a glossary applies sentence by sentence, and the sentences go through
the batcher like any request's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from aiayn.data.model_dir import load_model
from aiayn.decoding.documents import translate_paragraphs
from aiayn.decoding.glossary import Glossary
from aiayn.decoding.translate import Translator
from aiayn.serving.app import create_app
from aiayn.serving.documents import split_lines
from aiayn.serving.model import ServedModel
from aiayn.serving.settings import ServeSettings

from helpers import GatedModel, wait_until

# Each line is written from these sentences, so its expected split is known here.
SENTENCES = [["The cat sat on the mat.", "A dog runs in the park!", "Die Katze schläft."],
             [],
             ["The children play in the garden?", "Ein Hund."],
             [],
             [],
             ["a dog"]]
BREAKS = ["\n", "\n", "\r\n", "\n", "\r"]  # a blank line, CRLF, a blank line, a lone CR
LINES = [" ".join(s) for s in SENTENCES]
DOCUMENT = "".join(line + brk for line, brk in zip(LINES, BREAKS + [""]))


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(model_dir)


def translator(loaded, **options) -> Translator:
    return Translator(loaded, precision="fp32", batch_tokens=4000, beam_size=3, **options)


def client_for(served: ServedModel, **settings) -> TestClient:
    return TestClient(create_app(served, ServeSettings(**settings), None))


def test_split_lines_gives_back_the_text():
    for text in (DOCUMENT, "", "one", "\n", "a\r\n\r\nb\r", "a\n\rb"):
        lines, breaks = split_lines(text)
        assert len(breaks) == len(lines) - 1
        assert "".join(x for pair in zip(lines, breaks + [""]) for x in pair) == text
        assert not any("\n" in line or "\r" in line for line in lines)
    assert split_lines("a\r\n\nb") == (["a", "", "b"], ["\r\n", "\n"])


def test_a_document_keeps_its_lines_and_its_sentences_translate_alone(loaded):
    """The answer has the document's line breaks (blank lines, CRLF and CR included) and each
    line is its sentences translated one by one, joined by spaces, as `aiayn translate
    --documents` gives it; each sentence entry is that sentence's own answer, on its line."""
    tr = translator(loaded)
    alone = [[t for t in (tr.translate([s])[0] for s in sentences) if t] for sentences in SENTENCES]
    want = "".join(" ".join(a) + brk for a, brk in zip(alone, BREAKS + [""]))
    assert want.split("\n")[1] == "" and "\r\n" in want  # the structure under test
    assert translate_paragraphs(tr, LINES) == [" ".join(a) for a in alone]
    with client_for(ServedModel(translator(loaded))) as client:
        r = client.post("/translate", json={"q": DOCUMENT, "format": "document", "beam_size": 3})
        assert r.status_code == 200
        body = r.json()
        assert body["translatedText"] == want and "warnings" not in body
        (item,) = body["translations"]
        assert item["src"] == DOCUMENT and item["tgt"] == want
        expected = [(n, s) for n, sentences in enumerate(SENTENCES) for s in sentences]
        assert [(e["line"], e["src"]) for e in item["sentences"]] == expected
        for e in item["sentences"]:
            assert e["tgt"] == tr.translate([e["src"]])[0] and len(e["nbest"]) == 1
        # several documents: a list in, a list out; a blank one comes back as it was
        r = client.post("/translate", json={"q": [DOCUMENT, "\n\n", "a dog"], "format": "document",
                                            "beam_size": 3, "scores": True})
        body = r.json()
        assert body["translatedText"] == [want, "\n\n", " ".join(alone[-1])]
        assert body["translations"][1]["sentences"] == []
        assert all("token_probs" in e for e in body["translations"][0]["sentences"])
        # format "text" is the default and keeps its answer
        plain = client.post("/translate", json={"q": LINES[0], "beam_size": 3}).json()
        assert plain == client.post("/translate", json={"q": LINES[0], "beam_size": 3,
                                                        "format": "text"}).json()


def test_a_sentence_too_long_for_the_model_is_split_not_truncated(loaded):
    """With room for 5 source pieces, a long sentence is cut between words into parts, each
    translated; the line is what `aiayn translate --documents` writes for it, without the
    truncation warning a text would get."""
    tr = translator(loaded, max_src_tokens=6)
    sentence = "the children play in the garden and the cat sat on the mat"
    with client_for(ServedModel(translator(loaded, max_src_tokens=6))) as client:
        as_text = client.post("/translate", json={"q": sentence, "beam_size": 3}).json()
        assert as_text["warnings"]  # a text is truncated
        r = client.post("/translate", json={"q": f"{sentence}\nthe mat", "format": "document",
                                            "beam_size": 3})
        body = r.json()
    assert "warnings" not in body
    parts = [e for e in body["translations"][0]["sentences"] if e["line"] == 0]
    assert len(parts) > 1
    # nothing dropped (a word of more pieces than fit is cut inside)
    assert "".join(p["src"] for p in parts).replace(" ", "") == sentence.replace(" ", "")
    assert body["translatedText"] == "\n".join(translate_paragraphs(tr, [sentence, "the mat"]))


def test_a_glossary_applies_to_each_sentence_of_a_document(loaded):
    glossary = {"cat": "garten", "dog": "kinder"}
    tr = translator(loaded)
    g = Glossary.of(glossary.items())
    with client_for(ServedModel(translator(loaded))) as client:
        body = client.post("/translate", json={"q": DOCUMENT, "format": "document", "beam_size": 3,
                                               "glossary": glossary}).json()
        entries = body["translations"][0]["sentences"]
        for e in entries:
            assert e["tgt"] == tr.translate([e["src"]], glossary=g)[0]
        assert "garten" in entries[0]["tgt"]
        long_term = " ".join(["garten"] * 12)
        r = client.post("/translate", json={"q": "the mat\n\nA cat.", "format": "document",
                                            "glossary": {"cat": long_term}})
        assert r.status_code == 400
        assert r.json()["error"].startswith("q[0] line 3: its glossary terms take ")


def test_too_many_sentences_in_the_documents_is_413(loaded):
    with client_for(ServedModel(translator(loaded)), max_sentences=2, max_queue=3) as client:
        r = client.post("/translate", json={"q": "a dog. the cat. the mat. a dog.",
                                            "format": "document"})
        assert r.status_code == 413 and list(r.json()) == ["error"]
        assert r.json()["error"] == ("q: 4 sentences in the documents; this server takes at most "
                                     "3 per request")
        ok = client.post("/translate", json={"q": "a dog. the cat.", "format": "document"})
        assert ok.status_code == 200


def test_document_sentences_wait_in_the_batchers_queue(loaded):
    """While the worker is held in another request's step, a document's sentences wait in the
    queue as one job's (never decoded on the event loop), then are answered."""
    served = GatedModel(translator(loaded))
    tr = translator(loaded)
    with client_for(served, max_wait_ms=0) as client, ThreadPoolExecutor(2) as pool:
        served.gate.clear()
        first = pool.submit(client.post, "/translate", json={"q": "die katze", "beam_size": 3})
        assert served.entered.wait(30)
        doc = pool.submit(client.post, "/translate", json={"q": DOCUMENT, "format": "document",
                                                            "beam_size": 3})
        n = sum(map(len, SENTENCES))
        wait_until(lambda: client.app.state.batcher.pending == n, what="the sentences to queue")
        served.gate.set()
        assert first.result(60).status_code == 200
        assert doc.result(60).json()["translatedText"].split("\n")[0] == " ".join(
            t for t in (tr.translate([s])[0] for s in SENTENCES[0]) if t)
