"""Penn Treebank reading, the cleaning the parsing literature applies, and splits by file.

Trees are `nltk.tree.Tree` objects: nltk reads PTB brackets (`Tree.fromstring`), so we only find
the files (a directory or a zip, `*.mrg`) and cut each file's text into its top-level bracketed
trees; a PTB file holds many trees, each wrapped in an unlabelled outer bracket `( (S ...) )`.

Cleaning (`clean_tree`), each step as WSJ parsing papers apply it before training and scoring:
1. drop the outer empty bracket (or a `TOP` / `ROOT` node) above a single constituent;
2. remove the `-NONE-` preterminals (traces, empty elements) and every constituent left with no
   words, recursively (EVALB's COLLINS.prm removes them the same way);
3. strip function tags and indices from phrase labels: `NP-SBJ-1` -> `NP`, `NP=2` -> `NP`,
   `PP-LOC-CLR` -> `PP` (the part before the first `-` or `=`, as EVALB's label trimming does);
   labels that start with `-` (`-NONE-`, `-LRB-`, `-RRB-`) are tags, kept whole.
Part-of-speech tags and words are left as they are (`-LRB-` stays a word).

Splits are by file number (`wsj_0042.mrg` is file 42), as WSJ sections 02-21 / 22 / 23 are used:
`parse_split_spec("train=1-159,valid=160-179,test=180-199")` is the default for the NLTK 10%
sample (files 1-199); for the full WSJ, files 200-2199 / 2200-2299 / 2300-2399 are the standard
sections 02-21 / 22 / 23.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from aiayn.errors import UserError

DEFAULT_SPLITS = "train=1-159,valid=160-179,test=180-199"
ROOT_LABELS = frozenset({"", "TOP", "ROOT"})
TRACE_TAG = "-NONE-"


def tree_class():
    """`nltk.tree.Tree`, imported on first use (importing aiayn.parsing does not load nltk)."""
    from nltk.tree import Tree

    return Tree


# --- reading ------------------------------------------------------------------------------------


def split_bracketed(text: str, where: str = "<text>") -> list[str]:
    """The top-level bracketed expressions of `text`, in order. PTB escapes brackets inside words
    (`-LRB-`), so counting `(` and `)` finds each tree's extent."""
    out, depth, start = [], 0, 0
    for m in re.finditer(r"[()]", text):
        if m.group() == "(":
            if depth == 0:
                start = m.start()
            depth += 1
        else:
            depth -= 1
            if depth < 0:
                raise UserError(f"{where}: unbalanced ')' at character {m.start()}")
            if depth == 0:
                out.append(text[start : m.end()])
    if depth:
        raise UserError(f"{where}: {depth} unclosed '(' at the end")
    return out


def parse_tree(text: str, where: str = "<text>"):
    """One bracketed tree (`nltk.tree.Tree`); a malformed one is a UserError naming `where`."""
    Tree = tree_class()
    try:
        return Tree.fromstring(text)
    except ValueError as e:
        raise UserError(f"{where}: not a bracketed tree ({str(e).splitlines()[0]})") from None


def parse_trees(text: str, where: str = "<text>") -> list:
    return [parse_tree(s, where) for s in split_bracketed(text, where)]


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 text (byte {e.start})") from None


def read_treebank(path: str | Path, suffix: str = ".mrg") -> dict[str, list]:
    """{file name: its trees} for every `*suffix` file under a directory or in a zip, by name."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: no such treebank (a directory or a zip of {suffix} files)")
    files: dict[str, list] = {}
    if p.is_dir():
        for f in sorted(p.rglob(f"*{suffix}")):
            files[f.name] = parse_trees(_decode(f.read_bytes(), str(f)), str(f))
    elif zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as z:
            for name in sorted(n for n in z.namelist() if n.endswith(suffix)):
                where = f"{p}:{name}"
                files[Path(name).name] = parse_trees(_decode(z.read(name), where), where)
    else:
        raise UserError(f"{p}: neither a directory nor a zip file")
    if not files:
        raise UserError(f"{p}: no {suffix} files found")
    return files


# --- cleaning -----------------------------------------------------------------------------------


def strip_label(label: str) -> str:
    """`NP-SBJ-1` -> `NP`, `NP=2` -> `NP`; labels starting with `-` (`-NONE-`, `-LRB-`) are kept."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def is_preterminal(node) -> bool:
    return len(node) == 1 and isinstance(node[0], str)


def _clean(node):
    """Step 2 and 3 on a subtree; None when nothing but traces is left under it."""
    Tree = tree_class()
    if is_preterminal(node):
        return None if node.label() == TRACE_TAG else Tree(node.label(), [node[0]])
    kids = [c for c in (_clean(k) for k in node if not isinstance(k, str)) if c is not None]
    return Tree(strip_label(node.label()), kids) if kids else None


def clean_tree(tree):
    """The cleaned copy of a treebank tree (module docstring), or None if it has no words."""
    while tree.label() in ROOT_LABELS and len(tree) == 1 and not is_preterminal(tree):
        tree = tree[0]
    return _clean(tree)


def tree_line(tree) -> str:
    """The tree on one line, `(S (NP (DT The) (NN cat)) (VP (VBD sat)))`: the form EVALB reads."""
    return tree.pformat(margin=1 << 30)


# --- splits -------------------------------------------------------------------------------------


def parse_split_spec(spec: str) -> dict[str, list[tuple[int, int]]]:
    """"train=1-159,valid=160-179,test=180-199" -> {split: [(first, last), ...]} (inclusive
    file-number ranges; a split may be named twice, `train=1-9,train=20-29`)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for part in spec.split(","):
        m = re.fullmatch(r"\s*([A-Za-z][A-Za-z0-9_]*)\s*=\s*(\d+)\s*(?:-\s*(\d+))?\s*", part)
        if not m:
            raise UserError(f"bad split {part!r}: expected NAME=FIRST-LAST, e.g. {DEFAULT_SPLITS}")
        first, last = int(m.group(2)), int(m.group(3) or m.group(2))
        if last < first:
            raise UserError(f"bad split {part!r}: {last} < {first}")
        out.setdefault(m.group(1), []).append((first, last))
    spans = sorted((a, b, n) for n, r in out.items() for a, b in r)
    for (a1, b1, n1), (a2, b2, n2) in zip(spans, spans[1:]):
        if a2 <= b1:
            raise UserError(f"splits {n1} and {n2} overlap (files {a2}-{min(b1, b2)})")
    return out


def file_number(name: str) -> int:
    """`wsj_0042.mrg` -> 42: the last run of digits in the file name."""
    digits = re.findall(r"\d+", Path(name).stem)
    if not digits:
        raise UserError(f"treebank file {name!r} has no number to split by")
    return int(digits[-1])


@dataclass
class Split:
    """One split's cleaned trees, with what cleaning dropped."""

    files: list[str]
    trees: list
    dropped: int = 0  # trees with no words left after removing traces


def split_treebank(files: dict[str, list], spec: str = DEFAULT_SPLITS) -> dict[str, Split]:
    """Clean every tree and assign each file to the split whose range holds its number; files
    in no range are left out."""
    ranges = parse_split_spec(spec)
    out = {name: Split([], []) for name in ranges}
    for fname, trees in files.items():
        n = file_number(fname)
        for name, spans in ranges.items():
            if any(a <= n <= b for a, b in spans):
                split = out[name]
                split.files.append(fname)
                for t in trees:
                    c = clean_tree(t)
                    if c is None:
                        split.dropped += 1
                    else:
                        split.trees.append(c)
    for name, split in out.items():
        if not split.trees:
            raise UserError(f"split {name} ({ranges[name]}) holds no trees; check --splits")
    return out
