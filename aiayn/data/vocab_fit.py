"""How well a model's vocabulary fits new data, for `aiayn prepare --vocab-from MODEL`.

A sentencepiece vocabulary learned on one language splits another into far more, shorter pieces
(in the worked example of docs/guides/reuse.md, Multi30k's French through an EN-DE vocabulary took
1.8x the batches of its German): the sequences grow longer, each piece carries less, and a model
fine-tuned on them starts far from what it learned.
The measure is pieces per character (non-space characters, so that languages with longer words
or none between spaces compare fairly) of each side. The reference is what the model's own
training data took: meta.json's `pieces_per_char` (the trainer records its dataset's, from a dev
or test split), else the dataset meta.json names, if it is still there and is the one the model
was trained on (same fingerprint). Without either, the two sides of the new data are compared
with each other, which catches one language the vocabulary does not know beside one it does.

A side taking more than `FRAGMENTING` times the reference's pieces is said in one line: the
ratio, and what to do (a vocabulary of its own and a model trained from scratch, or accept it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from aiayn.data.dataset import SIDES, read_manifest, text_file
from aiayn.data.model_dir import read_meta
from aiayn.errors import UserError

# Pieces per character, new data over the reference, above which `prepare --vocab-from` warns:
# each piece then covers under two thirds of the characters it covered in the data the vocabulary
# was learned on. A threshold, not tuned; the case it is for, a language the vocabulary never saw,
# is near 2x.
FRAGMENTING = 1.5
SAMPLE = 2000  # training pairs measured, spread evenly over the sample `prepare` holds


def _chars(text: str) -> int:
    return sum(not c.isspace() for c in text)


def pieces_per_char(tokenizer, lines: Sequence[str]) -> float | None:
    """Subword pieces per non-space character of `lines` under `tokenizer`; None for no text."""
    chars = sum(_chars(line) for line in lines)
    if not chars:
        return None
    return sum(len(ids) for ids in tokenizer.encode_batch(lines)) / chars


def spread(lines: Sequence[str], n: int = SAMPLE) -> list[str]:
    """At most `n` of `lines`, evenly spaced (a corpus sorted by topic or length still counts whole)."""
    step = max(1, -(-len(lines) // n))
    return list(lines[::step])


def held_pieces_per_char(directory: str | Path, manifest: dict) -> dict[str, float] | None:
    """Pieces per non-space character of each side of a dataset's first dev or test split that
    keeps its text: the manifest's token counts over the characters of the text files. None when
    there is no such split (or its files cannot be read: this only informs, it never stops a run)."""
    for name, info in manifest["splits"].items():
        if name == "train" or not info.get("raw_text"):
            continue
        out = {}
        for side in SIDES:
            try:
                chars = _chars((Path(directory) / text_file(name, side)).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                return None
            if not chars or not info.get(f"{side}_tokens"):
                break
            out[side] = info[f"{side}_tokens"] / chars
        else:
            return out
    return None


def model_reference(model_dir: str | Path) -> dict[str, float] | None:
    """The pieces per character of the data `model_dir` was trained on, by side, if known."""
    try:
        meta = read_meta(model_dir)
        if meta.get("pieces_per_char"):
            return dict(meta["pieces_per_char"])
        dataset = meta.get("dataset")
        if not dataset or not (Path(dataset) / "manifest.json").is_file():
            return None
        manifest = read_manifest(dataset)
    except UserError:  # a malformed meta.json or manifest: nothing to compare with
        return None
    if manifest.get("fingerprint") != meta.get("dataset_fingerprint"):
        return None  # another dataset now lies at that path
    return held_pieces_per_char(dataset, manifest)


def fit_warning(new: dict[str, float], reference: dict[str, float] | None,
                langs: dict[str, str], model_dir: str | Path) -> str | None:
    """One line when a side of the new data takes more than `FRAGMENTING` times the reference's
    pieces per character (or, without a reference, than the other side); None otherwise."""
    remedy = ("a vocabulary of its own fits better: prepare without --vocab-from and train from "
              "scratch, or accept the longer sequences")
    if reference and all(reference.get(s) for s in new):
        ratios = {side: new[side] / reference[side] for side in new}
        side = max(ratios, key=ratios.get)
        if ratios[side] <= FRAGMENTING:
            return None
        return (f"warning: --vocab-from {model_dir}: its vocabulary splits the {langs[side]} side "
                f"into {ratios[side]:.2f}x the pieces per character of the model's own {side} "
                f"training data ({new[side]:.2f} against {reference[side]:.2f}); {remedy}")
    if len(new) < 2:
        return None
    side, other = ("tgt", "src") if new["tgt"] >= new["src"] else ("src", "tgt")
    ratio = new[side] / new[other]
    if ratio <= FRAGMENTING:
        return None
    return (f"warning: --vocab-from {model_dir}: its vocabulary splits the {langs[side]} side into "
            f"{ratio:.2f}x the pieces per character of the {langs[other]} side (the model's own "
            f"data is not at hand to compare with); {remedy}")


def check_fit(model_dir: str | Path, tokenizers: dict, pairs: tuple[Sequence[str], Sequence[str]],
              langs: dict[str, str]) -> str | None:
    """`fit_warning` for training pairs (src lines, tgt lines) encoded with `tokenizers` by side."""
    new = {}
    for side, lines in zip(SIDES, pairs):
        value = pieces_per_char(tokenizers[side], spread(lines))
        if value is not None:
            new[side] = value
    return fit_warning(new, model_reference(model_dir), langs, model_dir) if new else None
