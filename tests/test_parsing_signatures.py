"""Word signatures (aiayn/parsing/signatures.py): shapes and suffixes worked out by hand, a
corpus's rare words replaced, and the parse-time mapping giving the corpus's own source."""

import pytest

from aiayn.data.tokenizer import Tokenizer
from aiayn.parsing.parse import parse_lines
from aiayn.parsing.signatures import model_inputs, replace_rare, signature
from aiayn.recipes.parsing import write_corpus

from helpers import treebank_zip


@pytest.mark.parametrize("word, want", [
    ("cat", "UNK"),
    ("cats", "UNK-s"),
    ("is", "UNK"),  # a suffix needs 3 letters before it
    ("reorganizing", "UNK-ing"),
    ("happiness", "UNK-ness"),  # the longest suffix, not -s
    ("quickly", "UNK-ly"),
    ("Stamford-based", "UNK-Cap-hyph-ed"),
    ("IBM", "UNK-CAPS"),
    ("U.S.", "UNK-CAPS"),
    ("A", "UNK-Cap"),  # one capital letter is not CAPS
    ("3.8", "UNK-num"),
    ("1990s", "UNK-num"),  # no letters before the -s
    ("mid-1990s", "UNK-num-hyph-s"),
])
def test_signature(word, want):
    assert signature(word) == want


def test_replace_rare_keeps_known_words():
    assert replace_rare(["The", "zebra", "jumped", "."], {"The", "."}) == ["The", "UNK", "UNK-ed", "."]


@pytest.fixture(scope="module")
def word_tokenizer():
    text = ["the UNK-Cap UNK-ing .", "the UNK-ed cat ."] * 3
    return Tokenizer.train(text, 10, "word")


def test_model_inputs_map_only_what_the_vocabulary_cannot_read(word_tokenizer):
    # Zebra and jumping are unknown and their signatures known; "fast" -> "UNK", not in the
    # vocabulary, so the word stays (the model reads UNK either way); "cat" is known
    got = model_inputs(["the Zebra cat jumping fast .", ""], word_tokenizer)
    assert got == ["the UNK-Cap cat UNK-ing fast .", ""]


def test_model_inputs_leave_a_byte_fallback_vocabulary_alone():
    bpe = Tokenizer.train(["the cat sat on the mat ."] * 20, 280, "bpe")
    lines = ["the Zebra is jumping", "UNK-Cap"]
    assert model_inputs(lines, bpe) == lines


def test_corpus_source_with_signatures_matches_the_parse_time_mapping(tmp_path):
    out = tmp_path / "corpus"
    info = write_corpus(treebank_zip(tmp_path), out, "train=1,test=2", signatures=2)
    # only "." is seen twice in training; "," is never seen
    assert (out / "train.src").read_text().splitlines() == [
        "UNK-Cap UNK UNK UNK UNK UNK UNK .", "UNK-Cap UNK ."]
    assert (out / "test.src").read_text() == "UNK-Cap UNK UNK UNK-Cap .\n"
    assert (out / "train.words").read_text().startswith("The cat was")  # the sentence, as it is
    # the shared vocabulary: UNK-Cap, UNK, ".", 9 tree symbols and 4 specials, exactly what
    # sentencepiece can build from the training text
    assert info["vocabulary"] == 16 and info["signatures"] == 2
    text = (out / "train.src").read_text().splitlines() + (out / "train.tree").read_text().splitlines()
    tok = Tokenizer.train(text, info["vocabulary"], "word")
    with pytest.raises(Exception, match="at most 16"):
        Tokenizer.train(text, info["vocabulary"] + 1, "word")
    test_words = (out / "test.words").read_text().splitlines()
    assert model_inputs(test_words, tok) == (out / "test.src").read_text().splitlines()
    # with the words in the target: a word written as a signature is XX there, so the
    # vocabulary holds a word only when the source does, and parsing reads what training read
    w = tmp_path / "words"
    info = write_corpus(treebank_zip(tmp_path), w, "train=1,test=2", slots="words", target_words=3,
                        signatures=2)
    # ("The" and "cat" are among the 3 commonest but seen once: XX)
    assert (w / "train.tree").read_text().startswith("(S (NP XX XX )NP")
    text = (w / "train.src").read_text().splitlines() + (w / "train.tree").read_text().splitlines()
    tok = Tokenizer.train(text, info["vocabulary"], "word")
    for split in ("train", "test"):
        words = (w / f"{split}.words").read_text().splitlines()
        assert model_inputs(words, tok) == (w / f"{split}.src").read_text().splitlines()
    # without signatures there is no .src file
    write_corpus(treebank_zip(tmp_path), tmp_path / "plain", "train=1,test=2")
    assert not (tmp_path / "plain" / "train.src").exists()


def test_parse_lines_give_the_model_signatures_and_build_trees_over_the_words(word_tokenizer):
    class Recording:  # a translator that writes a flat tree and keeps what it was given
        src_tokenizer = word_tokenizer

        def translate(self, lines, progress=False, first_line=1, constraint=None):
            self.seen = list(lines)
            return ["(S " + " ".join("XX" for _ in line.split()) + " )S" for line in lines]

    t = Recording()
    res = parse_lines(t, ["the Zebra jumping ."])
    assert t.seen == ["the UNK-Cap UNK-ing ."]
    assert res.trees == ["(S (XX the) (XX Zebra) (XX jumping) (XX .))"]


def test_treebank_command_writes_the_model_source(tmp_path, aiayn):
    out = tmp_path / "corpus"
    r = aiayn("treebank", "--treebank", treebank_zip(tmp_path), "--out", out, "--splits", "train=1,test=2",
              "--signatures", "2")
    assert r[0] == 0, r[2]
    assert "16 pieces" in r[1]
    assert (out / "test.src").read_text() == "UNK-Cap UNK UNK UNK-Cap .\n"
    bad = aiayn("treebank", "--treebank", treebank_zip(tmp_path), "--out", tmp_path / "b", "--signatures", "-1")
    assert bad[0] == 2 and "--signatures" in bad[2] and bad[2].count("\n") == 1
