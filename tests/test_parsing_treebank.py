"""Treebank reading (against nltk's own corpus reader), cleaning and splits by file, on small
hand-written PTB files."""

import zipfile

import pytest
from nltk.tree import Tree

from aiayn.errors import UserError
from aiayn.parsing.treebank import (
    clean_tree,
    file_number,
    parse_split_spec,
    read_treebank,
    split_bracketed,
    split_treebank,
    strip_label,
    tree_line,
)

from helpers import FILE_A, FILE_B  # two hand-written PTB files


def _write_dir(root):
    d = root / "treebank" / "combined"
    d.mkdir(parents=True)
    (d / "wsj_0001.mrg").write_text(FILE_A)
    (d / "wsj_0002.mrg").write_text(FILE_B)
    (d / "README").write_text("not a tree (")
    return root / "treebank"


def test_reader_matches_nltk_corpus_reader_on_a_directory_and_a_zip(tmp_path, monkeypatch):
    import nltk
    from nltk.corpus.reader import BracketParseCorpusReader

    root = _write_dir(tmp_path)
    # nltk's readers open only files under its data path
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])
    nltk_trees = BracketParseCorpusReader(str(root / "combined"), r"wsj_.*\.mrg").parsed_sents()
    ours = read_treebank(root)
    assert list(ours) == ["wsj_0001.mrg", "wsj_0002.mrg"]
    # nltk's reader also drops each tree's unlabelled outer bracket; ours leaves that to cleaning
    assert all(t.label() == "" and len(t) == 1 for trees in ours.values() for t in trees)
    assert [t[0] for trees in ours.values() for t in trees] == list(nltk_trees)
    z = tmp_path / "tb.zip"
    with zipfile.ZipFile(z, "w") as f:
        for p in (root / "combined").iterdir():
            f.write(p, f"treebank/combined/{p.name}")
    assert read_treebank(z) == ours


def test_reader_errors_are_one_line_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such treebank"):
        read_treebank(tmp_path / "missing")
    with pytest.raises(UserError, match="no .mrg files"):
        read_treebank(tmp_path)
    (tmp_path / "x.mrg").write_text("( (S (NP (DT a)) )")
    with pytest.raises(UserError, match="unclosed"):
        read_treebank(tmp_path)
    with pytest.raises(UserError, match="unbalanced"):
        split_bracketed("(S (X a)))", "f")


def test_split_bracketed_finds_each_top_level_tree():
    assert split_bracketed(" ( (S (X a)) )\n(T (Y b))\n") == ["( (S (X a)) )", "(T (Y b))"]


@pytest.mark.parametrize("label,want", [
    ("NP-SBJ-1", "NP"), ("NP=2", "NP"), ("PP-LOC-CLR", "PP"), ("S-TPC-2", "S"), ("NP", "NP"),
    ("-NONE-", "-NONE-"), ("-LRB-", "-LRB-"), ("ADVP|PRT", "ADVP|PRT"),
])
def test_strip_label(label, want):
    assert strip_label(label) == want


def test_cleaning_removes_traces_empty_constituents_tags_and_the_outer_bracket():
    a, b = (Tree.fromstring(s) for s in split_bracketed(FILE_A))
    # (NP (-NONE- *-1)) goes, and with it nothing else; NP-SBJ-1 and PP-LOC lose their tags.
    assert tree_line(clean_tree(a)) == ("(S (NP (DT The) (NN cat)) (VP (VBD was) (VP (VBN seen) "
                                        "(PP (IN on) (NP (DT the) (NN mat))))) (. .))")
    assert tree_line(clean_tree(b)) == "(S (NP (PRP It)) (VP (VBD ran)) (. .))"
    c = Tree.fromstring(FILE_B)
    # S-TPC-2 keeps its VP; (S (-NONE- ...)) under VP is emptied and removed; NP-SBJ=3 -> NP.
    assert tree_line(clean_tree(c)) == "(SINV (S (VP (VB Go))) (, ,) (VP (VBD said)) (NP (NNP Ann)) (. .))"
    assert clean_tree(Tree.fromstring("(TOP (S (NP (-NONE- *))))")) is None
    # a TOP node above one constituent goes like the empty bracket; words are never touched
    t = clean_tree(Tree.fromstring("(TOP (S (NP (-LRB- -LRB-) (NN x-y))))"))
    assert tree_line(t) == "(S (NP (-LRB- -LRB-) (NN x-y)))"


def test_split_spec_and_file_numbers():
    assert parse_split_spec("train=1-9,train=20-29, dev=10") == {"train": [(1, 9), (20, 29)], "dev": [(10, 10)]}
    for bad in ("train=1-9,dev=9-12", "train=5-1", "train", "=1-2"):
        with pytest.raises(UserError):
            parse_split_spec(bad)
    assert file_number("wsj_0042.mrg") == 42 and file_number("a/wsj_2301.mrg") == 2301
    with pytest.raises(UserError, match="no number"):
        file_number("README.mrg")


def test_split_treebank_assigns_files_by_number_and_cleans(tmp_path):
    files = read_treebank(_write_dir(tmp_path))
    parts = split_treebank(files, "train=1-1,test=2-2")
    assert parts["train"].files == ["wsj_0001.mrg"] and len(parts["train"].trees) == 2
    assert parts["test"].files == ["wsj_0002.mrg"] and parts["test"].trees[0].label() == "SINV"
    with pytest.raises(UserError, match="holds no trees"):
        split_treebank(files, "train=1-1,test=3-9")
