"""Reading parallel corpora (plain, gzip, TSV, SGML), their errors, and the training-data filters."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from aiayn.data.corpus import (
    ParallelSource,
    empty_pairs,
    find_parallel,
    length_filters,
    read_lines,
    read_parallel,
    read_sgml,
    read_text,
    read_tsv,
    unescape_xml,
)
from aiayn.errors import UserError


def write(path, data: bytes | str, gz: bool = False):
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if gz:
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def test_lines_strip_only_newline_and_cr(tmp_path):
    text = "  lead and trail  \r\nÜber\tden Fluss\r\nmid\rline\nsep\u2028kept\n\n last"
    p = write(tmp_path / "a.txt", text)
    assert read_lines(p) == ["  lead and trail  ", "Über\tden Fluss", "mid\rline", "sep\u2028kept", "", " last"]


def test_final_newline_and_empty_file(tmp_path):
    assert read_lines(write(tmp_path / "a", "x\ny\n")) == ["x", "y"]
    assert read_lines(write(tmp_path / "b", "")) == []
    assert read_lines(write(tmp_path / "c", "\n")) == [""]


def test_bom_dropped_only_at_start(tmp_path):
    p = write(tmp_path / "a", "\ufeffone\n\ufefftwo\n")
    assert read_lines(p) == ["one", "\ufefftwo"]


def test_gzip_is_recognised_by_content(tmp_path):
    lines = ["Grüße", "zwei Männer", "a.b,c!"]
    plain = write(tmp_path / "x.de", "\n".join(lines) + "\n")
    gz = write(tmp_path / "x.de.gz", "\n".join(lines) + "\n", gz=True)
    gz_no_suffix = write(tmp_path / "y.de", "\n".join(lines) + "\n", gz=True)
    assert read_lines(plain) == read_lines(gz) == read_lines(gz_no_suffix) == lines


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="nope.en: no such file"):
        read_lines(tmp_path / "nope.en")


def test_damaged_gzip(tmp_path):
    p = write(tmp_path / "x.gz", gzip.compress(b"hello\n" * 100)[:30])
    with pytest.raises(UserError, match="x.gz: damaged gzip"):
        read_lines(p)


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, gz):
    p = write(tmp_path / "bad.de", b"ok\nstill ok\nbroken \xff here\n", gz=gz)
    with pytest.raises(UserError, match=r"bad\.de:3: invalid UTF-8 \(byte 0xff at column 8\)"):
        read_lines(p)


def test_line_count_mismatch_names_both(tmp_path):
    s = write(tmp_path / "t.en", "a\nb\nc\n")
    t = write(tmp_path / "t.de", "a\nb\n")
    with pytest.raises(UserError) as e:
        read_parallel(s, t)
    msg = str(e.value)
    assert "t.en has 3 lines" in msg and "t.de has 2" in msg and "\n" not in msg


def test_tsv(tmp_path):
    p = write(tmp_path / "d.tsv", "Hello\tHallo\n\tleer\nA b\tC d\n")
    assert read_tsv(p) == (["Hello", "", "A b"], ["Hallo", "leer", "C d"])
    bad = write(tmp_path / "bad.tsv", "ok\tgut\ntwo\ttabs\there\n")
    with pytest.raises(UserError, match=r"bad\.tsv:2: expected source<TAB>target, found 2 tabs"):
        read_tsv(bad)


def test_sgml(tmp_path):
    sgm = (
        '<srcset setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1" genre="news">\n'
        '<p>\n<seg id="1">Tom &amp; Jerry say &quot;hi&quot; &lt;b&gt;</seg>\n'
        '<seg id="2"> Über &#252;ber &#xFC; &apos;x&apos; &nbsp; </seg>\n</p>\n</doc>\n</srcset>\n'
    )
    p = write(tmp_path / "newstest.de.sgm", sgm)
    expected = ['Tom & Jerry say "hi" <b>', " Über über ü 'x' &nbsp; "]
    assert read_sgml(p) == expected
    assert read_text(p) == expected  # dispatch by suffix
    gz = write(tmp_path / "newstest.de.sgm.gz", sgm, gz=True)
    assert read_text(gz) == expected
    with pytest.raises(UserError, match="no <seg> elements"):
        read_sgml(write(tmp_path / "empty.sgm", "<srcset></srcset>\n"))


def test_unescape_leaves_unknown_and_invalid():
    assert unescape_xml("a &copy; &#0; &#xD800; &amp;amp;") == "a &copy; &#0; &#xD800; &amp;"


def test_find_parallel_prefix_tsv_and_pair(tmp_path):
    write(tmp_path / "train.en", "a\n")
    write(tmp_path / "train.de.gz", "b\n", gz=True)
    src = find_parallel([str(tmp_path / "train")], "en", "de")
    assert src == ParallelSource(tmp_path / "train.en", tmp_path / "train.de.gz")
    assert src.read() == (["a"], ["b"])
    tsv = write(tmp_path / "x.tsv", "a\tb\n")
    assert find_parallel([str(tsv)], "en", "de") == ParallelSource(tsv)
    pair = find_parallel([str(tmp_path / "train.en"), str(tmp_path / "train.de.gz")], "en", "de")
    assert pair.tgt == tmp_path / "train.de.gz"


def test_find_parallel_errors(tmp_path):
    write(tmp_path / "train.en", "a\n")
    with pytest.raises(UserError, match="missing de side"):
        find_parallel([str(tmp_path / "train")], "en", "de")
    write(tmp_path / "train.de", "a\n")
    write(tmp_path / "train.de.gz", "a\n", gz=True)
    with pytest.raises(UserError, match="ambiguous de side"):
        find_parallel([str(tmp_path / "train")], "en", "de")
    with pytest.raises(UserError, match="no such file"):
        find_parallel([str(tmp_path / "train.en"), str(tmp_path / "nope")], "en", "de")
    with pytest.raises(UserError, match="single file"):
        find_parallel([str(tmp_path / "train.en")], "en", "de")


def test_empty_pairs():
    src = ["a", "", "  ", "b", "c"]
    tgt = ["x", "y", "z", "\t", "w"]
    assert empty_pairs(src, tgt).tolist() == [False, True, True, True, False]


def test_length_filters_against_reference():
    rng = np.random.default_rng(0)
    s = rng.integers(1, 60, 500)
    t = rng.integers(1, 60, 500)
    too_long, bad_ratio = length_filters(s, t, max_len=40, max_ratio=3.0)
    for i in range(500):
        assert too_long[i] == (s[i] > 40 or t[i] > 40)
        assert bad_ratio[i] == (max(s[i], t[i]) / min(s[i], t[i]) > 3.0)
    off_long, off_ratio = length_filters(s, t, max_len=0, max_ratio=0)
    assert not off_long.any() and not off_ratio.any()


# --- streaming (what `aiayn prepare` reads corpora of any size with) ----------------------------

from aiayn.data.corpus import iter_line_blocks  # noqa: E402

TRICKY = "\ufeffeins\r\nzwei\n\n  drei \rx\nÜber\u2028vier\nfünf ohne Zeilenende"


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("block", [1, 3, 7, 64, 1 << 20])
def test_streamed_lines_equal_the_whole_file(tmp_path, gz, block):
    p = write(tmp_path / "t.txt", TRICKY, gz=gz)
    blocks = list(iter_line_blocks(p, block_bytes=block))
    assert all(blocks)  # no empty blocks
    assert [line for b in blocks for line in b] == read_lines(p) == [
        "eins", "zwei", "", "  drei \rx", "Über\u2028vier", "fünf ohne Zeilenende"]


@pytest.mark.parametrize("block", [4, 1 << 20])
def test_streamed_errors_name_the_right_line(tmp_path, block):
    p = write(tmp_path / "bad.de", b"a\nbb\nccc\ndddd\nee \xff\n")
    with pytest.raises(UserError, match=r"bad\.de:5: invalid UTF-8 \(byte 0xff at column 4\)"):
        list(iter_line_blocks(p, block_bytes=block))
    damaged = write(tmp_path / "x.gz", gzip.compress(b"hello\n" * 1000)[:30])
    with pytest.raises(UserError, match="damaged gzip"):
        list(iter_line_blocks(damaged, block_bytes=block))


@pytest.mark.parametrize("size", [1, 2, 5, 100])
def test_pairs_stream_in_chunks(tmp_path, size):
    src = [f"s{i}" for i in range(11)]
    tgt = [f"t{i}" for i in range(11)]
    pair = ParallelSource(write(tmp_path / "a.en", "\n".join(src) + "\n"),
                          write(tmp_path / "a.de", "\n".join(tgt) + "\n", gz=True))
    tsv = ParallelSource(write(tmp_path / "a.tsv", "".join(f"{s}\t{t}\n" for s, t in zip(src, tgt))))
    for source in (pair, tsv):
        chunks = list(source.iter_chunks(size))
        assert all(len(s) == len(t) <= size for s, t in chunks)
        assert ([x for s, _ in chunks for x in s], [x for _, t in chunks for x in t]) == (src, tgt)
    # a mismatch is found where the shorter side ends, and both whole counts are named
    short = ParallelSource(pair.src, write(tmp_path / "b.de", "\n".join(tgt[:4]) + "\n"))
    with pytest.raises(UserError, match=r"a\.en has 11 lines, .*b\.de has 4"):
        list(short.iter_chunks(size))


def test_ready_groups_end_when_no_more_input_is_ready():
    """From a pipe: full groups while lines are waiting, a short group when the writer pauses,
    a last line without a newline at the end; the same lines `read_lines` would give."""
    import os
    import threading

    from aiayn.data.corpus import iter_ready_groups

    r, w = os.pipe()
    os.write(w, "\ufeffone\ntwo\r\nthree\n".encode())
    groups = iter_ready_groups(r, "<pipe>", most=2, wait=0.05)
    assert next(groups) == ["one", "two"]
    assert next(groups) == ["three"]  # nothing more is ready: the group ends short

    def write_rest():
        os.write(w, "vier\nfü".encode())
        os.write(w, "nf".encode())  # a character split between two writes
        os.close(w)

    writer = threading.Thread(target=write_rest)
    writer.start()
    rest = [line for group in groups for line in group]
    writer.join()
    assert rest == ["vier", "fünf"]
    os.close(r)


def test_ready_groups_name_the_line_of_bad_bytes():
    import os

    from aiayn.data.corpus import iter_ready_groups

    r, w = os.pipe()
    os.write(w, b"fine\nalso fine\nbroken \xff\n")
    os.close(w)
    with pytest.raises(UserError, match=r"<stdin>:3: invalid UTF-8"):
        list(iter_ready_groups(r, "<stdin>", most=10))
    os.close(r)


def test_input_groups_of_a_file_are_its_lines(tmp_path):
    import gzip

    from aiayn.commands.common import input_groups
    from aiayn.data.corpus import read_lines

    path = tmp_path / "big.txt.gz"
    lines = [f"line {i} " + "x" * (i % 7) for i in range(1000)]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    groups = list(input_groups(str(path), 64))
    assert [len(g) for g in groups] == [64] * 15 + [40]
    assert [x for g in groups for x in g] == lines == read_lines(path)
    with pytest.raises(UserError, match="missing.txt"):
        input_groups(str(tmp_path / "missing.txt"), 64)
