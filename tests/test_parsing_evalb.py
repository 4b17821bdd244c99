"""The EVALB scorer on gold/test pairs whose figures are worked out by hand in the comments."""

import pytest

from aiayn.errors import UserError
from aiayn.parsing.evalb import COLLINS, EvalbParams, evalb, read_bracketing, read_params, retag_from_gold

CAT = "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"


def one(gold: str, test: str, params: EvalbParams = COLLINS):
    res = evalb([gold], [test], params)
    return res.sentences[0], res


def test_reading_deletes_punctuation_before_counting_spans():
    b = read_bracketing(CAT)
    # "." is deleted: 6 words; the length for the cutoff still counts it (7)
    assert [w for w, _ in b.terminals] == ["The", "cat", "sat", "on", "the", "mat"]
    assert b.length == 7
    assert b.brackets == [(0, 6, "S"), (0, 2, "NP"), (2, 6, "VP"), (3, 6, "PP"), (4, 6, "NP")]


def test_one_misattached_pp():
    # gold S(0,6) NP(0,2) VP(2,6) PP(3,6) NP(4,6); test has VP(2,3) instead of VP(2,6):
    # 4 of 5 match on each side: R = P = F = 80; VP(2,3) lies inside gold brackets: no crossing
    test = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (PP (IN on) (NP (DT the) (NN mat))) (. .))"
    s, res = one(CAT, test)
    assert (s.match, s.gold, s.test, s.crossing) == (4, 5, 5, 0)
    assert res.all.recall == pytest.approx(80) and res.all.precision == pytest.approx(80)
    assert res.all.f1 == pytest.approx(80) and res.all.complete_match == 0


def test_punctuation_attachment_and_top_do_not_count():
    # "." deleted on both sides: VP spans (1,2) either way; TOP is deleted: S, NP, VP = 3 each
    gold = "(TOP (S (NP (NNP John)) (VP (VBZ runs)) (. .)))"
    test = "(TOP (S (NP (NNP John)) (VP (VBZ runs) (. .))))"
    s, res = one(gold, test)
    assert (s.match, s.gold, s.test) == (3, 3, 3)
    assert res.all.f1 == 100 and res.all.complete_match == 100


def test_a_constituent_over_punctuation_only_is_dropped():
    # (PRN (, ,)) spans no kept word: dropped; gold and test then agree on S, NP, VP
    gold = "(S (NP (NNP Ann)) (PRN (, ,)) (VP (VBD ran)))"
    test = "(S (NP (NNP Ann)) (, ,) (VP (VBD ran)))"
    s, _ = one(gold, test)
    assert (s.match, s.gold, s.test) == (3, 3, 3)


def test_advp_and_prt_are_one_label_and_function_tags_are_trimmed():
    gold = "(S (NP-SBJ (PRP He)) (VP (VBD gave) (PRT (RP up))))"
    test = "(S (NP (PRP He)) (VP (VBD gave) (ADVP=1 (RP up))))"
    s, _ = one(gold, test)
    assert (s.match, s.gold, s.test) == (4, 4, 4)
    # with no EQ_LABEL, PRT and ADVP differ: 3 of 4
    s, _ = one(gold, test, EvalbParams(delete_labels=COLLINS.delete_labels))
    assert s.match == 3


def test_repeated_brackets_count_as_often_as_they_occur():
    # gold S(0,2) NP(0,1) NP(0,1) VP(1,2): 4; test S, NP(0,1), VP: 3; one NP(0,1) matches once
    gold = "(S (NP (NP (NNS dogs))) (VP (VBP bark)))"
    test = "(S (NP (NNS dogs)) (VP (VBP bark)))"
    s, res = one(gold, test)
    assert (s.match, s.gold, s.test) == (3, 4, 3)
    assert res.all.recall == pytest.approx(75) and res.all.precision == 100
    s, res = one(test, gold)  # the other way round: precision 3/4
    assert (s.match, s.gold, s.test) == (3, 3, 4) and res.all.precision == pytest.approx(75)


def test_unlabelled_outer_bracket_counts_as_a_constituent():
    # "( (S ...))" has a bracket labelled "" over the sentence: gold 4 (incl. it), test 3
    s, _ = one("( (S (NP (DT a)) (VP (VBZ b))))", "(S (NP (DT a)) (VP (VBZ b)))")
    assert (s.match, s.gold, s.test) == (3, 4, 3)


def test_crossing_brackets():
    # gold A(0,2); test C(1,3) crosses it: 1 crossing; S(0,3) matches
    gold = "(S (A (X a) (X b)) (X c))"
    test = "(S (X a) (C (X b) (X c)))"
    s, res = one(gold, test)
    assert (s.match, s.gold, s.test, s.crossing) == (1, 2, 2, 1)
    assert res.all.average_crossing == 1 and res.all.no_crossing == 0


def test_corpus_totals_sum_brackets_over_sentences():
    a = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (PP (IN on) (NP (DT the) (NN mat))) (. .))"
    b_gold = "(S (NP (NP (NNS dogs))) (VP (VBP bark)))"
    b_test = "(S (NP (NNS dogs)) (VP (VBP bark)))"
    res = evalb([CAT, b_gold], [a, b_test])
    # matches 4 + 3 = 7, gold 5 + 4 = 9, test 5 + 3 = 8 (not the mean of per-sentence figures)
    assert (res.all.match, res.all.gold, res.all.test) == (7, 9, 8)
    r, p = 700 / 9, 700 / 8
    assert res.all.f1 == pytest.approx(2 * p * r / (p + r))
    assert res.all.tagging_accuracy == 100


def test_length_cutoff_ignores_traces_but_counts_punctuation():
    params = EvalbParams(COLLINS.delete_labels, COLLINS.delete_for_length, COLLINS.eq_labels, cutoff_len=3)
    short = "(S (NP (-NONE- *)) (NP (DT a)) (VP (VBZ b)) (. .))"  # a, b, . : length 3
    long = "(S (NP (DT a)) (VP (VBZ b) (NP (NN c))) (. .))"  # a, b, c, . : length 4
    res = evalb([short, long], [short, long], params)
    assert [s.length for s in res.sentences] == [3, 4]
    assert res.short.sentences == 1 and res.all.sentences == 2
    # the trace is deleted too: S(0,2) NP(0,1) VP(1,2); "(NP (-NONE- *))" spans nothing
    assert res.short.gold == 3


def test_skipped_and_error_sentences_leave_the_totals():
    good = "(S (NP (DT a)) (VP (VBZ b)))"
    res = evalb([good, good, good, good],
                [good, "", "(S (NP (DT a)) (VP (VBZ c)))", "(S (NP (DT a)) (VP (VBZ b) (NN c)))"])
    assert [s.status for s in res.sentences] == ["ok", "skip", "error", "error"]
    assert (res.all.valid, res.all.skipped, res.all.errors) == (1, 1, 2)
    assert res.all.f1 == 100 and res.all.gold == 3
    bad = evalb([good], ["(S (NP (DT a) (VP (VBZ b)))"])  # unbalanced test line: an error
    assert bad.sentences[0].status == "error"
    with pytest.raises(UserError, match="gold line 1"):
        evalb(["(S (NP a)"], [good])
    with pytest.raises(UserError, match="1 trees but test has 2"):
        evalb([good], [good, good])


def test_collins_prm_file_reads_as_the_built_in_settings(tmp_path):
    prm = tmp_path / "COLLINS.prm"
    prm.write_text("# comment\nDEBUG 0\nMAX_ERROR 10\nCUTOFF_LEN 40\nLABELED 1\nDELETE_LABEL TOP\n"
                   "DELETE_LABEL -NONE-\nDELETE_LABEL ,\nDELETE_LABEL :\nDELETE_LABEL ``\n"
                   "DELETE_LABEL ''\nDELETE_LABEL .\nDELETE_LABEL_FOR_LENGTH -NONE-\n"
                   "EQ_LABEL ADVP PRT\n")
    assert read_params(prm) == COLLINS
    (tmp_path / "bad.prm").write_text("DELETE_LABEL TOP\nNONSENSE 1\n")
    with pytest.raises(UserError, match="bad.prm:2"):
        read_params(tmp_path / "bad.prm")


def test_unlabelled_scoring():
    gold = "(S (NP (DT a)) (VP (VBZ b) (NP (NN c))))"
    test = "(S (NP (DT a)) (XP (VBZ b) (YP (NN c))))"
    s, _ = one(gold, test, EvalbParams(COLLINS.delete_labels, labeled=False))
    assert s.match == 4
    s, _ = one(gold, test)
    assert s.match == 2


def test_retag_from_gold_gives_the_words_the_gold_tags():
    gold = "(S (NP (-NONE- *)) (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"
    test = "(S (NP (XX The) (XX cat)) (VP (VBN sat) (XX .)))"
    assert retag_from_gold(test, gold) == "(S (NP (DT The) (NN cat)) (VP (VBD sat) (. .)))"
    assert retag_from_gold("(S (XX a))", gold) == "(S (XX a))"  # word counts differ: unchanged
    # untagged, "." counts as a word and the lengths differ (an error); retagged, it is deleted
    assert evalb([gold], [test]).all.errors == 1
    assert evalb([gold], [retag_from_gold(test, gold)]).all.f1 == 100
