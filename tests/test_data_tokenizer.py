"""The sentencepiece tokenizer: exact round trips, fixed special ids, quiet training, clear errors."""

from __future__ import annotations

import random

import pytest

from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, train_tokenizers
from aiayn.errors import UserError

WORDS = ("Haus Männer Grüße über Straße Bäume Öl schön müde groß the house men walk over a street "
         "trees oil nice tired big Hello, world! Ja? nein; (Klammer) \"Zitat\" 3.14 50% e-mail").split()


def corpus(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.train(corpus(), vocab_size=400)


def test_special_ids(tok):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert [tok.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.vocab_size == 400


@pytest.mark.parametrize("text", [
    "Hello, world!",
    "Über die Straße gehen zwei müde Männer.",
    "Grüße aus Köln; \"Zitat\" (Klammer) 3.14 - 50%?",
    "  two  spaces\tand a tab, trailing space ",
    "",
])
def test_round_trip_ordinary_text(tok, text):
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 4 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_unseen_characters_round_trip_by_bytes(tok):
    text = "naïve façade — 東京 😀 ß"
    ids = tok.encode(text)
    assert UNK_ID not in ids
    assert tok.decode(ids) == text


def test_decode_drops_specials(tok):
    ids = tok.encode("schön groß")
    assert tok.decode([BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID]) == "schön groß"


def test_encode_batch_matches_encode(tok):
    texts = corpus(50, seed=1)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_save_load(tmp_path, tok):
    path = tmp_path / "sub" / "spm.model"
    tok.save(path)
    back = Tokenizer.load(path)
    assert back == tok and back.vocab_size == tok.vocab_size
    text = "Bäume über der Straße"
    assert back.encode(text) == tok.encode(text)
    assert [p.name for p in path.parent.iterdir()] == ["spm.model"]  # no temp files left


def test_train_with_path_saves(tmp_path):
    path = tmp_path / "m.model"
    t = Tokenizer.train(corpus(100), vocab_size=350, path=path)
    assert Tokenizer.load(path) == t


def test_training_and_loading_are_quiet(capfd, tmp_path):
    t = Tokenizer.train(corpus(100), vocab_size=350, path=tmp_path / "m.model")
    Tokenizer.load(tmp_path / "m.model").decode(t.encode("über"))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_vocab_too_large_is_user_error():
    with pytest.raises(UserError, match=r"vocabulary size 50000 is too large .* at most \d+ pieces"):
        Tokenizer.train(corpus(50), vocab_size=50000)


def test_vocab_too_small_for_byte_fallback_is_user_error():
    with pytest.raises(UserError, match=r"vocabulary size 100 is too small.*--vocab-size \d+ or more"):
        Tokenizer.train(corpus(50), vocab_size=100)


def test_bad_inputs():
    with pytest.raises(UserError, match="empty training text"):
        Tokenizer.train(["", "  "], vocab_size=300)
    with pytest.raises(UserError, match="unknown tokenizer model type"):
        Tokenizer.train(corpus(10), vocab_size=300, model_type="wordpiece")


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="no such tokenizer model"):
        Tokenizer.load(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(UserError, match="junk.model: not a sentencepiece model"):
        Tokenizer.load(junk)


def test_char_model_is_small_and_round_trips():
    texts = ["hello", "world", "help", "word"]
    t = Tokenizer.train(texts, vocab_size=20, model_type="char")
    assert t.vocab_size == 4 + len(set("".join(texts))) + 1  # specials, characters, "▁"
    for text in texts + ["low hold"]:
        assert t.decode(t.encode(text)) == text


def test_separate_vocabularies():
    src, tgt = train_tokenizers(corpus(100, 1), corpus(100, 2), 350, separate=True, tgt_vocab_size=360)
    assert src is not tgt and src.vocab_size == 350 and tgt.vocab_size == 360
    shared_src, shared_tgt = train_tokenizers(corpus(100, 1), corpus(100, 2), 350)
    assert shared_src is shared_tgt


def test_pickle_round_trip(tok):
    import pickle

    back = pickle.loads(pickle.dumps(tok))
    assert back == tok and back.encode("Öl und Bäume") == tok.encode("Öl und Bäume")
