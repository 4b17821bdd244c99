"""`"format": "document"` in `POST /translate`: each text a document whose lines are paragraphs,
translated as `aiayn translate --documents` translates its lines (aiayn/decoding/documents.py).

Each paragraph is split into sentences (sentencex), a sentence too long for the model is cut
between words into parts that fit, never truncated (both `paragraph_sources`), and every
sentence (or part) of every document of the request becomes one sentence of one batcher job, so
documents share the server's continuous batching with everything else. Each paragraph is put
back from its sentences' best translations joined by single spaces (an empty one left out), and
each document from its paragraphs with its own line breaks (`\\n`, `\\r\\n` or `\\r`, as sent): a
blank line stays blank.

A glossary's terms are looked for in each sentence's text, or in a part's own text (its pieces
detokenized) for a sentence cut into parts, as `aiayn translate --documents --glossary` does: a
term that straddles a cut applies to neither part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from aiayn.decoding.documents import paragraph_sources

LINE_BREAK = re.compile(r"\r\n|\n|\r")


@dataclass(frozen=True)
class Sentence:
    """One sentence (or part of one) to search: its document (index into the request's texts),
    its line in that document (0-based), its text and its source ids (no EOS)."""

    document: int
    line: int
    text: str
    ids: list[int]


@dataclass(frozen=True)
class Documents:
    """A request's documents cut up: per document its lines (paragraphs) and the line breaks
    between them, and every sentence to search, in document and reading order."""

    lines: list[list[str]]
    breaks: list[list[str]]
    sentences: list[Sentence]


def split_lines(text: str) -> tuple[list[str], list[str]]:
    """A document's lines and the line breaks between them (one fewer), so that joining them
    back gives `text`."""
    lines, breaks, start = [], [], 0
    for m in LINE_BREAK.finditer(text):
        lines.append(text[start:m.start()])
        breaks.append(m.group(0))
        start = m.end()
    lines.append(text[start:])
    return lines, breaks


def split_documents(translator: Any, texts: Sequence[str], language: str) -> Documents:
    """The sentences of `texts`, each a document (module doc), for `translator`'s model
    (`aiayn.decoding.translate.Translator`: its source tokenizer and `max_src_tokens`)."""
    all_lines, all_breaks, sentences = [], [], []
    for d, text in enumerate(texts):
        lines, breaks = split_lines(text)
        all_lines.append(lines)
        all_breaks.append(breaks)
        sentences += [Sentence(d, n, part, ids)
                      for n, part, ids in paragraph_sources(translator, lines, language)]
    return Documents(all_lines, all_breaks, sentences)


def join_documents(docs: Documents, translations: Sequence[str]) -> list[str]:
    """Each document's translation from its sentences' (`translations[i]` of
    `docs.sentences[i]`): a line's joined by spaces, the lines by the document's breaks."""
    out: list[list[list[str]]] = [[[] for _ in lines] for lines in docs.lines]
    for s, text in zip(docs.sentences, translations, strict=True):
        if text:
            out[s.document][s.line].append(text)
    joined = []
    for lines, breaks in zip(out, docs.breaks):
        parts = [" ".join(lines[0])]
        for brk, line in zip(breaks, lines[1:]):
            parts += [brk, " ".join(line)]
        joined.append("".join(parts))
    return joined
