"""`aiayn prepare`'s work: raw parallel corpora -> a binarized dataset directory (layout in
`aiayn.data.dataset`), at any size in bounded memory, resumably.

1. Check. Every input is read, streamed, before anything is written: UTF-8 (text that is mostly
   NUL bytes, UTF-16 or binary, is refused), line counts, TSV fields. Dev and test splits (small) are kept in memory. While the training corpus streams by,
   a seeded uniform sample of at most `vocab_sample` of its pairs is drawn (`encode.PairReservoir`,
   the role of sentencepiece's `input_sentence_size`).
2. Vocabulary. Sentencepiece learns it from the sample's pairs without an empty side, in corpus
   order (§5.1; one model shared by both languages by default, §3.4). A corpus of at most
   `vocab_sample` pairs is learned from whole.
3. Encoding. The training corpus streams again in chunks, encoded over worker processes
   (`encode.ChunkEncoder`) and cleaned: pairs with an empty side, a NUL byte (binary junk), too
   long, or too lopsided in subword tokens are dropped, each counted in the manifest and the
   summary. It is written in shards of `shard_pairs` input pairs. Dev and test splits are encoded
   whole, every line kept, in order (pairs with NUL bytes too, with a warning).
4. Resuming. Everything is written into a work directory beside the output, `.NAME.partial`, each
   shard atomically and then recorded in its `progress.json`. A killed run started again with the
   same inputs and options keeps the vocabulary and the finished shards. When every split is
   written, the manifest goes in and the directory is renamed into place, so a reader sees either
   nothing or a complete dataset. An error in the inputs or options removes the work directory;
   an I/O failure (disk full) keeps it, to resume once the cause is fixed.
5. One writer. While it checks and writes, `prepare_dataset` holds the output's lock
   (`aiayn.locks.exclusive_lock`): a second prepare into the same directory (or its work directory)
   meanwhile is refused.

Memory: the sample while the vocabulary is learned, then one shard's ids and a few chunks in
flight; never the corpus (benchmarks/prepare_scale.py measures it).

A fingerprint of the options and of the inputs' sha256 (not their paths) is stored in the manifest:
the same inputs and options into an existing dataset are reported up to date and reused; anything
else there is refused unless `overwrite` (and a directory that is not an aiayn dataset is never
replaced). The fingerprint covers what decides the ids, not the layout: a format-1 dataset made
from the same inputs and options is up to date too.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import sentencepiece

from aiayn import __version__
from aiayn.checks import sha256_file
from aiayn.data.corpus import ParallelSource, empty_pairs, nul_pairs
from aiayn.data.dataset import (
    FORMAT,
    FORMAT_VERSION,
    SIDES,
    is_complete,
    read_manifest,
    text_file,
    token_dtype,
)
from aiayn.data.encode import FILTERS, ChunkEncoder, EncodedChunk, PairReservoir, clean, encode_chunk
from aiayn.data.model_dir import (
    CONFIG_FILE,
    SHARED_SPM,
    WEIGHTS_FILE,
    tokenizer_files,
    vocabulary_sha256,
)
from aiayn.data.shards import (
    PROGRESS_FILE,
    intact_shards,
    load_progress,
    save_progress,
    work_dir,
    write_shard,
)
from aiayn.data.tokenizer import Tokenizer, train_tokenizers
from aiayn.data.vocab_fit import check_fit
from aiayn.errors import OutputError, UserError
from aiayn.files import atomic_write, publish_dir, writing
from aiayn.locks import exclusive_lock
from aiayn.progress import Progress

CHUNK_PAIRS = 10_000  # pairs per encoding task
SHARD_PAIRS = 1_000_000  # input pairs per training shard (~120 MB of ids for WMT sentences)
# Version of what the ids mean, in the fingerprint; the layout (FORMAT_VERSION) may change without it
CONTENT_VERSION = 1


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
    # training pairs the vocabulary is learned from, a seeded uniform sample (0: every pair).
    # Sentencepiece's BPE time and memory grow with its input: on text as varied as WMT's, a
    # 37,000-piece vocabulary learned from 1M pairs peaked at 2.87 GB, from 500,000 pairs (a
    # million sentences) at 1.87 GB (docs/experiments/wmt.md).
    vocab_sample: int = 500_000
    # A model directory whose sentencepiece model(s) encode the data instead of a vocabulary
    # learned from it (`aiayn prepare --vocab-from`): new data for fine-tuning that model
    # (`aiayn train --init-from`). Shared or separate as the model's; the vocabulary options go
    # unused. Its files' checksum, not its path, counts in the fingerprint.
    vocab_from: str | None = None

    def check(self) -> None:
        if self.vocab_size < 5:
            raise UserError(f"--vocab-size must be at least 5, got {self.vocab_size}")
        if self.max_len < 0 or self.max_ratio < 0:
            raise UserError("--max-len and --max-ratio must be >= 0 (0 disables the filter)")
        if self.max_ratio and self.max_ratio < 1:
            raise UserError(f"--max-ratio must be >= 1 (or 0 to disable), got {self.max_ratio}")
        if self.vocab_sample < 0:
            raise UserError(f"--vocab-sample must be >= 0 (0: every pair), got {self.vocab_sample}")
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

    def samples(self, train_pairs: int) -> bool:
        """Whether the vocabulary of a corpus of `train_pairs` pairs is learned from a sample."""
        return 0 < self.vocab_sample < train_pairs


@dataclass
class PrepareResult:
    out_dir: Path
    manifest: dict
    up_to_date: bool
    seconds: float = 0.0
    resumed_shards: int = 0  # training shards kept from an interrupted run


def _describe_sources(splits: Mapping[str, ParallelSource]) -> dict[str, dict]:
    out = {}
    for name, source in splits.items():
        roles = ("src", "tgt") if source.tgt is not None else ("tsv",)
        files = [{"role": role, "path": str(p.resolve()), "sha256": sha256_file(p),
                  "bytes": p.stat().st_size} for role, p in zip(roles, source.files)]
        out[name] = {"kind": source.kind, "files": files}
    return out


def fingerprint_options(options: PrepareOptions, train_pairs: int) -> dict:
    """The options as the fingerprint counts them. The sample size counts only when there is a
    sample, so a corpus learned from whole keeps the fingerprint it had before sampling existed;
    an unset target vocabulary size is left out, so datasets made before that option keep theirs."""
    opts = {k: v for k, v in options.__dict__.items()
            if k not in ("vocab_sample", "vocab_from") and not (k == "tgt_vocab_size" and v is None)}
    if options.samples(train_pairs) and not options.vocab_from:
        opts["vocab_sample"] = options.vocab_sample
    if options.vocab_from:
        opts["vocab_from"] = vocabulary_sha256(tokenizer_files(options.vocab_from))
    return opts


def _fingerprint(options: PrepareOptions, sources: dict[str, dict], train_pairs: int) -> str:
    """Hash of everything that decides the ids: options (`fingerprint_options`) and input contents
    (not their paths)."""
    key = {
        "format": [FORMAT, CONTENT_VERSION],
        "options": fingerprint_options(options, train_pairs),
        "inputs": {split: [(f["role"], f["sha256"]) for f in s["files"]] for split, s in sources.items()},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _check_out_dir(out: Path, options: PrepareOptions, sources: dict, overwrite: bool) -> dict | None:
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
    if manifest is not None and is_complete(out, manifest):
        wanted = _fingerprint(options, sources, manifest["splits"]["train"]["input_pairs"])
        if manifest.get("fingerprint") == wanted:
            return manifest
    if not overwrite:
        raise UserError(f"{out} holds a dataset made from other inputs or options; "
                        f"pass --overwrite to replace it, or choose another --out")
    return None


def _resumable(work: Path, options: PrepareOptions, sources: dict) -> dict | None:
    """The progress of an interrupted run of the same inputs and options in `work`, with the
    shards whose files are intact; None if there is nothing to resume."""
    state = load_progress(work)
    try:
        if state is None or state["fingerprint"] != _fingerprint(options, sources, state["train_pairs"]):
            return None
    except (KeyError, TypeError):
        return None
    state["shards"] = intact_shards(work, state["shards"])
    return state


# --- the steps ----------------------------------------------------------------------------------


def _learn_vocab(work: Path, src: list[str], tgt: list[str], options: PrepareOptions,
                 train_pairs: int, say) -> dict:
    """Train the tokenizer(s) (§5.1) and save them in `work`; their manifest entry by side."""
    kind = "separate" if options.separate_vocab else "shared"
    whence = f"a sample of {len(src)} of {train_pairs}" if options.samples(train_pairs) else f"{len(src)}"
    say(f"learning a {kind} {options.model_type} vocabulary of {options.vocab_size} pieces "
        f"from {whence} training pairs")
    src_tok, tgt_tok = train_tokenizers(
        src, tgt, options.vocab_size, options.model_type, separate=options.separate_vocab,
        tgt_model_type=options.tgt_model_type, tgt_vocab_size=options.tgt_vocab_size,
        byte_fallback=options.byte_fallback,
        character_coverage=options.character_coverage)
    vocab = {}
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        name = f"{side}.spm.model" if options.separate_vocab else "spm.model"
        tok.save(work / name)
        vocab[side] = {"file": name, "size": tok.vocab_size,
                       "sha256": hashlib.sha256(tok.model_proto).hexdigest()}
    return vocab


def _copy_vocab(work: Path, model_dir: Path, say) -> dict:
    """The sentencepiece model(s) of `model_dir` into `work`; their manifest entry by side."""
    files = tokenizer_files(model_dir)
    say(f"encoding with the vocabulary of {model_dir} ({', '.join(sorted(files))})")
    vocab = {}
    for side in ("src", "tgt"):
        name = SHARED_SPM if SHARED_SPM in files else f"{side}.spm.model"
        # read, then written as every output here (`atomic_write`): a failed write (disk full) is
        # one line naming the file written, not the model's file it was copied from
        tok = Tokenizer.load(files[name])
        tok.save(work / name)
        vocab[side] = {"file": name, "size": tok.vocab_size,
                       "sha256": hashlib.sha256(tok.model_proto).hexdigest()}
    return vocab


def _start(work: Path, source: ParallelSource, options: PrepareOptions, sources: dict,
           shard_pairs: int, chunk_pairs: int, progress: bool, say) -> dict:
    """Check the training corpus while sampling it, learn the vocabulary into a fresh `work`;
    the run's initial state."""
    say(f"checking {', '.join(str(p) for p in source.files)}")
    reservoir = PairReservoir(options.vocab_sample or None)
    with Progress(desc="checking train", unit="pairs", unit_scale=True, enabled=progress) as bar:
        for s, t in source.iter_chunks(chunk_pairs):
            reservoir.add(s, t)
            bar.update(len(s))
    n = reservoir.seen
    if n == 0:
        raise UserError(f"the training corpus {source.src} is empty")
    src, tgt = reservoir.pairs()
    del reservoir
    dropped = empty_pairs(src, tgt) | nul_pairs(src, tgt)  # what cleaning drops: never learned from
    src = [s for s, d in zip(src, dropped) if not d]
    tgt = [t for t, d in zip(tgt, dropped) if not d]
    if not src:
        raise UserError(f"every training pair has an empty side or a NUL byte ({n} pairs)")
    shutil.rmtree(work, ignore_errors=True)
    with writing(work):
        work.mkdir(parents=True)
    vocab = (_copy_vocab(work, Path(options.vocab_from), say) if options.vocab_from
             else _learn_vocab(work, src, tgt, options, n, say))
    if options.vocab_from:  # a vocabulary that splits the new data far finer is said in one line
        toks = {side: Tokenizer.load(work / v["file"]) for side, v in vocab.items()}
        warning = check_fit(options.vocab_from, toks, (src, tgt),
                            {"src": options.src_lang, "tgt": options.tgt_lang})
        if warning:
            say(warning)
    state = {"fingerprint": _fingerprint(options, sources, n), "train_pairs": n,
             "shard_pairs": shard_pairs, "vocab": vocab, "shards": []}
    save_progress(work, state)
    return state


def _encode_train(work: Path, state: dict, source: ParallelSource, toks: dict, options: PrepareOptions,
                  chunk_pairs: int, workers: int, progress: bool) -> None:
    """Encode, clean and write the training shards not yet in `state`, recording each."""
    n, shard_pairs, done = state["train_pairs"], state["shard_pairs"], len(state["shards"])
    chunk = math.gcd(shard_pairs, chunk_pairs)  # chunks never straddle shards
    chunks = source.iter_chunks(chunk)
    # read past what the finished shards hold (the last shard may be short: all of them may be done)
    for _ in range(math.ceil(min(done * shard_pairs, n) / chunk)):
        if next(chunks, None) is None:
            raise UserError(f"{source.src} changed while it was being read; run aiayn prepare again")
    dtypes = token_dtype(toks["src"].vocab_size), token_dtype(toks["tgt"].vocab_size)
    kept: list[EncodedChunk] = []
    counts = dict.fromkeys(FILTERS, 0)
    in_shard = 0
    with ChunkEncoder(toks["src"], toks["tgt"], workers if n - done * shard_pairs > chunk else 0) as encoder, \
            Progress(n, initial=done * shard_pairs, desc="encoding train", unit="pairs",
                     unit_scale=True, enabled=progress) as bar:
        for enc in encoder.map(chunks):
            good, c = clean(enc, options.max_len, options.max_ratio)
            kept.append(good)
            counts = {k: counts[k] + c[k] for k in counts}
            in_shard += len(enc)
            bar.update(len(enc))
            k = len(state["shards"])
            if in_shard == shard_pairs or k * shard_pairs + in_shard == n:
                entry = write_shard(work, "train", k, EncodedChunk.concatenate(kept, *dtypes))
                entry["input_pairs"] = [k * shard_pairs, k * shard_pairs + in_shard]
                entry["filtered"] = counts
                state["shards"].append(entry)
                save_progress(work, state)
                kept, in_shard = [], 0
                counts = dict.fromkeys(counts, 0)
    if len(state["shards"]) != math.ceil(n / shard_pairs) or in_shard:
        raise UserError(f"{source.src} changed while it was being read; run aiayn prepare again")


def _train_entry(state: dict, sources: dict, options: PrepareOptions) -> dict:
    shards = state["shards"]
    pairs = sum(s["pairs"] for s in shards)
    if pairs == 0:
        raise UserError("every training pair was filtered out; check --max-len and --max-ratio")
    filtered = {k: sum(s["filtered"].get(k, 0) for s in shards) for k in FILTERS}
    info = {"pairs": pairs, "input_pairs": state["train_pairs"], "filtered": filtered, "raw_text": False,
            **sources["train"]}
    for side in SIDES:
        info[f"{side}_tokens"] = sum(s[f"{side}_tokens"] for s in shards)
        info[f"max_{side}_len"] = max(s[f"max_{side}_len"] for s in shards)
    info["vocab_sample"] = options.vocab_sample if options.samples(state["train_pairs"]) else None
    return {**info, "shards": shards}


def _write_held_split(work: Path, name: str, raw: tuple[list[str], list[str]], toks: dict,
                      source: dict) -> dict:
    """A dev or test split: every line encoded, in order, one shard, plus the raw lines."""
    enc = encode_chunk(toks["src"], toks["tgt"], *raw, num_threads=min(8, os.cpu_count() or 1))
    shard = write_shard(work, name, 0, enc)
    for side, lines in zip(SIDES, raw):
        with atomic_write(work / text_file(name, side), "w") as f:
            f.write("".join(line + "\n" for line in lines))
    info = {k: v for k, v in shard.items() if k != "files"}
    return {**info, "input_pairs": len(raw[0]), "filtered": None, "raw_text": True, **source,
            "shards": [shard]}


def prepare_dataset(
    out_dir: str | Path,
    splits: Mapping[str, ParallelSource],
    options: PrepareOptions,
    overwrite: bool = False,
    log: Callable[[str], None] | None = None,
    *,
    workers: int | None = None,
    shard_pairs: int = SHARD_PAIRS,
    chunk_pairs: int = CHUNK_PAIRS,
    progress: bool = True,
) -> PrepareResult:
    """Build a dataset directory from raw corpora; `splits` must include "train" (the only split
    that is cleaned and that the vocabulary is learned from). Up-to-date outputs are reused; an
    interrupted run of the same inputs and options resumes. `workers` encoding processes (default:
    one per CPU core)."""
    t0 = time.perf_counter()
    say = log or (lambda msg: None)
    out = Path(out_dir)
    if options.vocab_from:  # shared or separate as the model's vocabulary is
        files = tokenizer_files(options.vocab_from)
        if not files:
            raise UserError(f"--vocab-from {options.vocab_from}: no sentencepiece model there "
                            f"(spm.model, or src.spm.model and tgt.spm.model): not an aiayn model "
                            f"directory")
        missing = [n for n in (CONFIG_FILE, WEIGHTS_FILE)
                   if not (Path(options.vocab_from) / n).is_file()]
        if missing:  # a dataset directory, say: its vocabulary trained no model
            raise UserError(f"--vocab-from {options.vocab_from}: not an aiayn model directory (no "
                            f"{' or '.join(missing)}); it takes the model to fine-tune, as aiayn "
                            f"train or aiayn average wrote it, whose vocabulary encodes the data")
        options = replace(options, separate_vocab=SHARED_SPM not in files)
    options.check()
    if "train" not in splits:
        raise UserError("a training corpus is required (--train)")
    for name in splits:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise UserError(f"split name {name!r} should be letters, digits, '_' or '-'")
    if shard_pairs < 1 or chunk_pairs < 1:
        raise UserError("shard and chunk sizes must be >= 1")

    sources = _describe_sources(splits)
    # The lock even when the output turns out up to date: taking it is what clears the lock file and
    # temporaries a killed earlier prepare left, and no other prepare changes `out` while we look.
    with exclusive_lock(out, "aiayn prepare", "wait for it to finish, or choose another --out"):
        existing = _check_out_dir(out, options, sources, overwrite)
        if existing is None:
            manifest, resumed = _build(out, splits, options, sources, say, workers=workers,
                                       shard_pairs=shard_pairs, chunk_pairs=chunk_pairs,
                                       progress=progress)
            return PrepareResult(out, manifest, up_to_date=False, seconds=time.perf_counter() - t0,
                                 resumed_shards=resumed)
    return PrepareResult(out, existing, up_to_date=True, seconds=time.perf_counter() - t0)


def _build(out: Path, splits: Mapping[str, ParallelSource], options: PrepareOptions, sources: dict,
           say, *, workers: int | None, shard_pairs: int, chunk_pairs: int, progress: bool) -> tuple[dict, int]:
    """Build (or resume) the dataset in its work directory and put it at `out`; (its manifest, the
    training shards kept from an interrupted run). The caller holds `out`'s lock."""
    held = {}  # dev and test: small, read (and checked) whole
    for name, source in splits.items():
        if name != "train":
            say(f"reading {name}: {', '.join(str(p) for p in source.files)}")
            held[name] = source.read()
            n = int(nul_pairs(*held[name]).sum())
            if n:
                say(f"warning: {name}: {n} pair(s) hold NUL bytes (kept: dev and test sets are never filtered)")
    work = work_dir(out)
    state = _resumable(work, options, sources)
    resumed = len(state["shards"]) if state else 0
    try:
        if state is None:
            state = _start(work, splits["train"], options, sources, shard_pairs, chunk_pairs, progress, say)
        else:
            say(f"resuming {work}: the vocabulary and {resumed} training shard(s) are done")
        toks = {side: Tokenizer.load(work / v["file"]) for side, v in state["vocab"].items()}
        if toks["tgt"] == toks["src"]:
            toks["tgt"] = toks["src"]
        workers = (os.cpu_count() or 1) if workers is None else workers
        say(f"encoding {state['train_pairs']} training pairs in shards of {state['shard_pairs']} "
            f"over {workers} worker process(es)")
        _encode_train(work, state, splits["train"], toks, options, chunk_pairs, workers, progress)
        split_info = {"train": _train_entry(state, sources, options)}
        for name, raw in held.items():
            split_info[name] = _write_held_split(work, name, raw, toks, sources[name])
        manifest = _manifest(state, options, split_info)
        with atomic_write(work / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=2, ensure_ascii=False)
            f.write("\n")
        (work / PROGRESS_FILE).unlink()
        publish_dir(work, out)
    except OutputError:
        raise  # an I/O failure (disk full): the finished shards are worth resuming
    except UserError:
        shutil.rmtree(work, ignore_errors=True)  # bad inputs or options: nothing worth resuming
        raise
    return manifest, resumed


def _manifest(state: dict, options: PrepareOptions, split_info: dict) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "fingerprint": state["fingerprint"],
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "src_lang": options.src_lang,
        "tgt_lang": options.tgt_lang,
        "shared_vocab": not options.separate_vocab,
        "vocab": state["vocab"],
        # unset options are left out, so datasets made before them keep their keys
        "options": {k: v for k, v in options.__dict__.items()
                    if not (k in ("tgt_vocab_size", "vocab_from") and v is None)},
        "splits": split_info,
        "software": {"aiayn": __version__, "sentencepiece": sentencepiece.__version__,
                     "numpy": np.__version__},
    }


def format_summary(result: PrepareResult) -> str:
    """A few lines a person can read: pairs kept/filtered, vocabulary, tokens, time."""
    m = result.manifest
    if result.up_to_date:
        head = f"{result.out_dir} is up to date (same inputs and options); nothing to do"
    else:
        resumed = f", resuming {result.resumed_shards} finished shard(s)" if result.resumed_shards else ""
        head = f"prepared {result.out_dir} in {result.seconds:.1f}s{resumed}"
    v = m["vocab"]
    if m["shared_vocab"]:
        vocab = (f"shared {m['options']['model_type']} vocabulary of {v['src']['size']} pieces "
                 f"({v['src']['file']})")
    else:
        o = m["options"]
        vocab = (f"separate vocabularies: {m['src_lang']} {o['model_type']} {v['src']['size']}, "
                 f"{m['tgt_lang']} {o.get('tgt_model_type') or o['model_type']} {v['tgt']['size']} pieces")
    sample = m["splits"]["train"].get("vocab_sample")
    if sample:
        vocab += f", learned from a sample of {sample} training pairs"
    lines = [head, f"  {m['src_lang']}->{m['tgt_lang']}, {vocab}"]
    for name, s in m["splits"].items():
        line = f"  {name}: {s['pairs']} pairs, {s['src_tokens']} src / {s['tgt_tokens']} tgt tokens"
        if len(s.get("shards", ())) > 1:
            line += f" in {len(s['shards'])} shards"
        if s["filtered"] is not None:
            f = s["filtered"]
            line += (f"; filtered {s['input_pairs'] - s['pairs']} of {s['input_pairs']} (empty {f['empty']},"
                     f" NUL bytes {f.get('nul', 0)}, too long {f['too_long']}, length ratio "
                     f"{f['length_ratio']})")
        lines.append(line)
    return "\n".join(lines)
