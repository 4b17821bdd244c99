"""BLEU core, tokenized BLEU (paper and Multi30k conventions), and the sacrebleu wrappers."""

from __future__ import annotations

import math
import random
import re
import shutil
import subprocess
from collections import Counter

import pytest
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from aiayn.evaluation import (
    chrf,
    corpus_bleu_from_tokens,
    multi30k_bleu,
    sacre_bleu,
    split_hyphen_compounds,
    tokenized_bleu,
)


def reference_bleu(hyps: list[list[str]], refs: list[list[str]]) -> float:
    """The paper's formula written out plainly: clipped n-gram counts summed over the corpus."""
    log_p = 0.0
    for n in range(1, 5):
        matched = total = 0
        for h, r in zip(hyps, refs):
            hc = Counter(tuple(h[i:i + n]) for i in range(len(h) - n + 1))
            rc = Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matched += sum((hc & rc).values())  # Counter & = elementwise min: the clipping
            total += sum(hc.values())
        if matched == 0:
            return 0.0
        log_p += 0.25 * math.log(matched / total)
    c = sum(map(len, hyps))
    r = sum(map(len, refs))
    bp = 1.0 if c > r else math.exp(1 - r / c)
    return 100 * bp * math.exp(log_p)


CORPUS_H = ["the the the cat sat on the mat", "a dog runs in the park today", "it is raining"]
CORPUS_R = ["the cat sat on the mat", "a dog runs in a park today and then", "it is raining hard now"]


def test_core_matches_hand_computation_with_clipping_and_brevity():
    h = [s.split() for s in CORPUS_H]
    r = [s.split() for s in CORPUS_R]
    res = corpus_bleu_from_tokens(h, r)
    assert res.score == pytest.approx(reference_bleu(h, r), abs=1e-9)
    # clipping: "the" occurs 4 times in the first hypothesis but only twice in its reference
    unigram_matches = sum(sum((Counter(a) & Counter(b)).values()) for a, b in zip(h, r))
    assert res.counts[0] == unigram_matches
    assert res.counts[0] < res.totals[0]
    # brevity: the corpus is shorter than its references (c < r), so BP < 1
    c, rl = sum(map(len, h)), sum(map(len, r))
    assert (res.sys_len, res.ref_len) == (c, rl) and c < rl
    assert res.bp == pytest.approx(math.exp(1 - rl / c))


def _random_corpus(rng: random.Random, n: int) -> tuple[list[str], list[str]]:
    vocab = "a b c d e f".split()  # small vocabulary so that 4-grams match
    hyps, refs = [], []
    for _ in range(n):
        r = [rng.choice(vocab) for _ in range(rng.randint(0, 12))]
        h = [t if rng.random() < 0.7 else rng.choice(vocab) for t in r]
        h = h[: rng.randint(0, len(h))] if rng.random() < 0.3 else h + [rng.choice(vocab)] * rng.randint(0, 3)
        hyps.append(" ".join(h))
        refs.append(" ".join(r))
    return hyps, refs


@pytest.mark.parametrize("seed", range(8))
def test_core_agrees_with_sacrebleu_on_pretokenized_text(seed):
    hyps, refs = _random_corpus(random.Random(seed), 20)
    ours = corpus_bleu_from_tokens([h.split() for h in hyps], [r.split() for r in refs])
    theirs = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(hyps, [refs])
    assert ours.score == pytest.approx(theirs.score, abs=1e-6)
    assert list(ours.counts) == list(theirs.counts)
    assert list(ours.totals) == list(theirs.totals)
    assert ours.bp == pytest.approx(theirs.bp, abs=1e-12)
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)


def test_core_edge_cases():
    assert corpus_bleu_from_tokens([], []).score == 0.0
    assert corpus_bleu_from_tokens([[]], [["a", "b"]]).score == 0.0
    # no 4-gram can match a 3-token corpus: 0 without smoothing, as multi-bleu.perl
    assert corpus_bleu_from_tokens([["a", "b", "c"]], [["a", "b", "c"]]).score == 0.0
    same = "one two three four five".split()
    assert corpus_bleu_from_tokens([same], [same]).score == pytest.approx(100.0)
    longer = corpus_bleu_from_tokens([same + ["six"]], [same])
    assert longer.bp == 1.0  # no penalty for a longer hypothesis
    with pytest.raises(ValueError):
        corpus_bleu_from_tokens([same], [])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Kreuz-Fahrt", "Kreuz ##AT##-##AT## Fahrt"),
        ("die E-Mail-Adresse", "die E ##AT##-##AT## Mail ##AT##-##AT## Adresse"),
        ("kostet -5 Euro", "kostet -5 Euro"),
        ("Hunde - und Katzen", "Hunde - und Katzen"),
        ("Ende -", "Ende -"),
    ],
)
def test_compound_splitting(text, expected):
    assert split_hyphen_compounds(text) == expected


@pytest.mark.skipif(shutil.which("perl") is None, reason="perl not installed")
def test_compound_splitting_matches_the_tensor2tensor_perl_rule():
    lines = ["a-b-c Kreuz-Fahrt", "x-5 (-a) a--b -- ---", "3-4 - -5 Nord-Ost-Passage", "über-all"]
    perl = subprocess.run(
        ["perl", "-CSD", "-ple", r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert [split_hyphen_compounds(s) for s in lines] == perl


def test_tokenized_bleu_is_moses_plus_splitting_plus_core():
    refs = ["Die Kreuz-Fahrt war schön, sagte er.", "Ein Mann mit einem Hut steht am Straßen-Rand."]
    hyps = ["Die Kreuz-Reise war schön, sagte er.", "Ein Mann mit Hut steht am Straßen-Rand."]
    tok = MosesTokenizer(lang="de")

    def pipeline(s: str) -> str:  # the shell pipeline: tokenizer.perl | the t2t perl rule
        return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", " ".join(tok.tokenize(s, escape=False)))

    theirs = BLEU(tokenize="none", smooth_method="none", force=True).corpus_score(
        [pipeline(h) for h in hyps], [[pipeline(r) for r in refs]])
    ours = tokenized_bleu(hyps, refs, lang="de")
    assert ours.score == pytest.approx(theirs.score, abs=1e-6)
    assert "compound:atat" in ours.signature
    # splitting gives partial credit inside compounds: "Kreuz" and the hyphen now match
    unsplit = tokenized_bleu(hyps, refs, lang="de", split_compounds=False)
    # +2 in sentence 1 (Kreuz, the hyphen); +2 in sentence 2 (one matching token becomes three)
    assert ours.counts[0] - unsplit.counts[0] == 4
    assert ours.score > unsplit.score
    # English is not split by default (tensor2tensor splits for EN-DE only)
    assert "compound:no" in tokenized_bleu(hyps, refs, lang="en").signature


def test_multi30k_bleu_ignores_case_and_normalises_punctuation():
    ref = ["Ein Hund rennt durch den Schnee und bellt „laut“."]
    hyp = ['ein hund rennt durch den schnee und bellt "laut".']
    assert multi30k_bleu(hyp, ref).score == pytest.approx(100.0)
    assert multi30k_bleu(hyp, ref).score == tokenized_bleu(
        hyp, ref, lowercase=True, normalize_punct=True, split_compounds=False).score
    assert tokenized_bleu(hyp, ref).score < 100.0  # the paper style is case-sensitive
    norm, tok = MosesPunctNormalizer(lang="de"), MosesTokenizer(lang="de")
    assert tok.tokenize(norm.normalize(hyp[0].lower()), escape=False) == \
        tok.tokenize(norm.normalize(ref[0].lower()), escape=False)


@pytest.mark.parametrize("lowercase", [False, True])
def test_sacre_bleu_and_chrf_match_the_library(lowercase):
    hyps = ["The cat sat on the mat.", "Hello, World!", "It's raining cats and dogs today."]
    refs = ["The cat is sitting on the mat.", "hello world!", "It is raining cats and dogs today."]
    ours = sacre_bleu(hyps, refs, lowercase=lowercase)
    lib = BLEU(lowercase=lowercase)
    theirs = lib.corpus_score(hyps, [refs])
    assert ours.score == pytest.approx(theirs.score, abs=1e-9)
    assert list(ours.precisions) == pytest.approx(theirs.precisions)
    assert (ours.bp, ours.ratio, ours.sys_len, ours.ref_len) == pytest.approx(
        (theirs.bp, theirs.ratio, theirs.sys_len, theirs.ref_len))
    assert ours.signature == str(lib.get_signature())
    assert "tok:13a" in ours.signature and ("case:lc" if lowercase else "case:mixed") in ours.signature

    c = chrf(hyps, refs, lowercase=lowercase)
    clib = CHRF(lowercase=lowercase)
    assert c.score == pytest.approx(clib.corpus_score(hyps, [refs]).score, abs=1e-9)
    assert c.signature == str(clib.get_signature()) and c.name == "chrF2"


def test_empty_corpus_scores_zero_everywhere():
    assert sacre_bleu([], []).score == 0.0
    assert "tok:13a" in sacre_bleu([], []).signature
    assert chrf([], []).score == 0.0
    assert tokenized_bleu([], []).score == 0.0
    assert multi30k_bleu([], []).score == 0.0


def test_wrappers_reject_mismatched_lengths():
    for fn in (sacre_bleu, chrf, tokenized_bleu):
        with pytest.raises(ValueError):
            fn(["a"], [])
