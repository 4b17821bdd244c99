"""Writing a dataset's shards (file names and reading in `aiayn.data.dataset`), and the work
directory where `aiayn prepare` builds a dataset: each shard's files are written atomically, then
recorded with their sha256 in `progress.json`, so that an interrupted run finds what it may keep.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from aiayn.data.dataset import idx_file, ids_file
from aiayn.data.encode import EncodedChunk
from aiayn.checks import sha256_file
from aiayn.files import atomic_write

PROGRESS_FILE = "progress.json"


def work_dir(out: Path) -> Path:
    """Where the dataset `out` is built before it is renamed into place, and where an interrupted
    run resumes: a hidden sibling, `.NAME.partial`."""
    return out.parent / f".{out.name}.partial"


def save_progress(work: Path, state: dict) -> None:
    with atomic_write(work / PROGRESS_FILE) as f:
        json.dump(state, f, indent=1)


def load_progress(work: Path) -> dict | None:
    """The progress an earlier run recorded in `work`, if it is there, readable, and its
    vocabulary files are intact; else None."""
    try:
        state = json.loads((work / PROGRESS_FILE).read_text(encoding="utf-8"))
        for v in state["vocab"].values():
            if hashlib.sha256((work / v["file"]).read_bytes()).hexdigest() != v["sha256"]:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return state


def intact_shards(work: Path, shards: list[dict]) -> list[dict]:
    """The leading `shards` whose files are all in `work` with their recorded sha256."""
    intact = []
    for shard in shards:
        if not all((work / f).is_file() and sha256_file(work / f) == h for f, h in shard["files"].items()):
            break
        intact.append(shard)
    return intact


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """int64 offsets [0, l0, l0+l1, ...] of length len(lengths)+1."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


class _HashingWriter:
    """A write-only file wrapper that hashes what passes through (np.save writes through it)."""

    def __init__(self, f):
        self.f, self.sha = f, hashlib.sha256()

    def write(self, data) -> int:
        self.sha.update(data)
        return self.f.write(data)


def save_array(path: Path, arr: np.ndarray) -> str:
    """Write `arr` as .npy atomically; its sha256."""
    with atomic_write(path, "wb") as f:
        w = _HashingWriter(f)
        np.save(w, arr)
    return w.sha.hexdigest()


def write_shard(work: Path, split: str, shard: int, enc: EncodedChunk) -> dict:
    """One shard's ids and offsets; its manifest entry (pairs, tokens, longest sentence per side,
    and the sha256 of each file)."""
    entry: dict = {"pairs": len(enc), "files": {}}
    for side, ids, lengths in (("src", enc.src_ids, enc.src_len), ("tgt", enc.tgt_ids, enc.tgt_len)):
        for name, arr in ((ids_file(split, side, shard), ids), (idx_file(split, side, shard), offsets_of(lengths))):
            entry["files"][name] = save_array(work / name, arr)
        entry[f"{side}_tokens"] = int(lengths.sum(dtype=np.int64))
        entry[f"max_{side}_len"] = int(lengths.max(initial=0))
    return entry
