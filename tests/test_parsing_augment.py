"""Subtree substitution (aiayn/parsing/augment.py): every new tree is one same-label swap into a
training tree, checked against all such swaps listed by brute force; the length limit; and the
corpus it writes (signatures still counted on the treebank's trees alone)."""

import json

from nltk.tree import Tree

from aiayn.parsing.augment import phrase_positions, substitute
from aiayn.parsing.treebank import tree_line
from aiayn.recipes.parsing import write_corpus

from helpers import treebank_zip

A = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
B = "(S (NP (PRP It)) (VP (VBD ran) (ADVP (RB away))) (. .))"


def _trees():
    return [Tree.fromstring(A), Tree.fromstring(B)]


def all_swaps(trees):
    """Every tree one swap can make (a phrase for a different phrase of its label), by brute
    force over all pairs of subtrees."""
    out = set()
    subtrees = [s for t in trees for s in t.subtrees() if s is not t and s.height() > 2]
    for t in trees:
        for p in t.treepositions():
            old = t[p]
            if not p or not isinstance(old, Tree) or old.height() <= 2:
                continue
            for new in subtrees:
                if new.label() == old.label() and new != old:
                    made = t.copy(deep=True)
                    made[p] = new.copy(deep=True)
                    out.add(tree_line(made))
    return out


def test_phrase_positions_skip_the_root_and_part_of_speech_nodes():
    t = Tree.fromstring("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat))))"
                        " (. .))")
    assert phrase_positions(t) == [(0,), (1,), (1, 1), (1, 1, 1)]
    assert [t[p].label() for p in phrase_positions(t)] == ["NP", "VP", "PP", "NP"]
    assert phrase_positions(Tree.fromstring("(S (NN x))")) == []


def test_every_new_tree_is_one_same_label_swap_within_the_length_limit():
    trees = _trees()
    before = [tree_line(t) for t in trees]
    made = substitute(trees, 10, seed=3, max_words=5)
    assert [tree_line(t) for t in trees] == before  # the input is not changed
    assert len(made) == 20  # ADVP has no other ADVP to swap with, so it is drawn again
    lines = {tree_line(t) for t in made}
    assert lines <= all_swaps(trees)
    # 4 swaps exist (The cat <-> It, sat <-> ran away) but make 2 trees: A with It is B with
    # sat, A with ran away is B with The cat; 20 draws find both
    assert lines == all_swaps(trees) and len(lines) == 2
    # by default no sentence outgrows the longest training sentence (4 words): only the two
    # swaps that shorten a sentence are made, and they make one tree
    short = substitute(trees, 10, seed=3)
    assert {tree_line(t) for t in short} == {"(S (NP (PRP It)) (VP (VBD sat)) (. .))"}
    assert all(len(t.leaves()) <= 4 for t in short)


def test_the_same_seed_gives_the_same_trees():
    one = [tree_line(t) for t in substitute(_trees(), 5, seed=7)]
    assert one == [tree_line(t) for t in substitute(_trees(), 5, seed=7)]
    assert substitute(_trees(), 0) == [] and substitute([], 3) == []


def test_corpus_with_augment_appends_new_trees_and_counts_words_on_the_treebank(tmp_path):
    plain = write_corpus(treebank_zip(tmp_path), tmp_path / "plain", "train=1,test=2", slots="words",
                         signatures=2)
    out = tmp_path / "aug"
    info = write_corpus(treebank_zip(tmp_path), out, "train=1,test=2", slots="words", signatures=2,
                        augment=3, augment_seed=5)
    words = (out / "train.words").read_text().splitlines()
    made = info["counts"]["train"]["augmented"]
    assert made > 0 and len(words) == 2 + made == info["counts"]["train"]["sentences"]
    assert words[:2] == (tmp_path / "plain" / "train.words").read_text().splitlines()
    # the four files stay line-aligned
    for suffix in ("src", "tree", "gold"):
        assert len((out / f"train.{suffix}").read_text().splitlines()) == len(words)
    # copies do not make a word common: only "." was seen twice in the treebank's train trees
    src = (out / "train.src").read_text().splitlines()
    assert {w for line in src for w in line.split()} <= {".", "UNK", "UNK-Cap"}
    assert info["vocabulary"] == plain["vocabulary"]
    for suffix in ("words", "src", "tree", "gold"):  # test is untouched
        assert (out / f"test.{suffix}").read_text() == (tmp_path / "plain" / f"test.{suffix}").read_text()
    # each new gold tree is one swap into a treebank tree
    gold = [Tree.fromstring(s) for s in (out / "train.gold").read_text().splitlines()]
    assert {tree_line(t) for t in gold[2:]} <= all_swaps(gold[:2])
    assert json.loads((out / "corpus.json").read_text())["augment"] == 3


def test_treebank_command_augments(tmp_path, aiayn):
    out = tmp_path / "corpus"
    r = aiayn("treebank", "--treebank", treebank_zip(tmp_path), "--out", out, "--splits", "train=1,test=2",
              "--augment", "2")
    assert r[0] == 0, r[2]
    assert "made by --augment" in r[1]
    bad = aiayn("treebank", "--treebank", treebank_zip(tmp_path), "--out", tmp_path / "b",
                "--augment", "-1")
    assert bad[0] == 2 and "--augment" in bad[2] and bad[2].count("\n") == 1
