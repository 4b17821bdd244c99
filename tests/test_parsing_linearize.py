"""Linearization (§6.3, Vinyals et al. 2015) and delinearization: exact round trips, each repair
on a hand-built output, and a tree over exactly the input words for any token sequence."""

import random

import pytest
from nltk.tree import Tree

from aiayn.parsing.linearize import REPAIR_KINDS, Repairs, delinearize, linearize
from aiayn.parsing.treebank import tree_line

CAT = Tree.fromstring("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))")
WORDS = CAT.leaves()


def test_linearize_depth_first_with_labelled_closing_brackets():
    assert " ".join(linearize(CAT)) == "(S (NP XX XX )NP (VP XX (PP XX (NP XX XX )NP )PP )VP XX )S"
    assert " ".join(linearize(CAT, "tags")) == \
        "(S (NP DT NN )NP (VP VBD (PP IN (NP DT NN )NP )PP )VP . )S"
    assert " ".join(linearize(CAT, "words")) == \
        "(S (NP The cat )NP (VP sat (PP on (NP the mat )NP )PP )VP . )S"
    with pytest.raises(ValueError):
        linearize(CAT, "pos")


@pytest.mark.parametrize("text", [
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (NP (NN dogs))) (VP (VBP bark)))",  # a unary chain of one label
    "(FRAG (NP (NN Yes)))",
    "(NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-))",
])
@pytest.mark.parametrize("slots", ["xx", "tags", "words"])
def test_round_trip_is_exact_and_needs_no_repair(text, slots):
    tree = Tree.fromstring(text)
    back, fix = delinearize(linearize(tree, slots), tree.leaves())
    if slots == "tags":
        assert back == tree
    else:  # the same brackets; XX for every tag (words style: a word that reads as a tag gives it)
        assert tree_line(back) == tree_line(_all_xx(tree, slots == "words"))
    assert fix.total == 0 and fix.sentences == 0


def _all_xx(tree, words_as_tags=False):
    if isinstance(tree[0], str):
        word = tree[0]
        return Tree(word if words_as_tags and word in {".", "-LRB-", "-RRB-"} else "XX", [word])
    return Tree(tree.label(), [_all_xx(c, words_as_tags) for c in tree])


def _check(tokens, words, want_line, **want_counts):
    tree, fix = delinearize(tokens, words)
    assert tree_line(tree) == want_line
    assert dict(fix.counts) == want_counts
    assert fix.sentences == int(bool(want_counts))


def test_each_repair_on_a_hand_built_output():
    w = ["a", "b", "c"]
    _check("", w, "(S (XX a) (XX b) (XX c))", empty_output=1)
    _check(")NP (S (NP XX XX )NP XX )S", w, "(S (NP (XX a) (XX b)) (XX c))", extra_close=1)
    _check("(S (NP XX XX )VP XX )S", w, "(S (NP (XX a) (XX b)) (XX c))", mismatched_close=1)
    _check("(S (NP XX XX )NP (VP XX", w, "(S (NP (XX a) (XX b)) (VP (XX c)))", unclosed=2)
    _check("(S XX XX XX XX XX )S", w, "(S (XX a) (XX b) (XX c))", extra_slots=2)
    _check("(S (NP XX )NP )S", w, "(S (NP (XX a)) (XX b) (XX c))", missing_slots=2)
    _check("(S (NP XX XX )NP (VP (NP )NP )VP XX )S", w, "(S (NP (XX a) (XX b)) (XX c))",
           empty_constituents=2)
    _check("(NP XX )NP (VP XX XX )VP", w, "(S (NP (XX a)) (VP (XX b) (XX c)))", wrapped=1)
    _check("XX XX XX", w, "(S (XX a) (XX b) (XX c))", wrapped=1)
    _check("( XX XX XX )", w, "(X (XX a) (XX b) (XX c))", unlabelled=1)
    # an output with brackets but no slot: every word is missing, nothing is wrapped
    _check("(S (NP )NP )S", w, "(S (XX a) (XX b) (XX c))", empty_constituents=2, missing_slots=3)


def test_repairs_add_up_and_summarise():
    total = Repairs()
    for toks in ("", "(S XX XX XX XX )S", "(S XX XX XX )S"):
        total.add(delinearize(toks, ["a", "b", "c"])[1])
    assert total.sentences == 2 and total.total == 2
    assert total.summary() == "2 output(s) repaired: empty_output 1, extra_slots 1"
    assert Repairs().summary() == "no repairs"


def test_any_token_sequence_gives_a_well_formed_tree_over_exactly_the_words():
    rng = random.Random(0)
    vocab = ["(S", "(NP", "(VP", ")S", ")NP", ")VP", ")", "(", "XX", "XX", "XX", "NN", "."]
    seen = set()
    for _ in range(2000):
        words = [f"w{i}" for i in range(rng.randint(1, 8))]
        toks = [rng.choice(vocab) for _ in range(rng.randint(0, 30))]
        tree, fix = delinearize(toks, words)
        assert tree.leaves() == words
        line = tree_line(tree)
        assert Tree.fromstring(line) == tree  # it reads back: balanced, one root
        assert all(len(st) > 0 for st in tree.subtrees())  # no empty constituent
        assert all(isinstance(st[0], str) == (st.height() == 2) for st in tree.subtrees())
        seen.update(k for k, v in fix.counts.items() if v)
    assert seen == set(REPAIR_KINDS)  # the fuzzing reached every repair


def test_no_words_is_refused():
    with pytest.raises(ValueError):
        delinearize("(S XX )S", [])
