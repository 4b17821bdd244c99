"""Tokenized BLEU, as papers of the Transformer's time report it.

Two conventions, both Moses-tokenized (sacremoses, the Python port of tokenizer.perl) and scored by
the BLEU core in `bleu.py` (what multi-bleu.perl computes):

- paper style (EN-DE in the paper's Table 2): mixed case, and German hyphenated compounds split as
  the tensor2tensor script `get_ende_bleu.sh` does (`Kreuz-Fahrt` -> `Kreuz ##AT##-##AT## Fahrt`),
  on both hypothesis and reference;
- Multi30k style: lowercased, punctuation-normalised, Moses-tokenized, no compound splitting.

sacremoses is imported when text is first tokenized (`_moses`, `_normalizer`): it takes about a
second, which what imports `aiayn.evaluation` for another metric need not pay.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from aiayn.evaluation.bleu import BleuResult, corpus_bleu_from_tokens

# The tensor2tensor rule, `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`: a hyphen with a non-space on both
# sides. Python's re.sub scans left to right without overlaps exactly as Perl's s///g does, so
# edge cases ("a-b-c" -> only the first hyphen) come out as the script's.
_COMPOUND = re.compile(r"(\S)-(\S)")


def split_hyphen_compounds(line: str) -> str:
    """Split hyphenated compounds the tensor2tensor way; free-standing dashes (` - `, `-5`) stay."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


@functools.lru_cache(maxsize=None)
def _moses(lang: str):
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@functools.lru_cache(maxsize=None)
def _normalizer(lang: str):
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang=lang)


def moses_tokenize(
    line: str,
    lang: str = "de",
    lowercase: bool = False,
    normalize_punct: bool = False,
    split_compounds: bool = False,
) -> list[str]:
    """One line -> tokens, in the order of the usual shell pipelines:
    lowercase | normalize-punctuation | tokenizer.perl (no escaping) | compound splitting."""
    if lowercase:
        line = line.lower()
    if normalize_punct:
        line = _normalizer(lang).normalize(line)
    text = _moses(lang).tokenize(line, escape=False, return_str=True)
    if split_compounds:
        text = split_hyphen_compounds(text)
    return text.split()


def tokenized_signature(lang: str, lowercase: bool, normalize_punct: bool, split: bool) -> str:
    """A sacreBLEU-like signature for our tokenized BLEU, so a reported number says how it was made."""
    return "|".join([
        "nrefs:1",
        f"case:{'lc' if lowercase else 'mixed'}",
        f"tok:moses-{lang}",
        f"punct:{'norm' if normalize_punct else 'raw'}",
        f"compound:{'atat' if split else 'no'}",
        "smooth:none",
    ])


def tokenized_bleu(
    hyps: Sequence[str],
    refs: Sequence[str],
    lang: str = "de",
    lowercase: bool = False,
    split_compounds: bool | None = None,
    normalize_punct: bool = False,
) -> BleuResult:
    """Tokenized corpus BLEU of detokenized hypotheses against one reference each.

    Defaults give the paper's figure: `split_compounds=None` splits compounds for German only, as
    tensor2tensor does for EN-DE. For the Multi30k convention call
    `tokenized_bleu(h, r, lowercase=True, normalize_punct=True, split_compounds=False)` or
    `multi30k_bleu(h, r)`.
    """
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if split_compounds is None:
        split_compounds = lang == "de"

    def tok(line: str) -> list[str]:
        return moses_tokenize(line, lang, lowercase, normalize_punct, split_compounds)

    sig = tokenized_signature(lang, lowercase, normalize_punct, split_compounds)
    return corpus_bleu_from_tokens([tok(h) for h in hyps], [tok(r) for r in refs], signature=sig)


def multi30k_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str = "de") -> BleuResult:
    """Lowercased tokenized BLEU as the Multi30k literature reports it."""
    return tokenized_bleu(hyps, refs, lang=lang, lowercase=True, normalize_punct=True,
                          split_compounds=False)
