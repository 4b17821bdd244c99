"""Encoding at scale: the vocabulary sample (uniform, seeded, chunking-invariant), chunk encoding
against one-sentence-at-a-time encoding, and worker processes against this process."""

from __future__ import annotations

import numpy as np
import pytest

from aiayn.data.encode import ChunkEncoder, PairReservoir, clean, encode_chunk
from aiayn.data.tokenizer import Tokenizer

WORDS = "the a man woman dog walks runs over street house big small red blue green".split()


def corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    src = [" ".join(rng.choice(WORDS, rng.integers(1, 12))) for _ in range(n)]
    return src, [s.upper() for s in src]


def sample(size, src, tgt, chunk, seed=1):
    r = PairReservoir(size, seed)
    for i in range(0, len(src), chunk):
        r.add(src[i:i + chunk], tgt[i:i + chunk])
    return r.pairs()


def test_a_small_corpus_comes_back_whole_and_in_order():
    src, tgt = corpus(50)
    assert sample(50, src, tgt, 7) == (src, tgt)
    assert sample(None, src, tgt, 7) == (src, tgt)


def test_the_sample_does_not_depend_on_how_the_stream_is_chunked():
    src, tgt = corpus(300)
    ref = sample(40, src, tgt, 1)
    for chunk in (3, 64, 300):
        assert sample(40, src, tgt, chunk) == ref
    s, t = ref
    assert len(s) == 40 and all(b == a.upper() for a, b in zip(s, t))  # pairs stay together
    rest = iter(src)
    assert all(x in rest for x in s)  # corpus order: a subsequence of the corpus (duplicates allowed)
    assert sample(40, src, tgt, 8, seed=2) != ref


def test_every_pair_is_equally_likely_to_be_drawn():
    n, k, trials = 20, 5, 3000
    src = [str(i) for i in range(n)]
    counts = np.zeros(n)
    for seed in range(trials):
        for x in sample(k, src, src, 6, seed=seed)[0]:
            counts[int(x)] += 1
    freq = counts / trials  # each should be k/n = 0.25 (binomial s.d. 0.008)
    assert np.abs(freq - k / n).max() < 0.04, freq


@pytest.fixture(scope="module")
def tok():
    src, tgt = corpus(400)
    return Tokenizer.train(src + tgt, 120, "bpe", byte_fallback=False)  # 256 byte pieces would not fit


def test_chunk_encoding_equals_one_sentence_at_a_time(tok):
    src, tgt = corpus(60, seed=3)
    src[5], tgt[9] = "   ", ""
    enc = encode_chunk(tok, tok, src, tgt)
    for side, lines in (("src", src), ("tgt", tgt)):
        ids, lengths = getattr(enc, f"{side}_ids"), getattr(enc, f"{side}_len")
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(lines))] == [tok.encode(x) for x in lines]
        assert ids.dtype == np.uint16 and lengths.dtype == np.int32
    assert np.flatnonzero(enc.empty).tolist() == [5, 9]


def test_clean_drops_by_the_first_reason(tok):
    src = ["a man", "", "the dog " * 20, "a", "red blue green", "a big house", "a\0dog", "\0"]
    tgt = ["A MAN", "X", "THE DOG", "A RED " * 3, "", "A BIG HOUSE", "A DOG", " "]
    kept, counts = clean(encode_chunk(tok, tok, src, tgt), max_len=30, max_ratio=4)
    reasons = []  # the reference: first reason per pair, from one-at-a-time lengths
    for s, t in zip(src, tgt):
        ls, lt = len(tok.encode(s)), len(tok.encode(t))
        reasons.append("empty" if not s.strip() or not t.strip() else "nul" if "\0" in s + t
                       else "too_long" if max(ls, lt) > 30
                       else "length_ratio" if max(ls, lt) > 4 * min(ls, lt) else None)
    assert reasons[1] == reasons[4] == reasons[7] == "empty" and reasons[2] == "too_long"
    assert reasons[3] == "length_ratio" and reasons[6] == "nul"
    assert counts == {r: reasons.count(r) for r in ("empty", "nul", "too_long", "length_ratio")}
    keep = [i for i, r in enumerate(reasons) if r is None]
    ref = encode_chunk(tok, tok, [src[i] for i in keep], [tgt[i] for i in keep])
    assert kept.src_ids.tolist() == ref.src_ids.tolist() and kept.tgt_ids.tolist() == ref.tgt_ids.tolist()
    assert kept.tgt_len.tolist() == ref.tgt_len.tolist()


def test_worker_processes_give_what_this_process_gives(tok):
    src, tgt = corpus(230, seed=4)
    chunks = [(src[i:i + 25], tgt[i:i + 25]) for i in range(0, 230, 25)]
    with ChunkEncoder(tok, tok, 0) as here:
        ref = list(here.map(iter(chunks)))
    with ChunkEncoder(tok, tok, 2) as pool:
        got = list(pool.map(iter(chunks)))
    assert len(got) == len(ref) == 10
    for a, b in zip(got, ref):
        for f in ("src_ids", "src_len", "tgt_ids", "tgt_len", "empty", "nul"):
            assert np.array_equal(getattr(a, f), getattr(b, f)) and getattr(a, f).dtype == getattr(b, f).dtype
