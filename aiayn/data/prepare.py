"""`aiayn prepare`'s work: raw parallel corpora -> a binarized dataset directory (layout in
`aiayn.data.dataset`).

Steps: read and check every input (nothing is written before all of it passes); drop training
pairs with an empty side or a NUL byte (counted in the manifest and the summary; dev and test
pairs with NUL bytes are kept, with a warning); learn the sentencepiece vocabulary from the
remaining training text of both languages (§5.1, shared by default, §3.4); encode every split;
drop training pairs that are too long or too lopsided (in subword tokens); write ids, offsets,
raw dev/test lines, the model(s) and `manifest.json` into a temporary sibling directory and rename
it into place, so a crash leaves either nothing or a complete dataset. Dev and test splits keep every line, in order.

A fingerprint of the options and of the inputs' sha256 (not their paths) is stored in the manifest:
the same inputs and options into an existing dataset are reported up to date and reused; anything
else there is refused unless `overwrite` (and a directory that is not an aiayn dataset is never
replaced). While it writes, `prepare_dataset` holds the output's lock (`aiayn.io.exclusive_lock`):
a second prepare into the same directory meanwhile is refused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from aiayn.data.corpus import ParallelSource, empty_pairs, length_filters, nul_pairs
from aiayn.data.dataset import (
    FORMAT,
    FORMAT_VERSION,
    SIDES,
    ids_file,
    idx_file,
    is_complete,
    read_manifest,
    text_file,
    token_dtype,
)
from aiayn.data.tokenizer import Tokenizer, train_tokenizers
from aiayn.errors import UserError
from aiayn.io import atomic_write, exclusive_lock, reading, write_dir_atomically

ENCODE_CHUNK = 50_000  # sentences per sentencepiece call: bounds the memory of Python int lists


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with reading(path, "a text file"), open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# --- encoding -----------------------------------------------------------------------------------


def encode_lines(
    tok: Tokenizer, lines: list[str], dtype: np.dtype, progress: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, lengths) of `lines`: ids concatenated in `dtype`, lengths int64 per line."""
    from tqdm import tqdm

    flats: list[np.ndarray] = []
    lengths = np.empty(len(lines), np.int64)
    threads = min(8, os.cpu_count() or 1)
    quiet = progress is None or len(lines) < 200_000
    with tqdm(total=len(lines), desc=progress, unit="sent", disable=quiet) as bar:
        for start in range(0, len(lines), ENCODE_CHUNK):
            enc = tok.encode_batch(lines[start : start + ENCODE_CHUNK], num_threads=threads)
            n = np.fromiter(map(len, enc), np.int64, count=len(enc))
            lengths[start : start + len(enc)] = n
            flats.append(np.fromiter(itertools.chain.from_iterable(enc), dtype, count=int(n.sum())))
            bar.update(len(enc))
    flat = np.concatenate(flats) if flats else np.zeros(0, dtype)
    return flat, lengths


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """int64 offsets [0, l0, l0+l1, ...] of length len(lengths)+1."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def select(flat: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the sentences where `keep` is True, in order."""
    return flat[np.repeat(keep, lengths)], lengths[keep]


# --- prepare ------------------------------------------------------------------------------------


@dataclass
class PrepareOptions:
    """What decides the content of a dataset besides its input files (all go into the manifest)."""

    src_lang: str
    tgt_lang: str
    vocab_size: int = 8000
    separate_vocab: bool = False
    model_type: str = "bpe"
    tgt_model_type: str | None = None  # separate vocabularies only; None: model_type
    tgt_vocab_size: int | None = None  # separate vocabularies only; None: vocab_size
    max_len: int = 250  # subword tokens per side, training only; 0 = no limit
    max_ratio: float = 9.0  # longer/shorter side in subword tokens, training only; 0 = no limit
    byte_fallback: bool | None = None  # None: the tokenizer's default for model_type
    character_coverage: float = 1.0

    def check(self) -> None:
        if self.vocab_size < 5:
            raise UserError(f"--vocab-size must be at least 5, got {self.vocab_size}")
        if self.max_len < 0 or self.max_ratio < 0:
            raise UserError("--max-len and --max-ratio must be >= 0 (0 disables the filter)")
        if self.max_ratio and self.max_ratio < 1:
            raise UserError(f"--max-ratio must be >= 1 (or 0 to disable), got {self.max_ratio}")
        for lang in (self.src_lang, self.tgt_lang):
            if not re.fullmatch(r"[A-Za-z0-9_-]+", lang):
                raise UserError(f"language code {lang!r} should be letters, digits, '_' or '-'")
        if (self.tgt_model_type is not None or self.tgt_vocab_size is not None) and not self.separate_vocab:
            raise UserError("a target model type or vocabulary size of its own needs separate "
                            "vocabularies (--separate-vocab)")
        if self.tgt_vocab_size is not None and self.tgt_vocab_size < 5:
            raise UserError(f"--tgt-vocab-size must be at least 5, got {self.tgt_vocab_size}")
        if self.src_lang == self.tgt_lang:
            raise UserError(f"source and target language are both {self.src_lang!r}")


@dataclass
class PrepareResult:
    out_dir: Path
    manifest: dict
    up_to_date: bool
    seconds: float = 0.0


def _describe_sources(splits: Mapping[str, ParallelSource]) -> dict[str, dict]:
    out = {}
    for name, source in splits.items():
        roles = ("src", "tgt") if source.tgt is not None else ("tsv",)
        files = [{"role": role, "path": str(p.resolve()), "sha256": sha256_file(p),
                  "bytes": p.stat().st_size} for role, p in zip(roles, source.files)]
        out[name] = {"kind": source.kind, "files": files}
    return out


def _fingerprint(options: PrepareOptions, sources: dict[str, dict]) -> str:
    """Hash of everything that decides the output: options and input contents (not their paths)."""
    key = {
        "format": [FORMAT, FORMAT_VERSION],
        # an unset target size is left out, so datasets made before the option keep their key
        "options": {k: v for k, v in options.__dict__.items()
                    if not (k == "tgt_vocab_size" and v is None)},
        "inputs": {split: [(f["role"], f["sha256"]) for f in s["files"]] for split, s in sources.items()},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _check_out_dir(out: Path, fingerprint: str, overwrite: bool) -> dict | None:
    """The existing manifest if `out` is an up-to-date dataset; None if we may (re)build it."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    if not (out / "manifest.json").exists():
        if any(out.iterdir()):
            raise UserError(f"{out} exists and is not an aiayn dataset; refusing to replace it "
                            f"(choose another --out)")
        return None
    try:
        manifest = read_manifest(out)
    except UserError:
        manifest = None
    if manifest is not None and manifest.get("fingerprint") == fingerprint and is_complete(out, manifest):
        return manifest
    if not overwrite:
        raise UserError(f"{out} holds a dataset made from other inputs or options; "
                        f"pass --overwrite to replace it, or choose another --out")
    return None


def _save_array(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())


def _write_lines(path: Path, lines: list[str]) -> None:
    with atomic_write(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))


def prepare_dataset(
    out_dir: str | Path,
    splits: Mapping[str, ParallelSource],
    options: PrepareOptions,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
) -> PrepareResult:
    """Build a dataset directory from raw corpora; `splits` must include "train" (the only split
    that is cleaned and that the vocabulary is learned from). Up-to-date outputs are reused."""
    t0 = time.perf_counter()
    say = log or (lambda msg: None)
    out = Path(out_dir)
    options.check()
    if "train" not in splits:
        raise UserError("a training corpus is required (--train)")
    for name in splits:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise UserError(f"split name {name!r} should be letters, digits, '_' or '-'")

    sources = _describe_sources(splits)
    fingerprint = _fingerprint(options, sources)
    existing = _check_out_dir(out, fingerprint, overwrite)
    if existing is not None:
        return PrepareResult(out, existing, up_to_date=True, seconds=time.perf_counter() - t0)

    # Read and check every input before anything is written.
    texts: dict[str, tuple[list[str], list[str]]] = {}
    for name, source in splits.items():
        say(f"reading {name}: {', '.join(str(p) for p in source.files)}")
        texts[name] = source.read()
    if not texts["train"][0]:
        raise UserError(f"the training corpus {splits['train'].src} is empty")

    with exclusive_lock(out, "aiayn prepare", "wait for it to finish, or choose another --out"):
        # again, now that no other prepare can change it
        existing = _check_out_dir(out, fingerprint, overwrite)
        if existing is not None:
            return PrepareResult(out, existing, up_to_date=True, seconds=time.perf_counter() - t0)
        built: list[dict] = []
        write_dir_atomically(out, lambda tmp: built.append(
            _build(tmp, texts, options, sources, fingerprint, say)))
    return PrepareResult(out, built[0], up_to_date=False, seconds=time.perf_counter() - t0)


def _learn_vocab(
    tmp: Path, src: list[str], tgt: list[str], options: PrepareOptions, say
) -> tuple[dict, dict]:
    """Train the tokenizer(s) on training text (§5.1), save them in `tmp`; (tokenizers, manifest
    entry) keyed by side."""
    kind = "separate" if options.separate_vocab else "shared"
    say(f"learning a {kind} {options.model_type} vocabulary of {options.vocab_size} pieces "
        f"from {len(src)} training pairs")
    src_tok, tgt_tok = train_tokenizers(
        src, tgt, options.vocab_size, options.model_type, separate=options.separate_vocab,
        tgt_model_type=options.tgt_model_type, tgt_vocab_size=options.tgt_vocab_size,
        byte_fallback=options.byte_fallback, character_coverage=options.character_coverage,
    )
    toks = {"src": src_tok, "tgt": tgt_tok}
    vocab = {}
    for side in SIDES:
        name = f"{side}.spm.model" if options.separate_vocab else "spm.model"
        if not (tmp / name).exists():
            toks[side].save(tmp / name)
        vocab[side] = {"file": name, "size": toks[side].vocab_size,
                       "sha256": hashlib.sha256(toks[side].model_proto).hexdigest()}
    return toks, vocab


def _filter_train(enc: dict, options: PrepareOptions) -> tuple[dict, dict]:
    """Drop training pairs too long or too lopsided in subword tokens; (kept encodings, counts),
    each pair counted under its first reason."""
    too_long, bad_ratio = length_filters(enc["src"][1], enc["tgt"][1], options.max_len, options.max_ratio)
    bad_ratio &= ~too_long
    keep = ~(too_long | bad_ratio)
    if not keep.any():
        raise UserError("every training pair was filtered out; check --max-len and --max-ratio")
    kept = {side: select(*enc[side], keep) for side in SIDES}
    return kept, {"too_long": int(too_long.sum()), "length_ratio": int(bad_ratio.sum())}


def _write_split(tmp: Path, name: str, enc: dict, raw: tuple[list[str], list[str]] | None) -> dict:
    """Write one split's ids and offsets (and raw lines for dev/test); its token statistics."""
    info = {}
    for side in SIDES:
        flat, lengths = enc[side]
        _save_array(tmp / ids_file(name, side), flat)
        _save_array(tmp / idx_file(name, side), offsets_of(lengths))
        info[f"{side}_tokens"] = int(lengths.sum())
        info[f"max_{side}_len"] = int(lengths.max(initial=0))
    if raw is not None:
        for side, lines in zip(SIDES, raw):
            _write_lines(tmp / text_file(name, side), lines)
    return info


def _build(tmp: Path, texts: dict, options: PrepareOptions, sources: dict, fingerprint: str, say) -> dict:
    import sentencepiece

    from aiayn import __version__

    train_src, train_tgt = texts["train"]
    empty = empty_pairs(train_src, train_tgt)
    nul = nul_pairs(train_src, train_tgt) & ~empty  # binary junk, or text of another encoding
    dropped = empty | nul
    kept_src = [s for s, e in zip(train_src, dropped) if not e]
    kept_tgt = [t for t, e in zip(train_tgt, dropped) if not e]
    if not kept_src:
        raise UserError(f"every training pair has an empty side or a NUL byte ({len(train_src)} pairs)")
    for name, (src, tgt) in texts.items():
        n = int(nul_pairs(src, tgt).sum()) if name != "train" else 0
        if n:
            say(f"warning: {name}: {n} pair(s) hold NUL bytes (kept: dev and test sets are never filtered)")
    toks, vocab = _learn_vocab(tmp, kept_src, kept_tgt, options, say)

    split_info: dict[str, dict] = {}
    for name, raw in texts.items():
        is_train = name == "train"
        lines = (kept_src, kept_tgt) if is_train else raw
        enc = {side: encode_lines(toks[side], side_lines, token_dtype(toks[side].vocab_size),
                                  progress=f"encoding {name}.{side}")
               for side, side_lines in zip(SIDES, lines)}
        filtered = None
        if is_train:
            enc, counts = _filter_train(enc, options)
            filtered = {"empty": int(empty.sum()), "nul": int(nul.sum()), **counts}
        split_info[name] = {
            "pairs": len(enc["src"][1]), "input_pairs": len(raw[0]), "filtered": filtered,
            "raw_text": not is_train, **sources[name],
            **_write_split(tmp, name, enc, None if is_train else raw),
        }

    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "src_lang": options.src_lang,
        "tgt_lang": options.tgt_lang,
        "shared_vocab": not options.separate_vocab,
        "vocab": vocab,
        "options": options.__dict__,
        "splits": split_info,
        "software": {"aiayn": __version__, "sentencepiece": sentencepiece.__version__,
                     "numpy": np.__version__},
    }
    with atomic_write(tmp / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return manifest


def format_summary(result: PrepareResult) -> str:
    """A few lines a person can read: pairs kept/filtered, vocabulary, tokens, time."""
    m = result.manifest
    if result.up_to_date:
        head = f"{result.out_dir} is up to date (same inputs and options); nothing to do"
    else:
        head = f"prepared {result.out_dir} in {result.seconds:.1f}s"
    v = m["vocab"]
    if m["shared_vocab"]:
        vocab = (f"shared {m['options']['model_type']} vocabulary of {v['src']['size']} pieces "
                 f"({v['src']['file']})")
    else:
        o = m["options"]
        vocab = (f"separate vocabularies: {m['src_lang']} {o['model_type']} {v['src']['size']}, "
                 f"{m['tgt_lang']} {o.get('tgt_model_type') or o['model_type']} {v['tgt']['size']} pieces")
    lines = [head, f"  {m['src_lang']}->{m['tgt_lang']}, {vocab}"]
    for name, s in m["splits"].items():
        line = f"  {name}: {s['pairs']} pairs, {s['src_tokens']} src / {s['tgt_tokens']} tgt tokens"
        if s["filtered"] is not None:
            f = s["filtered"]
            line += (f"; filtered {s['input_pairs'] - s['pairs']} of {s['input_pairs']} (empty {f['empty']},"
                     f" NUL bytes {f.get('nul', 0)}, too long {f['too_long']}, length ratio "
                     f"{f['length_ratio']})")
        lines.append(line)
    return "\n".join(lines)
