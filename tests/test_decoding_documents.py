"""`aiayn translate --documents`: paragraphs split into sentences, translated together, put back
line for line; a sentence too long for the model is cut between words, never truncated."""

from __future__ import annotations

import pytest

from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model
from aiayn.decoding.documents import split_pieces, split_sentences, translate_paragraphs
from aiayn.decoding.translate import Translator

# Each paragraph is written from these sentences, so its expected split is known here.
SENTENCES = [["The cat sat on the mat.", "A dog runs in the park!", "Die Katze schläft."],
             [],
             ["The children play in the garden?", "Ein Hund."],
             [],
             [],
             ["a dog"]]
PARAGRAPHS = [" ".join(s) for s in SENTENCES]


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(model_dir)


def test_split_sentences():
    assert [split_sentences(p) for p in PARAGRAPHS] == SENTENCES
    assert split_sentences("   ") == []


@pytest.mark.parametrize("keep", [1, 2, 3, 5, 100])
def test_split_pieces_covers_the_ids_and_cuts_before_words(keep):
    ids = [10, 11, 12, 20, 30, 31, 32, 33, 34, 40, 50, 51]
    starts = {10, 20, 30, 40, 50}
    parts = split_pieces(ids, keep, starts.__contains__)
    assert [i for part in parts for i in part] == ids  # nothing dropped, order kept
    assert all(1 <= len(part) <= keep for part in parts)
    for part, nxt in zip(parts, parts[1:]):
        # a cut falls before a word's first piece unless no word starts within reach
        start = len([i for p in parts[: parts.index(part)] for i in p])
        reach = ids[start + 1: start + keep + 1]
        assert nxt[0] in starts or not any(i in starts for i in reach)
    with pytest.raises(ValueError):
        split_pieces(ids, 0, starts.__contains__)


def test_a_documents_sentences_are_their_translations_alone(loaded):
    tr = Translator(loaded, precision="fp32", beam_size=3)
    out = translate_paragraphs(tr, PARAGRAPHS)
    assert len(out) == len(PARAGRAPHS)
    for sentences, text in zip(SENTENCES, out):
        alone = [t for t in (tr.translate([s])[0] for s in sentences) if t]
        assert text == " ".join(alone)
    assert out[1] == out[3] == out[4] == ""


def test_a_long_sentence_is_split_not_truncated(loaded):
    warnings: list[str] = []
    tr = Translator(loaded, precision="fp32", max_src_tokens=12, warn=warnings.append)
    sentence = " ".join(["the children play in the garden"] * 4) + "."
    ids = loaded.src_tokenizer.encode(sentence)
    assert len(ids) > 3 * 11  # several parts
    (text,) = translate_paragraphs(tr, [sentence])
    parts = split_pieces(ids, 11, lambda i: loaded.src_tokenizer.id_to_piece(i).startswith("\u2581"))
    assert len(parts) >= 4 and [i for p in parts for i in p] == ids
    want = [tr.detokenize(h[0].tokens) for h in tr.search(parts)]
    assert text == " ".join(t for t in want if t)
    assert warnings == []  # nothing truncated


def test_cli_documents_keep_the_lines(model_dir, loaded, tmp_path, capsys):
    src = tmp_path / "doc.txt"
    src.write_text("\n".join(PARAGRAPHS) + "\n", encoding="utf-8")
    out = tmp_path / "doc.de"
    assert cli_main(["translate", "--precision", "fp32", "--model", str(model_dir), "--input",
                     str(src), "--output", str(out), "--documents", "--sentence-language",
                     "en"]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(PARAGRAPHS)  # one line per paragraph
    tr = Translator(loaded, precision="fp32")
    assert lines[:-1] == translate_paragraphs(tr, PARAGRAPHS)
    assert [line == "" for line in lines[:-1]] == [not p for p in PARAGRAPHS]
    capsys.readouterr()
    for extra in (["--nbest", "2"], ["--format", "jsonl"], ["--alignment", "hard"]):
        assert cli_main(["translate", "--model", str(model_dir), "--input", str(src),
                         "--documents", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--documents" in err
    assert cli_main(["translate", "--model", str(model_dir), "--input", str(src),
                     "--sentence-language", "de"]) == 2
    assert "add --documents" in capsys.readouterr().err
