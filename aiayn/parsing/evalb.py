"""Labelled bracket scoring exactly as EVALB (Sekine and Collins 1997) computes it with COLLINS.prm.

No Python package does this exactly (PYEVALB counts a repeated span once and deletes nothing),
so the rules are written out here from EVALB's documented algorithm, step by step:

- One tree per line, gold and test line by line. A preterminal is `(TAG word)`; every other
  bracket is a constituent spanning the words read between its opening and closing.
- Words whose tag is a DELETE_LABEL (COLLINS.prm: `-NONE-` and the punctuation tags
  `, : `` '' .`) are removed before spans are counted, so spans are over the remaining words.
- The sentence length that decides "<= 40 words" counts the gold's words except those tagged
  with a DELETE_LABEL_FOR_LENGTH (`-NONE-`): punctuation counts there.
- Constituent labels are cut at their first `-` or `=` (`NP-SBJ` -> `NP`; `-NONE-` -> ``);
  constituents spanning no word are dropped, and so are those labelled with a DELETE_LABEL
  (`TOP`). The unlabelled outer bracket `( (S ...) )` is *not* dropped: it counts as a
  constituent labelled ``, on both sides.
- Labels are equal when identical or an EQ_LABEL pair (`ADVP` = `PRT`).
- Matching is one to one: each gold constituent, in order, takes the first unmatched test
  constituent with the same span and an equal label. A bracket repeated with the same span and
  label (a unary chain `(NP (NP ...))`) is counted as many times as it occurs.
- A sentence whose test side has no words is skipped; one whose words differ from the gold's
  (in number or text) is an error. Neither counts in the totals.
- Totals: recall = matched / gold constituents, precision = matched / test constituents, over
  all valid sentences; F1 = 2PR / (P + R); complete match = sentences with matched = gold = test;
  crossing = test constituents crossing some gold one; tagging accuracy over the kept words.
  The same again for the sentences of at most CUTOFF_LEN (40) words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from aiayn.errors import UserError


@dataclass(frozen=True)
class EvalbParams:
    """An EVALB parameter file's settings; `COLLINS` is COLLINS.prm."""

    delete_labels: tuple[str, ...] = ()
    delete_for_length: tuple[str, ...] = ()
    eq_labels: tuple[tuple[str, str], ...] = ()
    cutoff_len: int = 40
    labeled: bool = True

    def same_label(self, a: str, b: str) -> bool:
        return a == b or any((a, b) in ((x, y), (y, x)) for x, y in self.eq_labels)

    def deleted(self, label: str) -> bool:
        return label in self.delete_labels


COLLINS = EvalbParams(delete_labels=("TOP", "-NONE-", ",", ":", "``", "''", "."),
                      delete_for_length=("-NONE-",), eq_labels=(("ADVP", "PRT"),))


def read_params(path: str | Path) -> EvalbParams:
    """Parse an EVALB .prm file (DELETE_LABEL, DELETE_LABEL_FOR_LENGTH, EQ_LABEL, CUTOFF_LEN,
    LABELED; other keys, such as DEBUG and MAX_ERROR, are ignored)."""
    delete, for_length, eq = [], [], []
    cutoff, labeled = 40, True
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such parameter file") from None
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts or line.startswith("#"):
            continue
        key, vals = parts[0], parts[1:]
        if key == "DELETE_LABEL" and vals:
            delete.append(vals[0])
        elif key == "DELETE_LABEL_FOR_LENGTH" and vals:
            for_length.append(vals[0])
        elif key == "EQ_LABEL" and len(vals) == 2:
            eq.append((vals[0], vals[1]))
        elif key in ("CUTOFF_LEN", "LABELED") and vals and vals[0].isdigit():
            cutoff, labeled = (int(vals[0]), labeled) if key == "CUTOFF_LEN" else (cutoff, vals[0] != "0")
        elif key not in ("DEBUG", "MAX_ERROR", "EQ_WORD", "QUOTE_LABEL"):
            raise UserError(f"{path}:{n}: unknown or malformed EVALB parameter {line.strip()!r}")
    return EvalbParams(tuple(delete), tuple(for_length), tuple(eq), cutoff, labeled)


# --- one tree line ------------------------------------------------------------------------------


@dataclass
class Bracketing:
    """A tree line as EVALB reads it: kept (word, tag) terminals, constituents (start, end,
    label) over them in opening order (label as written), and the length for the cutoff."""

    terminals: list[tuple[str, str]]
    brackets: list[tuple[int, int, str]]
    length: int


class TreeLineError(ValueError):
    pass


def read_bracketing(line: str, params: EvalbParams = COLLINS) -> Bracketing:
    """Read one tree line (a blank line has no words); TreeLineError if it is malformed."""
    found = list(re.finditer(r"\(|\)|[^\s()]+", line))
    toks = [m.group() for m in found]
    terminals: list[tuple[str, str]] = []
    brackets: list[list] = []
    stack: list[int] = []
    length, i = 0, 0
    while i < len(toks):
        tok = toks[i]
        if tok == "(":
            # the label is what touches the bracket: `( (S` has the empty label
            touching = i + 1 < len(toks) and found[i + 1].start() == found[i].end()
            label = toks[i + 1] if touching and toks[i + 1] not in "()" else ""
            i += 1 if not label else 2
            if i + 1 < len(toks) and toks[i] not in "()" and toks[i + 1] == ")":  # (TAG word)
                word = toks[i]
                if label not in params.delete_for_length:
                    length += 1
                if not params.deleted(label):
                    terminals.append((word, label))
                i += 2
                continue
            if i < len(toks) and toks[i] not in "()":
                raise TreeLineError(f"more than two elements in a bracket near {toks[i]!r}")
            stack.append(len(brackets))
            brackets.append([len(terminals), -1, label])
        elif tok == ")":
            if not stack:
                raise TreeLineError("unbalanced: too many ')'")
            brackets[stack.pop()][1] = len(terminals)
            i += 1
        else:
            raise TreeLineError(f"a word outside a (TAG word) bracket: {tok!r}")
    if stack:
        raise TreeLineError(f"unbalanced: {len(stack)} '(' never closed")
    return Bracketing(terminals, [tuple(b) for b in brackets], length)


def _trim(label: str) -> str:
    """EVALB's label trimming: cut at the first `-` or `=` (even at position 0)."""
    return re.split(r"[-=]", label, maxsplit=1)[0]


def scored_brackets(b: Bracketing, params: EvalbParams = COLLINS) -> list[tuple[int, int, str]]:
    """The constituents that count: non-empty, trimmed labels, DELETE_LABELs dropped."""
    out = []
    for start, end, label in b.brackets:
        if start == end:
            continue
        label = _trim(label)
        if any(params.same_label(label, d) for d in params.delete_labels):
            continue
        out.append((start, end, label))
    return out


_TERMINAL = re.compile(r"\(([^\s()]+)\s+([^\s()]+)\s*\)")


def retag_from_gold(test_line: str, gold_line: str, trace: str = "-NONE-") -> str:
    """`test_line` with each word given the tag of the gold's word at the same position (gold
    traces not counted); unchanged if the two have different numbers of words.

    A parser that writes one symbol for every part of speech (Vinyals et al.'s normalisation)
    gives EVALB no tags, and EVALB needs them for one thing in the bracket scores: deleting the
    punctuation words. Taking them from the gold deletes the same words on both sides, for any
    parser; brackets are untouched (tagging accuracy then means nothing).
    """
    gold_tags = [tag for tag, _ in _TERMINAL.findall(gold_line) if tag != trace]
    if len(gold_tags) != len(_TERMINAL.findall(test_line)):
        return test_line
    tags = iter(gold_tags)
    return _TERMINAL.sub(lambda m: f"({next(tags)} {m.group(2)})", test_line)


# --- scoring ------------------------------------------------------------------------------------


class _Bracketed:
    """Recall and precision (%) of `match` over `gold` and `test` constituents."""

    match: int
    gold: int
    test: int

    @property
    def recall(self) -> float:
        return 100.0 * self.match / self.gold if self.gold else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.match / self.test if self.test else 0.0


@dataclass
class SentenceScore(_Bracketed):
    """One line's figures; status is "ok", "skip" (no test words) or "error" (words differ)."""

    length: int
    status: str
    match: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    message: str = ""



def score_sentence(gold: Bracketing, test: Bracketing, params: EvalbParams = COLLINS) -> SentenceScore:
    if not test.terminals:
        return SentenceScore(gold.length, "skip", message="the test tree has no words")
    if len(gold.terminals) != len(test.terminals):
        return SentenceScore(gold.length, "error", message=f"length unmatch "
                             f"({len(gold.terminals)}|{len(test.terminals)})")
    for (w1, _), (w2, _) in zip(gold.terminals, test.terminals):
        if w1 != w2:
            return SentenceScore(gold.length, "error", message=f"words unmatch ({w1}|{w2})")
    g, t = scored_brackets(gold, params), scored_brackets(test, params)
    used = [False] * len(t)
    match = 0
    for gs, ge, gl in g:
        for j, (ts, te, tl) in enumerate(t):
            if not used[j] and (gs, ge) == (ts, te) and (not params.labeled or params.same_label(gl, tl)):
                used[j] = True
                match += 1
                break
    crossing = sum(any((gs < ts < ge < te) or (ts < gs < te < ge) for gs, ge, _ in g)
                   for ts, te, _ in t)
    tags = sum(params.same_label(a[1], b[1]) for a, b in zip(gold.terminals, test.terminals))
    return SentenceScore(gold.length, "ok", match, len(g), len(t), crossing,
                         len(gold.terminals), tags)


@dataclass
class Totals(_Bracketed):
    """Corpus figures over a set of sentences (EVALB's summary block)."""

    sentences: int = 0
    errors: int = 0
    skipped: int = 0
    match: int = 0
    gold: int = 0
    test: int = 0
    complete: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less: int = 0
    words: int = 0
    correct_tags: int = 0

    def add(self, s: SentenceScore) -> None:
        self.sentences += 1
        if s.status != "ok":
            self.errors += s.status == "error"
            self.skipped += s.status == "skip"
            return
        self.match += s.match
        self.gold += s.gold
        self.test += s.test
        self.complete += s.match == s.gold == s.test
        self.crossing += s.crossing
        self.no_crossing += s.crossing == 0
        self.two_or_less += s.crossing <= 2
        self.words += s.words
        self.correct_tags += s.correct_tags

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def complete_match(self) -> float:
        return 100.0 * self.complete / self.valid if self.valid else 0.0

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.valid if self.valid else 0.0

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words else 0.0

    def as_dict(self) -> dict:
        keys = ("sentences", "errors", "skipped", "valid", "recall", "precision", "f1",
                "complete_match", "average_crossing", "tagging_accuracy", "match", "gold", "test")
        return {k: getattr(self, k) for k in keys}


@dataclass
class EvalbResult:
    sentences: list[SentenceScore] = field(default_factory=list)
    all: Totals = field(default_factory=Totals)
    short: Totals = field(default_factory=Totals)  # gold length <= cutoff_len
    cutoff_len: int = 40


def evalb(gold_lines: Sequence[str], test_lines: Sequence[str], params: EvalbParams = COLLINS
          ) -> EvalbResult:
    """Score test trees against gold trees, line by line. A malformed gold line is a UserError;
    a malformed test line is an error sentence, as EVALB counts it."""
    if len(gold_lines) != len(test_lines):
        raise UserError(f"gold has {len(gold_lines)} trees but test has {len(test_lines)}")
    res = EvalbResult(cutoff_len=params.cutoff_len)
    for n, (gl, tl) in enumerate(zip(gold_lines, test_lines), 1):
        try:
            gold = read_bracketing(gl, params)
        except TreeLineError as e:
            raise UserError(f"gold line {n}: {e}") from None
        try:
            s = score_sentence(gold, read_bracketing(tl, params), params)
        except TreeLineError as e:
            s = SentenceScore(gold.length, "error", message=str(e))
        res.sentences.append(s)
        res.all.add(s)
        if s.length <= params.cutoff_len:
            res.short.add(s)
    return res


def format_report(res: EvalbResult, per_sentence: bool = True) -> str:
    """EVALB's report layout: one row per sentence, then the summary for all and <= cutoff."""
    lines = []
    if per_sentence:
        lines += ["  Sent.                        Matched  Bracket   Cross        Correct Tag",
                  " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy",
                  "=" * 76]
        code = {"ok": 0, "error": 1, "skip": 2}
        for n, s in enumerate(res.sentences, 1):
            acc = 100.0 * s.correct_tags / s.words if s.words else 0.0
            lines.append(f"{n:4d}  {s.length:3d}    {code[s.status]}  {s.recall:6.2f} {s.precision:6.2f}"
                         f"   {s.match:3d}    {s.gold:3d}  {s.test:3d}    {s.crossing:3d}"
                         f"   {s.words:4d}  {s.correct_tags:4d}   {acc:6.2f}"
                         + (f"   ({s.message})" if s.message else ""))
        lines.append("=" * 76)
    lines.append("=== Summary ===")
    for title, t in (("All", res.all), (f"len<={res.cutoff_len}", res.short)):
        lines += [
            "", f"-- {title} --",
            f"Number of sentence        = {t.sentences:6d}",
            f"Number of Error sentence  = {t.errors:6d}",
            f"Number of Skip  sentence  = {t.skipped:6d}",
            f"Number of Valid sentence  = {t.valid:6d}",
            f"Bracketing Recall         = {t.recall:6.2f}",
            f"Bracketing Precision      = {t.precision:6.2f}",
            f"Bracketing FMeasure       = {t.f1:6.2f}",
            f"Complete match            = {t.complete_match:6.2f}",
            f"Average crossing          = {t.average_crossing:6.2f}",
            f"No crossing               = {100.0 * t.no_crossing / t.valid if t.valid else 0.0:6.2f}",
            f"2 or less crossing        = {100.0 * t.two_or_less / t.valid if t.valid else 0.0:6.2f}",
            f"Tagging accuracy          = {t.tagging_accuracy:6.2f}",
        ]
    return "\n".join(lines)
