"""Property-based fuzzing of the corpus readers (hypothesis): random bytes, text in several
encodings with every kind of line ending, TSV and SGML files, gzip files cut short or damaged.
Every input either prepares into a dataset that loads, or ends with a one-line UserError; no other
exception. About half the inputs are well-formed corpora (UTF-8, with or without a byte order
mark, gzipped or not, equal line counts, LF or CRLF), which must prepare: the fuzzer reaches the
end of preparation, not only its errors. Bounded (a fixed number of examples, derandomized) so it
stays fast and repeatable."""

from __future__ import annotations

import gzip
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.data.corpus import find_parallel
from aiayn.data.dataset import ParallelDataset
from aiayn.data.prepare import PrepareOptions, prepare_dataset
from aiayn.errors import UserError

# letters, digits, space, tab, CR, LF, NUL, BOM, a line separator, non-Latin letters, an emoji, a
# combining accent, a lone surrogate's neighbours and other odd code points
ALPHABET = st.sampled_from(list("abcdeXYZ019 \t\r\n\0") + ["\ufeff", "\u2028", "ä", "ß", "ж", "中",
                                                           "😀", "\u0301", "\ud7ff", "\ue000", "\x85"])
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "latin-1", "cp1252"]


@st.composite
def text_file(draw) -> bytes:
    lines = draw(st.lists(st.text(ALPHABET, max_size=12), max_size=12))
    ending = draw(st.sampled_from(["\n", "\r\n", "\r", ""]))
    text = ending.join(lines) + draw(st.sampled_from(["", "\n", "\r\n"]))
    return text.encode(draw(st.sampled_from(ENCODINGS)), errors="replace")


@st.composite
def damaged(draw, content) -> bytes:
    """`content`, possibly gzipped and then cut short or with a byte changed."""
    data = draw(content)
    if not draw(st.booleans()):
        return data
    data = bytearray(gzip.compress(data))
    how = draw(st.sampled_from(["whole", "cut", "flip"]))
    if how == "cut":
        del data[draw(st.integers(0, len(data) - 1)):]
    elif how == "flip":
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= draw(st.integers(1, 255))
    return bytes(data)


def sgml(lines: list[str]) -> bytes:
    return ("<doc>\n" + "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(lines)) + "</doc>\n").encode()


FILE = damaged(st.one_of(st.binary(max_size=200), text_file(),
                         st.lists(st.text(ALPHABET, max_size=8), max_size=6).map(sgml)))

# The text of a well-formed line: no tab, CR, LF or NUL, nothing SGML would read as markup; odd
# code points (a line separator, NEL, a BOM inside a line) are text, and a letter in every line
# keeps it from being cleaned away as empty.
LINE = st.tuples(st.text(st.sampled_from(list("abcXYZ019 .,'") + ["\ufeff", "\u2028", "\x85", "ä",
                                                                    "ж", "中", "😀", "\u0301"]),
                         max_size=10),
                 st.sampled_from(list("abcdefXYZäжß中"))).map(lambda t: t[0] + t[1])


MODELS = [("char", 40), ("bpe", 300), ("word", 12), ("unigram", 20)]
# vocabularies that fit any well-formed corpus of LINEs: at most 40 characters, and a word
# vocabulary no larger than the smallest corpus's (others refuse a corpus too small or too varied
# for their size, in one line)
FITTING = [("char", 40), ("word", 5)]


@st.composite
def corpus(draw) -> tuple[str, bytes, bytes, tuple[str, int], bool]:
    """(kind, source file, target file, vocabulary, well-formed): half well-formed corpora with a
    vocabulary that fits them, half anything."""
    kind = draw(st.sampled_from(["pair", "tsv", "sgm"]))
    if draw(st.booleans()):
        return kind, draw(FILE), draw(FILE), draw(st.sampled_from(MODELS)), False
    pairs = draw(st.lists(st.tuples(LINE, LINE), min_size=1, max_size=10))
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig"]))
    squeeze = draw(st.booleans())

    def encode(lines: list[str]) -> bytes:
        if kind == "sgm":
            data = sgml(lines)
        else:
            data = (ending.join(lines) + draw(st.sampled_from(["", ending]))).encode(encoding)
        return gzip.compress(data) if squeeze else data

    model = draw(st.sampled_from(FITTING))
    if kind == "tsv":
        return kind, encode([f"{a}\t{b}" for a, b in pairs]), b"", model, True
    return kind, encode([a for a, _ in pairs]), encode([b for _, b in pairs]), model, True


def test_every_corpus_prepares_or_ends_with_one_line():
    outcomes: Counter[str] = Counter()

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=corpus())
    def prepares_or_ends_with_one_line(case):
        kind, src, tgt, model, well_formed = case
        outcome = prepare_one(kind, src, tgt, model)
        assert outcome == "prepared" or not well_formed, f"a well-formed {kind} corpus: {outcome}"
        outcomes[outcome if outcome == "prepared" else "refused"] += 1

    prepares_or_ends_with_one_line()
    # both ends were reached often: whole datasets, and one-line refusals of damaged input
    total = sum(outcomes.values())
    assert outcomes["prepared"] >= total / 3 and outcomes["refused"] >= total / 4, outcomes


def prepare_one(kind: str, src: bytes, tgt: bytes, model: tuple[str, int]) -> str:
    """Prepare the corpus of `kind` made of `src` and `tgt` (tsv: `src` alone): "prepared" once the
    dataset loads and every pair decodes, else the one-line UserError's message; anything else
    raises."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        if kind == "tsv":
            (root / "c.tsv").write_bytes(src)
            values = [str(root / "c.tsv")]
        else:
            ext = ".sgm" if kind == "sgm" else ""
            (root / f"c.xx{ext}").write_bytes(src)
            (root / f"c.yy{ext}").write_bytes(tgt)
            values = [str(root / "c")]
        try:
            source = find_parallel(values, "xx", "yy")
            result = prepare_dataset(root / "ds", {"train": source},
                                     PrepareOptions("xx", "yy", vocab_size=model[1], model_type=model[0]))
        except UserError as e:
            assert str(e) and "\n" not in str(e), repr(str(e))
            return str(e)
        ds = ParallelDataset(result.out_dir, "train")
        assert len(ds) == result.manifest["splits"]["train"]["pairs"] > 0
        for i in range(len(ds)):
            ds.text(i)
        return "prepared"
