"""Reading parallel corpora, and cleaning training pairs.

Formats (all UTF-8; any file may be gzipped, recognised by its magic bytes, not its name):
- a pair of line-aligned files, one sentence per line (`train.en` + `train.de`);
- one tab-separated file, `source<TAB>target` per line (`.tsv`, `.tsv.gz`);
- WMT's SGML test sets (`.sgm`, `.sgml`): the text of each `<seg ...>...</seg>`, in file order,
  with XML character entities unescaped.

Lines are split on "\\n" only (never on a lone "\\r", U+2028 or other Unicode separators) and lose
their trailing "\\n" and one trailing "\\r"; nothing else is changed (no Unicode normalisation, no
whitespace collapsing). The one exception is a UTF-8 byte order mark at the very start of a file,
which is an encoding marker rather than text and is dropped.

Problems are `UserError`s naming the file (and the 1-based line where there is one): a missing
file, invalid UTF-8, line counts that differ, a TSV line without exactly one tab, an SGML file
without segments. Corpora of any size are read streamed (`iter_line_blocks`,
`ParallelSource.iter_chunks`): the same lines and errors, in bounded memory.

Cleaning (`empty_pairs`, `nul_pairs`, `length_filters`) applies to training data only; dev and test sets are
never filtered or reordered, one output line per input line. Lengths for the filters are counted in
subword tokens (not words): the limit then means the same thing as the batcher's token budget, so
`aiayn prepare --max-len N` guarantees every pair fits a batch of `max_tokens >= N + 1`.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Sequence

import numpy as np

from aiayn.checks import reading
from aiayn.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
SGML_SUFFIXES = (".sgm", ".sgml")
TSV_SUFFIXES = (".tsv",)
READ_BLOCK = 1 << 24  # bytes read at a time when streaming a corpus


def read_bytes(path: str | Path) -> bytes:
    """The content of `path`, gunzipped if it is gzip (by magic bytes)."""
    with _open_binary(path) as f:
        return _read_or_fail(f, -1, path)


@contextlib.contextmanager
def _open_binary(path: str | Path) -> Iterator[IO[bytes]]:
    """`path` opened for reading bytes, through a gunzipping stream if it is gzip (by magic bytes)."""
    p = Path(path)
    with reading(p, "a text file"):
        f = open(p, "rb")
    with f:
        gz = f.read(2) == GZIP_MAGIC
        f.seek(0)
        if gz:
            with gzip.GzipFile(fileobj=f) as g:
                yield g
        else:
            yield f


def _read_or_fail(f: IO[bytes], size: int, path: str | Path) -> bytes:
    try:
        return f.read(size)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise UserError(f"{path}: damaged gzip file ({e})") from None


def refuse_binary(data: bytes, path: str | Path, start: int | None = None) -> None:
    """Refuse data that is a quarter NUL bytes or more: it is UTF-16 or binary, whatever it decodes
    to. `start`: where `data` begins in the file, when it is one block of a longer file."""
    nul = data.count(b"\0")
    if nul and nul * 4 >= len(data):
        where = "" if start is None else f" from byte {start}"
        raise UserError(f"{path}: {nul} of its {len(data)} bytes{where} are NUL: UTF-16 or binary "
                        f"data, not UTF-8 text (convert it with iconv -f UTF-16 -t UTF-8)")


def decode_utf8(data: bytes, path: str | Path, first_line: int = 1, strip_bom: bool = True,
                check_binary: bool = True) -> str:
    """Strict UTF-8 decoding; an error names the file, 1-based line and column (`first_line` is
    the line number of `data`'s first line, for blocks of a longer file). A byte order mark at
    the start is dropped when `strip_bom` (the start of a file). Binary data is refused
    (`refuse_binary`) unless the caller has checked it (`check_binary` False)."""
    if check_binary:
        refuse_binary(data, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + first_line
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = data[e.start]
        raise UserError(f"{path}:{line}: invalid UTF-8 (byte 0x{bad:02x} at column {col})") from None
    return text[1:] if strip_bom and text.startswith("\ufeff") else text


def split_lines(text: str) -> list[str]:
    """Split on "\\n" only; drop each line's trailing "\\r"; no empty last line after a final "\\n"."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [s[:-1] if s.endswith("\r") else s for s in lines]
    return lines


class _LineCutter:
    """Whole lines out of bytes that come in blocks: `feed` each block (b"" at the end) and get
    the lines it completes, decoded as `read_lines` decodes them (strict UTF-8; errors name `name`
    and the line; a byte order mark dropped at the very start)."""

    def __init__(self, name: str | Path):
        self.name, self.carry, self.line_no, self.first = name, b"", 1, True

    def feed(self, block: bytes) -> list[str]:
        data = self.carry + block
        # cut after the last newline (a multi-byte UTF-8 character never contains byte 0x0a), or
        # at the end, where a last line may lack its newline
        cut = data.rfind(b"\n") + 1 if block else len(data)
        self.carry = data[cut:]
        if not cut:
            return []
        lines = split_lines(decode_utf8(data[:cut], self.name, self.line_no, self.first,
                                        check_binary=False))
        self.first = False
        self.line_no += len(lines)
        return lines


def iter_line_blocks(path: str | Path, block_bytes: int = READ_BLOCK) -> Iterator[list[str]]:
    """The lines of a plain or gzipped UTF-8 file, streamed in blocks of whole lines (about
    `block_bytes` each): the same lines as `read_lines`, with the same errors, in bounded memory."""
    with _open_binary(path) as f:
        cutter, start = _LineCutter(path), 0
        while True:
            block = _read_or_fail(f, block_bytes, path)
            if block:  # each block read is checked whole (a small file: as `decode_utf8` does)
                refuse_binary(block, path, None if start == 0 and len(block) < block_bytes else start)
                start += len(block)
            lines = cutter.feed(block)
            if lines:
                yield lines
            if not block:
                return


def iter_ready_groups(fd: int, name: str, most: int, wait: float = 0.01) -> Iterator[list[str]]:
    """The lines of the byte stream on file descriptor `fd` (a pipe, a terminal, a redirected
    file), in groups of at most `most`, a group ending early when no more input arrives within
    `wait` seconds: a program that writes a line and waits for its answer gets it, while a file or
    a busy pipe still gives full groups (which batch well). The same lines and errors as
    `read_lines` (strict UTF-8, named by `name` and line; a leading byte order mark dropped).

    Reads the descriptor itself (`os.read`, `select`): a buffered reader would hold lines that
    `select` cannot see, and wait for them."""
    import os
    import select

    cutter, pending, eof = _LineCutter(name), [], False
    while True:
        while len(pending) >= most:
            yield pending[:most]
            pending = pending[most:]
        if eof:
            if pending:
                yield pending
            return
        if pending and not select.select([fd], [], [], wait)[0]:
            yield pending
            pending = []
            continue
        block = os.read(fd, 1 << 16)
        if block:
            refuse_binary(block, name)
        eof = not block
        pending += cutter.feed(block)


def read_lines(path: str | Path) -> list[str]:
    """One string per line of a plain (or gzipped) UTF-8 text file."""
    return [line for block in iter_line_blocks(path) for line in block]


_SEG = re.compile(r"<seg\b[^>]*>(.*?)</seg\s*>", re.IGNORECASE)
_ENTITY = re.compile(r"&(?:#([0-9]+)|#[xX]([0-9a-fA-F]+)|(amp|lt|gt|quot|apos));")
_NAMED = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}


def _entity(m: re.Match) -> str:
    if m.group(3):
        return _NAMED[m.group(3)]
    code = int(m.group(1)) if m.group(1) else int(m.group(2), 16)
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else m.group(0)


def unescape_xml(text: str) -> str:
    """Replace the five XML named entities and numeric character references; leave others."""
    return _ENTITY.sub(_entity, text) if "&" in text else text


def sgml_segments(text: str, path: str | Path) -> list[str]:
    """The segments of a WMT SGML document (`<seg id="1">text</seg>`), in order, unescaped."""
    segs = [unescape_xml(m.group(1)) for m in _SEG.finditer(text)]
    if not segs:
        raise UserError(f"{path}: no <seg> elements found; is this a WMT SGML file?")
    return segs


def read_sgml(path: str | Path) -> list[str]:
    """The segments of a WMT SGML file, in file order, unescaped (`sgml_segments`)."""
    return sgml_segments(decode_utf8(read_bytes(path), path), path)


def _base_suffix(path: Path) -> str:
    """The suffix that says the format, ignoring a trailing `.gz`."""
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return Path(name).suffix


def read_text(path: str | Path) -> list[str]:
    """Sentences of a monolingual file: SGML by suffix (`.sgm`, `.sgml`), else one per line."""
    p = Path(path)
    return read_sgml(p) if _base_suffix(p) in SGML_SUFFIXES else read_lines(p)


def iter_text(path: str | Path) -> Iterator[str]:
    """The sentences of `read_text`, one at a time in bounded memory (SGML files, test sets of a
    few thousand segments, are read whole)."""
    p = Path(path)
    if _base_suffix(p) in SGML_SUFFIXES:
        yield from read_sgml(p)
        return
    for block in iter_line_blocks(p):
        yield from block


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Line-aligned source and target sentences; their counts must agree."""
    return ParallelSource(Path(src_path), Path(tgt_path)).read()


def read_tsv(path: str | Path) -> tuple[list[str], list[str]]:
    """`source<TAB>target` per line; each line must hold exactly one tab."""
    return ParallelSource(Path(path)).read()


def _tsv_fields(line: str, path: Path, number: int) -> list[str]:
    parts = line.split("\t")
    if len(parts) != 2:
        raise UserError(f"{path}:{number}: expected source<TAB>target, found {len(parts) - 1} tabs")
    return parts


@dataclass(frozen=True)
class ParallelSource:
    """Where one split's sentence pairs come from: two aligned files, or one TSV (`tgt is None`)."""

    src: Path
    tgt: Path | None = None

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.src,) if self.tgt is None else (self.src, self.tgt)

    @property
    def kind(self) -> str:
        return "tsv" if self.tgt is None else "pair"

    def read(self) -> tuple[list[str], list[str]]:
        """All (source, target) sentences; see `iter_chunks` for the checks."""
        src: list[str] = []
        tgt: list[str] = []
        for s, t in self.iter_chunks(1 << 20):
            src += s
            tgt += t
        return src, tgt

    def iter_chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        """(source sentences, target sentences) in chunks of `size` pairs (the last one shorter),
        streamed in bounded memory. Line counts that differ, or a TSV line without exactly one
        tab, are `UserError`s, raised when the reading reaches them."""
        if self.tgt is None:
            numbered = enumerate(iter_text(self.src), 1)
            while chunk := list(itertools.islice(numbered, size)):
                fields = [_tsv_fields(line, self.src, i) for i, line in chunk]
                yield [f[0] for f in fields], [f[1] for f in fields]
            return
        src, tgt = iter_text(self.src), iter_text(self.tgt)
        n_src = n_tgt = 0
        while True:
            s, t = list(itertools.islice(src, size)), list(itertools.islice(tgt, size))
            n_src, n_tgt = n_src + len(s), n_tgt + len(t)
            if len(s) != len(t):
                n_src, n_tgt = n_src + sum(1 for _ in src), n_tgt + sum(1 for _ in tgt)
                raise UserError(f"line counts differ: {self.src} has {n_src} lines, "
                                f"{self.tgt} has {n_tgt}")
            if not s:
                return
            yield s, t


def _is_tsv(path: Path) -> bool:
    return _base_suffix(path) in TSV_SUFFIXES


def _find_side(prefix: str, lang: str) -> Path:
    """PREFIX.lang, PREFIX.lang.gz, PREFIX.lang.sgm: exactly one must exist."""
    candidates = [Path(f"{prefix}.{lang}{ext}") for ext in ("", ".gz", ".sgm", ".sgm.gz")]
    found = [c for c in candidates if c.is_file()]
    if not found:
        raise UserError(f"no file {prefix}.{lang} (nor .gz, .sgm): missing {lang} side of {prefix}")
    if len(found) > 1:
        raise UserError(f"ambiguous {lang} side of {prefix}: both {found[0]} and {found[1]} exist")
    return found[0]


def find_parallel(values: Sequence[str], src_lang: str, tgt_lang: str) -> ParallelSource:
    """Resolve a command-line corpus: `PREFIX` (finds PREFIX.src_lang and PREFIX.tgt_lang, each
    optionally `.gz`), `FILE.tsv[.gz]`, or two explicit files `SRC TGT`. Missing files are errors."""
    if len(values) == 2:
        for v in values:
            if not Path(v).is_file():
                raise UserError(f"{v}: no such file")
        return ParallelSource(Path(values[0]), Path(values[1]))
    if len(values) != 1:
        raise UserError(f"expected PREFIX, FILE.tsv or SRC TGT, got {len(values)} values: {' '.join(values)}")
    value = values[0]
    p = Path(value)
    if _is_tsv(p):
        if not p.is_file():
            raise UserError(f"{p}: no such file")
        return ParallelSource(p)
    has_sides = any(Path(f"{value}.{src_lang}{ext}").exists() for ext in ("", ".gz", ".sgm", ".sgm.gz"))
    if p.is_file() and not has_sides:
        raise UserError(f"{p} is a single file: give a PREFIX (PREFIX.{src_lang}, PREFIX.{tgt_lang}), "
                        f"a .tsv file, or two files SRC TGT")
    return ParallelSource(_find_side(value, src_lang), _find_side(value, tgt_lang))


# --- cleaning (training data only) --------------------------------------------------------------


def nul_pairs(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """Bool mask, True where either side holds a NUL character (binary junk in crawled text)."""
    return np.fromiter(("\0" in s or "\0" in t for s, t in zip(src, tgt)), bool, count=len(src))


def empty_pairs(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """Bool mask, True where either side is empty or only whitespace."""
    return np.fromiter((not s.strip() or not t.strip() for s, t in zip(src, tgt)), bool, count=len(src))


def length_filters(
    src_len: np.ndarray, tgt_len: np.ndarray, max_len: int, max_ratio: float
) -> tuple[np.ndarray, np.ndarray]:
    """Masks (too_long, bad_ratio) over pairs, from lengths in subword tokens (no specials).

    too_long: either side longer than `max_len` (0 disables). bad_ratio: the longer side more than
    `max_ratio` times the shorter (0 disables), as Moses' clean-corpus-n does with words.
    """
    src_len = np.asarray(src_len, dtype=np.int64)
    tgt_len = np.asarray(tgt_len, dtype=np.int64)
    too_long = np.zeros(len(src_len), bool)
    if max_len > 0:
        too_long = (src_len > max_len) | (tgt_len > max_len)
    bad_ratio = np.zeros(len(src_len), bool)
    if max_ratio > 0:
        longer = np.maximum(src_len, tgt_len)
        shorter = np.maximum(np.minimum(src_len, tgt_len), 1)
        bad_ratio = longer > max_ratio * shorter
    return too_long, bad_ratio
