"""Binarized parallel datasets: what `aiayn prepare` writes and what training reads.

A dataset directory holds:
- `manifest.json`: format version, languages, vocabulary, options, per-split sizes, filter counts
  and the source files with their sha256 (which also decide whether a re-run is up to date);
- `spm.model` (shared vocabulary, §3.4) or `src.spm.model` + `tgt.spm.model` (separate);
- per split, shard and side (`src`, `tgt`): `{split}.{shard:05d}.{side}.ids.npy`, every sentence's
  subword ids concatenated (uint16 when the vocabulary fits, else int32; no specials), and
  `{split}.{shard:05d}.{side}.idx.npy`, int64 offsets of length pairs+1 (sentence i of the shard is
  ids[idx[i]:idx[i+1]]); both are `.npy` files so their dtype travels with them, and they are read
  memory-mapped. A split's pairs are its shards' pairs in order; the manifest lists each shard
  with its pairs, tokens and the sha256 of its files;
- for dev and test splits, `{split}.src.txt` and `{split}.tgt.txt`: the raw lines, one per input
  line, for scoring BLEU against untokenized references (read them with `read_split_text`).

Format versions: 2 is the sharded layout above. Version 1 (one unsharded `{split}.{side}.ids.npy`
and `.idx.npy` per split, no shard list) is still read, as a split of one shard.

`aiayn.data.prepare` writes these directories; this module names their files and reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from aiayn.checks import check_schema, read_json
from aiayn.config import Config
from aiayn.data.corpus import read_lines
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError

FORMAT = "aiayn-dataset"
FORMAT_VERSION = 2  # the layout; version 1 is still read (see the module docstring)
READABLE_VERSIONS = (1, 2)
SIDES = ("src", "tgt")


# --- file names ---------------------------------------------------------------------------------


def ids_file(split: str, side: str, shard: int | None = None) -> str:
    """The ids file of a split's shard (`shard` None: format 1's one file per split)."""
    return f"{split}.{side}.ids.npy" if shard is None else f"{split}.{shard:05d}.{side}.ids.npy"


def idx_file(split: str, side: str, shard: int | None = None) -> str:
    return f"{split}.{side}.idx.npy" if shard is None else f"{split}.{shard:05d}.{side}.idx.npy"


def text_file(split: str, side: str) -> str:
    return f"{split}.{side}.txt"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


_VOCAB = {"file": str, "size": int, "?sha256": str}
_FILTERED = {"empty": int, "too_long": int, "length_ratio": int, "?nul": int}
_COUNTS = ("pairs", "src_tokens", "tgt_tokens", "max_src_len", "max_tgt_len")
_SHARD = {**dict.fromkeys(_COUNTS, int), "files": {str: str}}
_SPLIT = {**dict.fromkeys(_COUNTS, int), "input_pairs": int, "filtered": (_FILTERED, None),
          "raw_text": bool}
# What aiayn reads from manifest.json (aiayn.checks.check_schema); prepare writes more (sources, software).
MANIFEST_SCHEMA = {
    "format": str, "version": int, "?fingerprint": str, "src_lang": str, "tgt_lang": str,
    "shared_vocab": bool, "vocab": {"src": _VOCAB, "tgt": _VOCAB},
    "options": {"model_type": str, "?tgt_model_type": (str, None)}, "splits": {str: _SPLIT},
}
# Format 2: each split lists its shards.
MANIFEST_SCHEMA_V2 = {**MANIFEST_SCHEMA, "splits": {str: {**_SPLIT, "shards": [_SHARD]}}}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def read_manifest(directory: str | Path) -> dict:
    """A dataset's manifest.json, checked: every field aiayn reads has its type, file names stay
    inside the directory, counts are non-negative."""
    path = Path(directory) / "manifest.json"
    if not path.exists():
        raise UserError(f"{directory}: not a prepared dataset (no manifest.json); run aiayn prepare")
    manifest = read_json(path)
    check_schema(manifest, {"format": str, "version": int}, str(path))
    if manifest["format"] != FORMAT:
        raise UserError(f"{path}: not an aiayn dataset manifest")
    if manifest["version"] not in READABLE_VERSIONS:
        raise UserError(f"{path}: dataset format version {manifest['version']}, this aiayn reads "
                        f"{', '.join(map(str, READABLE_VERSIONS))}; re-run aiayn prepare")
    check_schema(manifest, MANIFEST_SCHEMA if manifest["version"] == 1 else MANIFEST_SCHEMA_V2, str(path))
    for side, v in manifest["vocab"].items():
        if not _PLAIN_NAME.fullmatch(v["file"]) or v["file"].startswith("."):
            raise UserError(f"{path}: field 'vocab.{side}.file' must be a file name in the "
                            f"dataset directory, got {v['file']!r}")
    for name, info in manifest["splits"].items():
        if not _PLAIN_NAME.fullmatch(name) or name.startswith("."):
            raise UserError(f"{path}: split name {name!r} is not a plain name")
        for k in ("input_pairs", *_COUNTS):
            if info[k] < 0:
                raise UserError(f"{path}: field 'splits.{name}.{k}' must be >= 0, got {info[k]}")
        if manifest["version"] >= 2:
            _check_shards(info, f"{path}: field 'splits.{name}.shards'")
    return manifest


def _check_shards(info: dict, where: str) -> None:
    """A format-2 split's shard list: at least one shard, counts >= 0, adding up to the split's."""
    shards = info["shards"]
    if not shards:
        raise UserError(f"{where} lists no shards")
    for i, shard in enumerate(shards):
        for k in _COUNTS:
            if shard[k] < 0:
                raise UserError(f"{where}[{i}].{k} must be >= 0, got {shard[k]}")
    for k in ("pairs", "src_tokens", "tgt_tokens"):
        total = sum(s[k] for s in shards)
        if total != info[k]:
            raise UserError(f"{where}: the shards' {k} add up to {total}, the split says {info[k]}")


def shard_numbers(manifest: dict, split: str) -> list[int | None]:
    """The shards of a split as `ids_file`'s `shard` argument ([None] for a format 1 dataset)."""
    if manifest["version"] == 1:
        return [None]
    return list(range(len(manifest["splits"][split]["shards"])))


def expected_files(manifest: dict) -> list[str]:
    files = sorted({v["file"] for v in manifest["vocab"].values()})
    for split, info in manifest["splits"].items():
        for shard in shard_numbers(manifest, split):
            for side in SIDES:
                files += [ids_file(split, side, shard), idx_file(split, side, shard)]
        if info["raw_text"]:
            files += [text_file(split, side) for side in SIDES]
    return files


def is_complete(directory: Path, manifest: dict) -> bool:
    return all((directory / f).is_file() for f in expected_files(manifest))


# --- reading ------------------------------------------------------------------------------------


@dataclass
class DatasetInfo:
    """A dataset directory's manifest and tokenizers (the same object twice when shared)."""

    directory: Path
    manifest: dict
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    splits: list[str] = field(default_factory=list)

    @property
    def shared_vocab(self) -> bool:
        return self.src_tokenizer is self.tgt_tokenizer

    def split(self, name: str) -> "ParallelDataset":
        """One split, memory-mapped (a one-line error names the splits there are)."""
        return ParallelDataset(self.directory, name, info=self)

    def model_config(self, cfg: Config) -> Config:
        """`cfg` with the vocabulary sizes of this dataset's tokenizer(s) (§3.4: one shared
        vocabulary ties the embeddings; separate ones cannot be tied)."""
        if self.shared_vocab:
            return replace(cfg, vocab_size=self.src_tokenizer.vocab_size, tgt_vocab_size=0)
        return replace(cfg, vocab_size=self.src_tokenizer.vocab_size,
                       tgt_vocab_size=self.tgt_tokenizer.vocab_size, tie_embeddings=False)


def load_dataset_dir(directory: str | Path) -> DatasetInfo:
    """Manifest and tokenizers of a prepared dataset (what the trainer needs besides the splits)."""
    d = Path(directory)
    if not d.is_dir():
        raise UserError(f"{d}: no such dataset directory; run aiayn prepare")
    manifest = read_manifest(d)
    vocab = manifest["vocab"]
    src = Tokenizer.load(d / vocab["src"]["file"])
    tgt = src if manifest["shared_vocab"] else Tokenizer.load(d / vocab["tgt"]["file"])
    for side, tok in (("src", src), ("tgt", tgt)):
        if tok.vocab_size != vocab[side]["size"]:
            raise UserError(f"{d / 'manifest.json'}: field 'vocab.{side}.size' is "
                            f"{vocab[side]['size']}, but {tok.path} has {tok.vocab_size} pieces")
    return DatasetInfo(d, manifest, src, tgt, list(manifest["splits"]))


def _check_split(info: DatasetInfo, split: str) -> dict:
    if split not in info.manifest["splits"]:
        raise UserError(f"{info.directory}: no split {split!r}; it has {', '.join(info.splits)}")
    return info.manifest["splits"][split]


def _load_array(path: Path) -> np.ndarray:
    """A one-dimensional integer array from a .npy file, memory-mapped (never unpickled)."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{path}: missing from the dataset; re-run aiayn prepare") from None
    except (ValueError, OSError, EOFError) as e:  # object arrays, damaged headers, truncation
        reason = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise UserError(f"{path}: not a valid .npy array ({reason}); re-run aiayn prepare") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "iu":
        shape = getattr(arr, "shape", "?")
        raise UserError(f"{path}: expected a one-dimensional integer array, found {arr.dtype} "
                        f"of shape {shape}; re-run aiayn prepare")
    return arr


def check_split_arrays(ids: np.ndarray, offsets: np.ndarray, vocab_size: int, pairs: int,
                       where: str) -> None:
    """One side of a split: offsets start at 0, never decrease, end at len(ids), number pairs+1;
    every id is a piece of the vocabulary. A one-line UserError naming `where` otherwise."""
    if len(offsets) != pairs + 1:
        raise UserError(f"{where}: {len(offsets) - 1} sentences, the manifest says {pairs}; "
                        f"re-run aiayn prepare")
    if offsets[0] != 0 or offsets[-1] != len(ids) or (np.diff(offsets) < 0).any():
        raise UserError(f"{where}: sentence offsets do not fit the token ids; re-run aiayn prepare")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise UserError(f"{where}: token ids outside the vocabulary of {vocab_size} pieces; "
                        f"re-run aiayn prepare")


def read_split_text(directory: str | Path | DatasetInfo, split: str, side: str = "tgt") -> list[str]:
    """The raw (untokenized) lines of a dev/test split, e.g. BLEU references (side="tgt")."""
    info = directory if isinstance(directory, DatasetInfo) else load_dataset_dir(directory)
    if side not in SIDES:
        raise ValueError(f"side must be 'src' or 'tgt', got {side!r}")
    if not _check_split(info, split)["raw_text"]:
        raise UserError(f"{info.directory}: split {split!r} keeps no raw text (only dev/test splits do)")
    return read_lines(info.directory / text_file(split, side))


class ConcatArray:
    """Several 1-D arrays read as their concatenation (a split's shards), copying nothing: each
    part stays memory-mapped. Supports `len`, integer and integer-array indexing (what `collate`'s
    gather uses) and slices. `shift[j]`, when given, is added to the values of part j (shards'
    offsets, each counted from its own first token)."""

    def __init__(self, parts: list[np.ndarray], shift: list[int] | None = None):
        self.parts = parts
        self.starts = np.zeros(len(parts) + 1, np.int64)  # index of each part's first element
        np.cumsum([len(p) for p in parts], out=self.starts[1:])
        self.shift = None if shift is None else np.asarray(shift, np.int64)
        self.dtype = np.dtype(np.int64) if shift is not None else np.result_type(*parts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _part(self, j: int, local: np.ndarray | slice) -> np.ndarray:
        values = self.parts[j][local]
        return values if self.shift is None else values + self.shift[j]

    def __getitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            j = int(np.searchsorted(self.starts, start, side="right")) - 1
            if step == 1 and 0 <= j < len(self.parts) and stop <= self.starts[j + 1]:  # within one part
                return self._part(j, slice(start - self.starts[j], max(stop, start) - self.starts[j]))
            key = np.arange(start, stop, step)
        idx = np.asarray(key, np.int64)
        flat = np.where(idx < 0, idx + n, idx).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise IndexError(f"index out of range for {n} elements")
        part = np.searchsorted(self.starts, flat, side="right") - 1
        out = np.empty(flat.shape, self.dtype)
        for j in np.unique(part):
            m = part == j
            out[m] = self._part(int(j), flat[m] - self.starts[j])
        return out.reshape(idx.shape) if idx.ndim else out[0]


def _read_side(d: Path, split: str, side: str, shards: list[int | None], pairs: list[int],
               vocab_size: int) -> tuple[np.ndarray | ConcatArray, np.ndarray | ConcatArray, np.ndarray]:
    """(ids, offsets, lengths) of one side of a split whose shards hold `pairs` pairs each, checked
    (`check_split_arrays`): ids and offsets memory-mapped (across shards, `ConcatArray` views),
    lengths int32 in memory (4 bytes a sentence)."""
    ids = [_load_array(d / ids_file(split, side, k)) for k in shards]
    offsets = [_load_array(d / idx_file(split, side, k)) for k in shards]
    for k, i, o, n in zip(shards, ids, offsets, pairs):
        shard = "" if len(shards) == 1 else f", shard {k}"
        check_split_arrays(i, o, vocab_size, n, f"{d}: split {split!r} ({side}{shard})")
    lengths = np.concatenate([np.diff(o).astype(np.int32) for o in offsets])
    if len(shards) == 1:
        return ids[0], offsets[0], lengths
    tokens_before = np.concatenate([[0], np.cumsum([len(i) for i in ids])[:-1]])
    # each shard's offsets without its last entry (the next shard's first), the last shard whole
    view = ConcatArray([o[:-1] for o in offsets[:-1]] + [offsets[-1]], shift=tokens_before.tolist())
    return ConcatArray(ids), view, lengths


class ParallelDataset:
    """One split of a prepared dataset, memory-mapped. `ds[i] -> (src ids, tgt ids)` as numpy
    arrays of subword ids without specials; `src_lengths`/`tgt_lengths` are int32 arrays (the
    only per-pair data held in memory); `src_ids`/`src_offsets` (and tgt) index the split as one
    concatenated array whatever its shards (see `collate`)."""

    def __init__(self, directory: str | Path, split: str = "train", info: DatasetInfo | None = None):
        self.info = info or load_dataset_dir(directory)
        self.directory = self.info.directory
        self.split = split
        self.split_info = _check_split(self.info, split)
        d = self.directory
        shards = shard_numbers(self.manifest, split)
        pairs = [s["pairs"] for s in self.split_info["shards"]] if self.manifest["version"] >= 2 \
            else [self.split_info["pairs"]]
        self.src_ids, self.src_offsets, self.src_lengths = _read_side(
            d, split, "src", shards, pairs, self.info.src_tokenizer.vocab_size)
        self.tgt_ids, self.tgt_offsets, self.tgt_lengths = _read_side(
            d, split, "tgt", shards, pairs, self.info.tgt_tokenizer.vocab_size)

    @property
    def manifest(self) -> dict:
        return self.info.manifest

    @property
    def src_tokenizer(self) -> Tokenizer:
        return self.info.src_tokenizer

    @property
    def tgt_tokenizer(self) -> Tokenizer:
        return self.info.tgt_tokenizer

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"pair {i} out of range for {n} pairs")
        i %= n
        src = np.asarray(self.src_ids[int(self.src_offsets[i]) : int(self.src_offsets[i + 1])])
        tgt = np.asarray(self.tgt_ids[int(self.tgt_offsets[i]) : int(self.tgt_offsets[i + 1])])
        return src, tgt

    def text(self, i: int) -> tuple[str, str]:
        """Pair i decoded back to text."""
        src, tgt = self[i]
        return self.src_tokenizer.decode(src.tolist()), self.tgt_tokenizer.decode(tgt.tolist())

    def reference_lines(self, side: str = "tgt") -> list[str]:
        """The raw lines of this (dev/test) split; see `read_split_text`."""
        return read_split_text(self.info, self.split, side)

    def __repr__(self) -> str:
        return f"ParallelDataset({str(self.directory)!r}, {self.split!r}, pairs={len(self)})"

    # Memory maps and sentencepiece processors do not pickle well: reopen in the new process.
    def __getstate__(self) -> dict:
        return {"directory": str(self.directory), "split": self.split}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"], state["split"])
