"""Word alignments from encoder-decoder attention: pieces merged into words, hard and soft
alignments worked out by hand on a hand-built matrix, `Translator.align` against a teacher-forced
pass, and `aiayn translate --alignment`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.cli import main as cli
from aiayn.data.model_dir import load_model
from aiayn.decoding.alignment import (
    SentenceAlignment,
    format_hard,
    format_soft,
    hard_alignment,
    soft_alignment,
    word_index,
    words_of,
)
from aiayn.decoding.common import source_batch
from aiayn.decoding.translate import Translator
from aiayn.errors import UserError
from aiayn.special import BOS_ID

from helpers import reverser_model_dir

SRC = ["\u2581the", "\u2581black", "\u2581cat", "s", "</s>"]
TGT = ["\u2581die", "\u2581schwarz", "en", "\u2581Katzen", "</s>"]
ATTN = np.array([[0.60, 0.10, 0.10, 0.00, 0.20],   # die      -> the
                 [0.10, 0.50, 0.20, 0.00, 0.20],   # schwarz  -> black
                 [0.00, 0.10, 0.30, 0.40, 0.20],   # en       -> s (of cats)
                 [0.05, 0.05, 0.20, 0.10, 0.60],   # Katzen   -> EOS, else cat
                 [0.00, 0.00, 0.00, 0.00, 1.00]])  # EOS step: no word


def test_pieces_merge_into_words():
    assert word_index(SRC) == [0, 1, 2, 2, -1]
    assert word_index(TGT) == [0, 1, 1, 2, -1]
    assert word_index(TGT, unit="piece") == [0, 1, 2, 3, -1]
    assert word_index(["a", "b", "\u2581c"]) == [0, 0, 1]  # no marker on the first piece
    assert words_of(SRC) == ["the", "black", "cats"]
    assert words_of(TGT) == ["die", "schwarzen", "Katzen"]
    assert words_of(["\u2581", "(", "\u2581x", "</s>"]) == ["(", "x"]
    assert word_index([]) == [] and words_of([]) == []


def test_hard_alignment_by_hand():
    pairs = hard_alignment(ATTN, word_index(SRC), word_index(TGT))
    # Each target piece's most attended source piece, EOS column left out; "en" and "schwarz"
    # make "schwarzen" link to both "black" and "cats".
    assert pairs == [(0, 0), (1, 1), (2, 1), (2, 2)]
    assert format_hard(pairs) == "0-0 1-1 2-1 2-2"
    pieces = hard_alignment(ATTN, word_index(SRC, "piece"), word_index(TGT, "piece"))
    assert pieces == [(0, 0), (1, 1), (3, 2), (2, 3)]
    assert hard_alignment(ATTN[:, -1:], [-1], word_index(TGT)) == []  # only EOS in the source


def test_soft_alignment_by_hand():
    soft = soft_alignment(ATTN, word_index(SRC), word_index(TGT))
    # Source pieces summed per word (cat + s), target pieces averaged (schwarz, en), EOS
    # dropped, rows renormalised.
    die = np.array([0.6, 0.1, 0.1]) / 0.8
    schwarzen = np.array([0.05, 0.30, 0.45]) / 0.8
    katzen = np.array([0.05, 0.05, 0.30]) / 0.4
    np.testing.assert_allclose(soft, np.stack([die, schwarzen, katzen]), atol=1e-6)
    np.testing.assert_allclose(soft.sum(1), 1.0, atol=1e-6)
    assert format_soft(np.array([[0.5, 0.25], [0.1, 0.9]]), decimals=2) == "0.50,0.25 0.10,0.90"
    a = SentenceAlignment.build("the black cats", "die schwarzen Katzen", SRC, TGT, ATTN, 2, None)
    assert a.format("hard") == "0-0 1-1 2-1 2-2" and a.tgt_words == ["die", "schwarzen", "Katzen"]
    assert a.to_dict()["pairs"] == [[0, 0], [1, 1], [2, 1], [2, 2]]
    assert a.piece_links() == [(0, 0), (1, 1), (2, 3), (3, 2)]  # (target piece, source piece)


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    loaded = load_model(reverser_model_dir(tmp_path_factory.mktemp("align")))
    return Translator(loaded, precision="fp32", warn=lambda m: None)  # the references are fp32


LINES = ["the cat sat on the mat", "", "a dog runs in the park", "die kinder"]


@pytest.mark.slow
def test_translator_align_returns_the_attention_behind_the_translation(translator):
    found = translator.align(LINES)
    assert [a.translation for a in found] == translator.translate(LINES)
    blank = found[1]
    assert blank.src_pieces == [] and blank.pairs == [] and blank.attention.shape == (0, 0)
    model = translator.model
    for line, a in zip(LINES, found):
        if not line:
            continue
        src = translator.prepare([line])[0]
        assert a.src_pieces == [translator.src_tokenizer.id_to_piece(i) for i in src] + ["</s>"]
        # the search's own pieces (re-encoding the detokenized text may segment it differently)
        tokens = [translator.tgt_tokenizer.piece_to_id(p) for p in a.tgt_pieces if p != "</s>"]
        steps = len(a.tgt_pieces)
        assert a.attention.shape == (steps, len(src) + 1) and a.layer == 1 and a.head is None
        np.testing.assert_allclose(a.attention.sum(1), 1.0, atol=1e-5)
        # The reference: a teacher-forced pass, last layer, mean of the heads.
        s, m = source_batch([src], multiple=1)  # no PAD keys: the weights over the source alone
        with torch.no_grad():
            tgt_in = torch.tensor([[BOS_ID] + tokens[: steps - 1]])
            _, w = model(s, tgt_in, m, return_attention=True)
        np.testing.assert_allclose(a.attention, w["cross"][-1][0].mean(0).numpy(), atol=1e-5)
        assert all(0 <= i < len(a.src_words) and 0 <= j < len(a.tgt_words) for i, j in a.pairs)
        assert {j for _, j in a.pairs} == set(range(len(a.tgt_words)))  # every target word links
    one_head = translator.align(LINES[:1], layer=0, head=2, unit="piece")[0]
    assert one_head.layer == 0 and one_head.head == 2
    assert len(one_head.src_words) == len(one_head.src_pieces) - 1
    with pytest.raises(UserError, match="layer"):
        translator.align(LINES[:1], layer=2)
    with pytest.raises(UserError, match="unit"):
        translator.align(LINES[:1], unit="char")


def test_cli_translate_alignment(translator, tmp_path, capsys):
    model = str(translator.loaded.path)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert cli(["translate", "--model", model, "--input", str(src), "--output", str(out),
                "--alignment", "hard"]) == 0
    rows = out.read_text(encoding="utf-8").split("\n")[:-1]
    expected = translator.align(LINES)
    assert rows == [f"{a.translation} ||| {format_hard(a.pairs)}" for a in expected]
    out2 = tmp_path / "soft.txt"
    assert cli(["translate", "--model", model, "--input", str(src), "--output", str(out2),
                "--alignment", "soft", "--alignment-layer", "1", "--alignment-unit", "piece"]) == 0
    soft = out2.read_text(encoding="utf-8").split("\n")[1].split(" ||| ")  # the blank line
    assert soft == ["", ""]
    first = out2.read_text(encoding="utf-8").split("\n")[0].split(" ||| ")[1].split(" ")
    assert all(abs(sum(map(float, g.split(","))) - 1) < 0.01 for g in first)
    capsys.readouterr()
    assert cli(["translate", "--model", model, "--input", str(src), "--alignment", "hard",
                "--nbest", "2"]) == 2
    assert cli(["translate", "--model", model, "--input", str(src), "--alignment", "hard",
                "--alignment-layer", "3"]) == 2
    err = capsys.readouterr().err
    assert "--nbest" in err and "--alignment-layer 3: the model has 2 layers" in err
    assert "Traceback" not in err and not Path(tmp_path / "missing").exists()
