"""The parsing commands end to end on tiny fixtures: `aiayn treebank` on a zip, `aiayn parse` with
a random model (its outputs are garbage, its trees must still be over exactly the input words),
`aiayn evalb`, and the parsing presets through get_preset."""

import json
from dataclasses import replace

import pytest
import torch
from nltk.tree import Tree

from aiayn.config import BASE
from aiayn.parsing.parse import parse_lines, trees_from_outputs
from aiayn.presets import all_presets, get_preset

from helpers import treebank_zip


def test_treebank_command_writes_aligned_corpus_files(tmp_path, aiayn):
    out = tmp_path / "corpus"
    r = aiayn("treebank", "--treebank", str(treebank_zip(tmp_path)), "--out", str(out),
                "--splits", "train=1,test=2")
    assert r[0] == 0, r[2]
    assert (out / "train.words").read_text().splitlines() == ["The cat was seen on the mat .", "It ran ."]
    assert (out / "train.tree").read_text().splitlines()[1] == "(S (NP XX )NP (VP XX )VP XX )S"
    assert (out / "test.gold").read_text().startswith("(SINV (S (VP (VB Go)))")
    info = json.loads((out / "corpus.json").read_text())
    assert info["counts"]["train"]["sentences"] == 2 and info["train_target_symbols"] == 9
    # words in the target, only the 2 commonest training words ("." twice, then "The", first of
    # the words seen once) written, the others XX
    w = tmp_path / "words"
    r = aiayn("treebank", "--treebank", str(treebank_zip(tmp_path)), "--out", str(w), "--splits",
              "train=1,test=2", "--slots", "words", "--target-words", "2")
    assert r[0] == 0, r[2]
    assert (w / "train.tree").read_text().splitlines()[1] == "(S (NP XX )NP (VP XX )VP . )S"
    assert (w / "test.tree").read_text().startswith("(SINV (S (VP XX )VP )S XX (VP XX )VP (NP XX )NP . )SINV")
    assert (w / "train.tree").read_text().startswith("(S (NP The XX )NP")
    again = aiayn("treebank", "--treebank", str(treebank_zip(tmp_path)), "--out", str(out))
    assert again[0] == 2 and "--overwrite" in again[2]
    missing = aiayn("treebank", "--treebank", str(tmp_path / "nope.zip"), "--out", str(out))
    assert missing[0] == 2 and missing[2].count("\n") == 1


def test_evalb_command_prints_the_summary_and_json(tmp_path, aiayn):
    gold = tmp_path / "gold"
    test = tmp_path / "test"
    gold.write_text("(S (NP (DT a)) (VP (VBZ b) (. .)))\n(S (NP (NNS dogs)) (VP (VBP bark)))\n")
    test.write_text("(S (XX a) (VP (XX b) (XX .)))\n(S (NP (XX dogs)) (VP (XX bark)))\n")
    r = aiayn("evalb", "--gold", str(gold), "--test", str(test), "--tags-from-gold", "--json")
    assert r[0] == 0, r[2]
    res = json.loads(r[1])["all"]
    # sentence 1: gold S NP VP, test S VP -> 2 of 3 / 2 of 2; sentence 2: 3 of 3
    assert (res["match"], res["gold"], res["test"]) == (5, 6, 5) and res["errors"] == 0
    r = aiayn("evalb", "--gold", str(gold), "--test", str(test), "--summary")
    assert "Bracketing FMeasure" in r[1] and "Sent." not in r[1]
    # without the gold tags, "(XX .)" is a word where the gold has deleted punctuation
    r = aiayn("evalb", "--gold", str(gold), "--test", str(test), "--json")
    assert json.loads(r[1])["all"]["errors"] == 1


@pytest.fixture(scope="module")
def parser_model(tmp_path_factory):
    """A random model with a word source vocabulary and a linearized-tree target vocabulary."""
    from aiayn.data.model_dir import SRC_SPM, TGT_SPM, save_model
    from aiayn.data.tokenizer import train_tokenizers
    from aiayn.model import Transformer

    d = tmp_path_factory.mktemp("parser")
    words = ["the cat sat on the mat .", "a dog ran in the park", "it ran ."] * 4
    trees = ["(S (NP XX XX )NP (VP XX (PP XX (NP XX XX )NP )PP )VP XX )S", "(FRAG XX )FRAG"] * 6
    src, tgt = train_tokenizers(words, trees, 16, "word", separate=True, tgt_vocab_size=14)
    src.save(d / SRC_SPM)
    tgt.save(d / TGT_SPM)
    cfg = replace(get_preset("parsing-seq2seq-small"), vocab_size=src.vocab_size, tgt_vocab_size=tgt.vocab_size,
                  tie_embeddings=False, n_layers=1, d_model=32, d_ff=64, n_heads=4, max_len_b=12)
    torch.manual_seed(0)
    return save_model(d / "model", Transformer(cfg).eval(), cfg,
                      {SRC_SPM: d / SRC_SPM, TGT_SPM: d / TGT_SPM})


def test_parse_command_gives_trees_over_exactly_the_input_words(tmp_path, parser_model, aiayn):
    sentences = ["the cat sat on the mat .", "", "unknown words here", "a"]
    inp = tmp_path / "in.txt"
    inp.write_text("".join(s + "\n" for s in sentences))
    out, lin = tmp_path / "out.txt", tmp_path / "out.lin"
    r = aiayn("parse", "--model", str(parser_model), "--input", str(inp), "--output", str(out),
                "--linearized", str(lin), "--beam", "3")
    assert r[0] == 0, r[2]
    assert "sentences/s" in r[2]
    trees = out.read_text().splitlines()
    assert len(trees) == len(sentences) == len(lin.read_text().splitlines())
    for s, t in zip(sentences, trees):
        assert (Tree.fromstring(t).leaves() if t else []) == s.split()
    again = aiayn("parse", "--model", str(parser_model), "--input", str(inp), "--output", str(out))
    assert again[0] == 2 and "--overwrite" in again[2]


def test_parse_streams_in_groups_with_the_same_trees(tmp_path, parser_model, aiayn, monkeypatch):
    """Groups smaller than the input (parsed and written one after another) give the trees,
    raw outputs and repair counts of one whole-input parse."""
    from aiayn.commands import parse as parse_command

    sentences = ["the cat sat on the mat .", "", "unknown words here", "a", "it ran .", "a dog"]
    inp = tmp_path / "in.txt"
    inp.write_text("".join(s + "\n" for s in sentences))
    whole = aiayn("parse", "--model", str(parser_model), "--input", str(inp), "--output",
                  str(tmp_path / "whole.txt"), "--linearized", str(tmp_path / "whole.lin"),
                  "--beam", "3")
    monkeypatch.setattr(parse_command, "STREAM_LINES", 4)
    grouped = aiayn("parse", "--model", str(parser_model), "--input", str(inp), "--output",
                    str(tmp_path / "grouped.txt"), "--linearized", str(tmp_path / "grouped.lin"),
                    "--beam", "3")
    assert whole[0] == grouped[0] == 0, grouped[2]
    for ext in ("txt", "lin"):
        got = (tmp_path / f"grouped.{ext}").read_text()
        assert got == (tmp_path / f"whole.{ext}").read_text() and got.count("\n") == len(sentences)
    summary = [line for line in grouped[2].splitlines() if "sentences in" in line]
    assert summary and "6 sentences" in summary[0]
    assert summary[0].split("; ")[-1] == whole[2].strip().splitlines()[-1].split("; ")[-1]


def test_constrained_parse_needs_no_repairs(tmp_path, parser_model, aiayn):
    sentences = ["the cat sat on the mat .", "", "unknown words here", "a"]
    inp = tmp_path / "in.txt"
    inp.write_text("".join(s + "\n" for s in sentences))
    out, lin = tmp_path / "out.txt", tmp_path / "out.lin"
    free = aiayn("parse", "--model", str(parser_model), "--input", str(inp), "--beam", "3")
    assert "no repairs" not in free[2]  # the random model's own outputs are not trees
    r = aiayn("parse", "--model", str(parser_model), "--input", str(inp), "--output", str(out),
              "--linearized", str(lin), "--beam", "3", "--constrained")
    assert r[0] == 0, r[2]
    assert "no repairs" in r[2]
    for s, t, o in zip(sentences, out.read_text().splitlines(), lin.read_text().splitlines()):
        assert (Tree.fromstring(t).leaves() if t else []) == s.split()
        assert sum(not tok.startswith(("(", ")")) for tok in o.split()) == len(s.split())


def test_parse_lines_delinearizes_the_translators_outputs():
    class ReadsAll:  # a tokenizer that knows every word
        def encode(self, text):
            return [5]

    class Fixed:  # a translator that always says the same
        src_tokenizer = ReadsAll()

        def translate(self, lines, progress=False, first_line=1, constraint=None):
            return ["(S (NP XX )NP (VP XX XX )VP )S", "(S XX XX XX"][: len(lines)]

    res = parse_lines(Fixed(), ["a ( c", "x y)"])
    assert res.trees == ["(S (NP (XX a)) (VP (XX -LRB-) (XX c)))", "(S (XX x) (XX y-RRB-))"]
    assert dict(res.repairs.counts) == {"unclosed": 1, "extra_slots": 1} and res.repairs.sentences == 1
    with pytest.raises(ValueError):
        trees_from_outputs(["a"], [])


def test_the_recipes_parsers_decode_as_section_6_3():
    small, paper = get_preset("parsing-seq2seq-small"), get_preset("parsing")
    assert (small.beam_size, small.alpha, small.max_len_b) == (paper.beam_size, paper.alpha,
                                                               paper.max_len_b) == (21, 0.3, 300)
    assert small != BASE and "parsing-seq2seq-small" in all_presets()
