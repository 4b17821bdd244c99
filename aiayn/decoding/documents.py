"""Documents: paragraphs in, paragraphs out, translated sentence by sentence (`aiayn translate
--documents`).

The model was trained on sentences (§5.1's corpora are sentence-aligned), so a paragraph is split
into sentences first, with sentencex (a rule-based segmenter for some 300 languages that ships its
rules: nothing is downloaded at run time), every sentence of every paragraph goes through one
search together (`Translator.search`: one engine, sorted by length), and each paragraph is put
back from its sentences' translations, joined by single spaces, in order.

Input: one paragraph a line, as `aiayn translate` reads lines (a blank line stays blank, so the
line structure of the input is the output's). Text wrapped over several lines is one paragraph
per line only once unwrapped.

A sentence longer than the model can take (`Translator.max_src_tokens`: pieces + EOS) is not
truncated as `Translator.prepare` truncates a line: its pieces are cut into parts that fit,
each cut before a piece that starts a word where there is one (`split_pieces`), and the parts'
translations are joined by spaces.

With a glossary (aiayn/decoding/glossary.py), the terms found in each sentence's text, or in a
part's own text for a sentence cut into parts, become its phrases (`Translator.phrases`): a term
that straddles a cut applies to neither part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from aiayn.decoding.glossary import Glossary

# sentencex's fallback chain ends in English rules, which suit most languages written with
# Latin script.
DEFAULT_LANGUAGE = "en"

WORD_START = "\u2581"  # sentencepiece's word-boundary mark, "▁"


def split_sentences(paragraph: str, language: str = DEFAULT_LANGUAGE) -> list[str]:
    """The sentences of one paragraph (sentencex, rules for `language`, an ISO 639 code),
    stripped of surrounding white space; a blank paragraph has none."""
    import sentencex

    return [s.strip() for s in sentencex.segment(language, paragraph) if s.strip()]


def split_pieces(ids: Sequence[int], keep: int, starts_word: Callable[[int], bool]
                 ) -> list[list[int]]:
    """`ids` cut into consecutive parts of at most `keep` pieces, in order, together exactly
    `ids`: each part ends before the last piece that starts a word (`starts_word`) within
    reach, or at `keep` pieces when no word starts there (one word longer than `keep`)."""
    if keep < 1:
        raise ValueError(f"a part must hold at least one piece, got {keep}")
    ids = list(ids)
    parts: list[list[int]] = []
    start = 0
    while len(ids) - start > keep:
        end = start + keep
        cut = next((j for j in range(end, start, -1) if starts_word(ids[j])), end)
        parts.append(ids[start:cut])
        start = cut
    parts.append(ids[start:])
    return parts


def paragraph_sources(translator: Any, paragraphs: Sequence[str],
                      language: str = DEFAULT_LANGUAGE) -> list[tuple[int, str, list[int]]]:
    """What to search for `paragraphs`, in reading order: (paragraph index, text, source ids)
    for each sentence, or for each part of a sentence too long for `translator`'s model
    (`split_pieces`; the part's text is its pieces detokenized). `aiayn serve`'s documents
    are cut here too."""
    tok = translator.src_tokenizer
    keep = translator.max_src_tokens - 1  # room for EOS

    def starts_word(i: int) -> bool:
        return tok.id_to_piece(i).startswith(WORD_START)

    out = []
    for p, paragraph in enumerate(paragraphs):
        for sentence in split_sentences(paragraph, language):
            ids = list(tok.encode(sentence))
            parts = split_pieces(ids, keep, starts_word) if ids else []
            out += [(p, sentence if len(parts) == 1 else tok.decode(part), part) for part in parts]
    return out


def translate_paragraphs(translator: Any, paragraphs: Sequence[str],
                         language: str = DEFAULT_LANGUAGE, progress: bool = False,
                         glossary: Glossary | None = None, first_line: int = 1) -> list[str]:
    """One translation per paragraph, in order (a blank paragraph gives ""): the paragraphs'
    sentences, and the parts of those too long for the model (`split_pieces`), searched
    together through `translator` (`aiayn.decoding.translate.Translator`), best hypothesis
    each, joined by spaces. `glossary`: each sentence's (or part's) translation holds the
    target terms of the source terms in its own text; UserError naming the paragraph's line
    (numbered from `first_line`) when they cannot fit (`Translator.phrases`)."""
    units = paragraph_sources(translator, paragraphs, language)
    owner = [p for p, _, _ in units]  # the paragraph of each source
    texts = [text for _, text, _ in units]  # where a glossary's terms are looked for
    sources = [ids for _, _, ids in units]
    phrases = None
    if glossary is not None:
        phrases = [translator.phrases([text], [src], glossary, first_line + p)[0]
                   for text, src, p in zip(texts, sources, owner)]
    found = translator.search(sources, 1, progress, phrases=phrases)
    out: list[list[str]] = [[] for _ in paragraphs]
    for p, hyps in zip(owner, found):
        text = translator.detokenize(hyps[0].tokens) if hyps else ""
        if text:
            out[p].append(text)
    return [" ".join(t) for t in out]
