"""Glossaries: source terms whose translation is fixed (not in the paper; `aiayn translate
--glossary FILE`, `aiayn serve`'s `glossary` field).

A glossary is a list of (source term, target term). A term applies to a sentence whose source
text contains it as whole words (case-sensitive; where terms overlap, the longest found first
wins), and its target term becomes a phrase the sentence's translation must contain: the search
is lexically constrained (aiayn/decoding/constraints.py). The target term is cut into target
pieces as a word inside a sentence is (sentencepiece's word-initial form), so the constraint
matches the pieces the model writes there.

The file: UTF-8, one `source term<TAB>target term` a line; blank lines and lines starting with
`#` are skipped. Anything else (no tab, more than one, an empty side) is refused with one line
naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from aiayn.errors import UserError


@dataclass(frozen=True)
class Glossary:
    """(source term, target term) pairs; `terms(text)` the target terms that apply."""

    entries: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for src, tgt in self.entries:
            if not src.strip() or not tgt.strip():
                raise ValueError(f"a glossary entry needs a source and a target term, got "
                                 f"{src!r} -> {tgt!r}")
        # longest source term first: "New York" wins over "York" where both are found
        terms = sorted({src.strip() for src, _ in self.entries}, key=lambda t: (-len(t), t))
        pattern = (re.compile(r"(?<!\w)(?:" + "|".join(re.escape(t) for t in terms) + r")(?!\w)")
                   if terms else None)
        # frozen: the lookup and the pattern are set once, here
        object.__setattr__(self, "_target", {s.strip(): t.strip() for s, t in self.entries})
        object.__setattr__(self, "_pattern", pattern)

    @classmethod
    def of(cls, pairs: Iterable[Sequence[str]]) -> "Glossary":
        return cls(tuple((str(s), str(t)) for s, t in pairs))

    def __len__(self) -> int:
        return len(self.entries)

    def terms(self, text: str) -> list[str]:
        """The target terms of the source terms found in `text`, in text order, each once."""
        if self._pattern is None:
            return []
        found = [self._target[m.group(0)] for m in self._pattern.finditer(text)]
        return list(dict.fromkeys(found))


def read_glossary(path: str | Path) -> Glossary:
    """The glossary in `path` (module doc); UserError naming the file and line otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"glossary {p}: no such file") from None
    except UnicodeDecodeError as e:
        raise UserError(f"glossary {p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise UserError(f"glossary {p}: cannot read it ({e.strerror})") from None
    pairs = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = line.split("\t")
        if len(cells) != 2 or not cells[0].strip() or not cells[1].strip():
            raise UserError(f"glossary {p}, line {n}: expected 'source term<TAB>target term', "
                            f"got {line[:60]!r}")
        pairs.append((cells[0].strip(), cells[1].strip()))
    return Glossary(tuple(pairs))
