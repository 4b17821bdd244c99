"""The model directory: what `aiayn train` checkpoints, `aiayn average` writes and
`aiayn translate --model` reads. Self-contained: translating needs nothing else.

    config.json          the `Config` (architecture, recipe, decoding defaults)
    model.safetensors    the weights (shared matrices stored once)
    spm.model            the shared sentencepiece model, or src.spm.model + tgt.spm.model
    meta.json            facts about the model: languages, step, data, dev figures (`META_SCHEMA`
                         gives the fields aiayn writes; others may be added)

Directories are written to a temporary sibling and renamed into place, so a reader never sees a
half-written model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from aiayn.checks import read_json
from aiayn.config import Config
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.files import write_dir_atomically
from aiayn.model.build import build_model

CONFIG_FILE, WEIGHTS_FILE, META_FILE = "config.json", "model.safetensors", "meta.json"
SHARED_SPM, SRC_SPM, TGT_SPM = "spm.model", "src.spm.model", "tgt.spm.model"

# The fields of meta.json that aiayn writes, each optional (aiayn.checks.check_schema).
META_SCHEMA = {
    "?step": int, "?epoch": float, "?src_lang": (str, None), "?tgt_lang": (str, None),
    "?dataset": str, "?dataset_fingerprint": (str, None), "?dev": (dict, None),
    "?bleu_signature": (str, None), "?averaged_from": [str], "?vocabulary": str,
    "?init_from": str,
}


@dataclass
class LoadedModel:
    model: Any  # what aiayn.model.build_model makes (a Transformer by default), in eval mode
    cfg: Config
    src_tokenizer: Any  # aiayn.data.tokenizer.Tokenizer (the same object when shared)
    tgt_tokenizer: Any
    meta: dict = field(default_factory=dict)
    path: Path | None = None


def tokenizer_files(directory: str | os.PathLike) -> dict[str, Path]:
    """The sentencepiece files a model or dataset directory holds, by their standard names."""
    d = Path(directory)
    names = [SHARED_SPM] if (d / SHARED_SPM).exists() else [SRC_SPM, TGT_SPM]
    return {n: d / n for n in names if (d / n).exists()}


def vocabulary_sha256(files: dict[str, Path]) -> str:
    """One checksum of a model's or dataset's sentencepiece files (`tokenizer_files`), names
    and bytes: what meta.json records as "vocabulary", so weights are never paired with
    another vocabulary than the one they were trained with."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].read_bytes() + b"\0")
    return h.hexdigest()


def check_vocabulary(model_dir: Path, meta: dict, files: dict[str, Path]) -> None:
    """Refuse (one line) a model directory whose tokenizer files are not the vocabulary its
    meta.json says the weights were trained with (models saved before the checksum pass)."""
    want = meta.get("vocabulary")
    if want is not None and vocabulary_sha256(files) != want:
        raise UserError(f"{model_dir}: its {', '.join(sorted(files))} is not the vocabulary its "
                        f"weights were trained with (meta.json records another checksum); "
                        f"use the tokenizer files of the run that trained it")


def fill_model_dir(tmp: Path, state: dict[str, torch.Tensor], cfg: Config,
                   tokenizers: dict[str, Path], meta: dict | None = None) -> None:
    """Write the model files into directory `tmp` (used inside `write_dir_atomically`, and by
    checkpoints that add trainer state beside them)."""
    (tmp / CONFIG_FILE).write_text(cfg.to_json() + "\n", encoding="utf-8")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp / WEIGHTS_FILE))
    for name, src in tokenizers.items():
        shutil.copyfile(src, tmp / name)
    (tmp / META_FILE).write_text(json.dumps(meta or {}, indent=2, default=str) + "\n",
                                 encoding="utf-8")


def save_model(path: str | os.PathLike, model: torch.nn.Module, cfg: Config,
               tokenizers: dict[str, Path], meta: dict | None = None) -> Path:
    """Write a complete model directory at `path` atomically."""
    state = model.state_dict()
    return write_dir_atomically(path, lambda tmp: fill_model_dir(tmp, state, cfg, tokenizers, meta))


def read_config(path: str | os.PathLike) -> Config:
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p}: no such model directory")
    if not (p / CONFIG_FILE).exists():
        raise UserError(f"{p} is not an aiayn model directory (no {CONFIG_FILE})")
    return Config.from_dict(read_json(p / CONFIG_FILE), str(p / CONFIG_FILE))


def read_meta(path: str | os.PathLike) -> dict:
    """A model directory's meta.json, checked against `META_SCHEMA` ({} when there is none)."""
    f = Path(path) / META_FILE
    return read_json(f, META_SCHEMA) if f.exists() else {}


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    f = Path(path) / WEIGHTS_FILE
    if not f.exists():
        raise UserError(f"{path} has no {WEIGHTS_FILE}")
    try:
        return load_file(str(f))
    except Exception as e:  # safetensors raises several types for a damaged file
        raise UserError(f"{f}: cannot read weights ({e})") from None


def load_state_checked(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Load weights, refusing (one clear line) when keys or shapes do not match the architecture."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise UserError(f"{where}: weights do not match the config's architecture "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for k, v in state.items():
        if v.shape != own[k].shape:
            raise UserError(f"{where}: weight {k} has shape {tuple(v.shape)}, "
                            f"the config expects {tuple(own[k].shape)}")
    model.load_state_dict(state)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> LoadedModel:
    """Read a model directory: model (eval mode, on `device`), config, tokenizers and meta."""
    p = Path(path)
    cfg = read_config(p)
    model = build_model(cfg)
    load_state_checked(model, read_weights(p), str(p))
    toks = tokenizer_files(p)
    meta = read_meta(p)
    check_vocabulary(p, meta, toks)
    if SHARED_SPM in toks:
        src_tok = tgt_tok = Tokenizer.load(toks[SHARED_SPM])
    elif SRC_SPM in toks and TGT_SPM in toks:
        src_tok, tgt_tok = Tokenizer.load(toks[SRC_SPM]), Tokenizer.load(toks[TGT_SPM])
    else:
        raise UserError(f"{p} has no tokenizer ({SHARED_SPM}, or {SRC_SPM} and {TGT_SPM})")
    return LoadedModel(model.to(device).eval(), cfg, src_tok, tgt_tok, meta, p)
