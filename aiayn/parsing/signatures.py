"""Rare and unknown words as their shape (not in the paper, off by default: `aiayn treebank
--signatures N`).

A word vocabulary learned from a few thousand sentences misses one word in ten of new text, and
a word that reaches the model as UNK tells it nothing. Parsers trained on small treebanks (the
Berkeley parser, Petrov and Klein 2007, among them) replace rare and unknown words by a
signature: the word's shape (digits, capitals, a hyphen) and a common English suffix, which
carry much of its part of speech: `UNK-Cap-hyph` for `Stamford-based`, `UNK-ing` for
`reorganizing`, `UNK-num` for `3.8`.

With `--signatures N` the treebank step writes the model's source (`SPLIT.src`) with every word
seen fewer than N times in training replaced by its signature, so the model learns what the
signatures mean from the training set's rare words. When parsing (`model_inputs`), a word the
model's vocabulary cannot read becomes its signature if the vocabulary has that signature; a
model trained without signatures has none and reads UNK as before, and a vocabulary with byte
fallback (BPE) reads every word, so nothing changes there. The tree is always built over the
original words; only the model's input changes.
"""

from __future__ import annotations

from typing import Any, Container, Sequence

from aiayn.special import UNK_ID

MARK = "UNK"  # every signature starts with it: `UNK`, `UNK-Cap`, `UNK-num-hyph`, `UNK-ing`
# English suffixes that say much about a word's part of speech, longest first so that `-ness`
# wins over `-s`; a suffix counts only when at least 3 letters stand before it.
SUFFIXES = tuple(sorted("ing ed ly ion ity ment ness ous ive able ible al ic er est ist ism an "
                        "en ful less ship ize ate y s".split(), key=len, reverse=True))


def signature(word: str) -> str:
    """`word`'s signature: MARK, then `-num` if it has a digit, `-CAPS` (two or more letters,
    all capitals) or `-Cap` (a capital first), `-hyph` if it has a hyphen, and the longest of
    SUFFIXES it ends with (lower-cased), e.g. `Stamford-based` -> `UNK-Cap-hyph-ed`."""
    parts = [MARK]
    letters = [c for c in word if c.isalpha()]
    if any(c.isdigit() for c in word):
        parts.append("num")
    if len(letters) > 1 and all(c.isupper() for c in letters):
        parts.append("CAPS")
    elif word[:1].isupper():
        parts.append("Cap")
    if "-" in word:
        parts.append("hyph")
    lower = word.lower()
    for s in SUFFIXES:
        if lower.endswith(s) and sum(c.isalpha() for c in lower[:-len(s)]) >= 3:
            parts.append(s)
            break
    return "-".join(parts)


def replace_rare(words: Sequence[str], known: Container[str]) -> list[str]:
    """`words` with every word not in `known` replaced by its signature."""
    return [w if w in known else signature(w) for w in words]


def model_inputs(lines: Sequence[str], tokenizer: Any) -> list[str]:
    """The model's input for whitespace-tokenized `lines`: each word `tokenizer` cannot read (it
    encodes to UNK) replaced by its signature when the tokenizer reads that as one known piece
    (a model trained with `--signatures`); other words, and every word for a model without
    signatures, as they are."""
    cache: dict[str, str] = {}

    def one(word: str) -> str:
        if word not in cache:
            cache[word] = word
            if UNK_ID in tokenizer.encode(word):
                sig = signature(word)
                ids = tokenizer.encode(sig)
                if len(ids) == 1 and ids[0] != UNK_ID:
                    cache[word] = sig
        return cache[word]

    return [" ".join(one(w) for w in line.split()) for line in lines]
