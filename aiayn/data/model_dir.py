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
from typing import Any, Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aiayn.checks import read_json
from aiayn.config import Config
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.files import write_dir_atomically
from aiayn.model.build import build_model

CONFIG_FILE, WEIGHTS_FILE, META_FILE = "config.json", "model.safetensors", "meta.json"
SHARED_SPM, SRC_SPM, TGT_SPM = "spm.model", "src.spm.model", "tgt.spm.model"
TOKENIZER_FILES = (SHARED_SPM, SRC_SPM, TGT_SPM)
# Every file aiayn writes into a model directory: of any task (the chart parser's chart.json,
# aiayn/parsing/chart/files.py) and as a checkpoint (trainer_state.pt, aiayn/training/checkpoint.py).
# `--overwrite` replaces a directory holding nothing else (`aiayn.files.foreign_entry`).
MODEL_DIR_FILES = (CONFIG_FILE, WEIGHTS_FILE, META_FILE, *TOKENIZER_FILES, "chart.json",
                   "trainer_state.pt")

# The fields of meta.json that aiayn writes, each optional (aiayn.checks.check_schema).
META_SCHEMA = {
    "?step": int, "?epoch": float, "?src_lang": (str, None), "?tgt_lang": (str, None),
    "?dataset": str, "?dataset_fingerprint": (str, None), "?dev": (dict, None),
    "?bleu_signature": (str, None), "?averaged_from": [str], "?vocabulary": str,
    "?init_from": str, "?pieces_per_char": {str: float},
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
    """A model directory's config, checked field by field (`Config`) and, where the directory
    holds weights, against their shapes (`check_config_fits`): every command that builds a model
    from a directory reads its config here, so that a config.json which does not describe its
    weights (a hostile d_model=10**6) is refused in one line before any memory is allocated."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p}: no such model directory")
    if not (p / CONFIG_FILE).exists():
        raise UserError(f"{p} is not an aiayn model directory (no {CONFIG_FILE})")
    cfg = Config.from_dict(read_json(p / CONFIG_FILE), str(p / CONFIG_FILE))
    if (p / WEIGHTS_FILE).exists():
        check_config_fits(cfg, weight_shapes(p), p / CONFIG_FILE)
    return cfg


def weight_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Each tensor's name and shape in a model directory's model.safetensors, read from the
    file's header alone: no tensor is loaded."""
    f = Path(path) / WEIGHTS_FILE
    if not f.exists():
        raise UserError(f"{path} has no {WEIGHTS_FILE}")
    try:
        with safe_open(str(f), "pt") as st:
            return {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}
    except Exception as e:  # safetensors raises several types for a damaged file
        raise UserError(f"{f}: cannot read weights ({e})") from None


def layer_count(shapes: dict[str, tuple[int, ...]], stack: str) -> int:
    """How many layers the weights hold in the layer list `stack` (keys `STACK.I. ...`)."""
    return len({k.split(".", 2)[1] for k in shapes if k.startswith(stack + ".")
                and k.split(".", 2)[1].isdigit()})


def check_fits_weights(config_file: Path, shapes: dict[str, tuple[int, ...]],
                       build: Callable[[], torch.nn.Module],
                       layers: dict[str, tuple[str, int, str]]) -> None:
    """Refuse, in one line naming `config_file`, a config that does not describe the weights
    `shapes` (`weight_shapes`), before a model is built: first each layer list of `layers` (its
    name in the weights -> (the config field, its value, what the layers are)) must hold as many
    layers as the config says; then the model that `build()` makes on the meta device, which allocates nothing, must
    have the weights' tensors, shape for shape."""
    for stack, (name, n, what) in layers.items():
        have = layer_count(shapes, stack)
        if have != n:
            raise UserError(f"{config_file}: {name}={n} but {WEIGHTS_FILE} holds {have} {what} "
                            f"layer{'s' * (have != 1)}")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build().state_dict().items()}
    missing, unexpected = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise UserError(f"{config_file}: the config does not describe {WEIGHTS_FILE} (it lacks "
                        f"{missing[:3]}, holds besides {unexpected[:3]})")
    for k in sorted(expected):
        if shapes[k] != expected[k]:
            raise UserError(f"{config_file}: the config does not describe {WEIGHTS_FILE}: weight "
                            f"{k} has shape {shapes[k]}, the config gives {expected[k]}")


def check_config_fits(cfg: Config, shapes: dict[str, tuple[int, ...]], config_file: Path) -> None:
    """`check_fits_weights` for a `Config`, first field by field where a tensor shows the size:
    vocabularies, d_model, d_ff, n_heads x d_k and x d_v, learned positions; rnn_* sizes."""
    def refuse(field: str, holds: str) -> UserError:
        return UserError(f"{config_file}: {field} but {WEIGHTS_FILE} holds {holds}")

    def rows(key: str) -> int | None:  # of a matrix in the weights
        shape = shapes.get(key)
        return shape[0] if shape is not None and len(shape) == 2 else None

    width = cfg.d_model if cfg.arch == "transformer" else cfg.rnn_emb
    emb = shapes.get("src_embed.weight")
    if emb is not None and len(emb) == 2:
        if emb[1] != width:
            field = "d_model" if cfg.arch == "transformer" else "rnn_emb"
            raise refuse(f"{field}={width}", f"{emb[1]}-wide embeddings")
        if emb[0] != cfg.src_vocab:
            raise refuse(f"vocab_size={cfg.vocab_size}", f"embeddings of {emb[0]} tokens")
    for key in ("tgt_embed.weight", "out_proj.weight"):
        n = rows(key)
        if n is not None and n != cfg.tgt_vocab:
            field = "tgt_vocab_size" if cfg.tgt_vocab_size else "vocab_size"
            raise refuse(f"{field}={cfg.tgt_vocab}", f"a target vocabulary of {n} tokens")
    if cfg.arch == "rnn":
        checks = [("encoder.weight_hh_l0", 3 * cfg.rnn_hidden, f"rnn_hidden={cfg.rnn_hidden}",
                   "GRU units", 3), ("key_proj.weight", cfg.rnn_attn, f"rnn_attn={cfg.rnn_attn}",
                                     "alignment units", 1)]
        stacks: dict[str, tuple[str, int, str]] = {}
    else:
        hk, hv = cfg.n_heads * cfg.head_dim_k, cfg.n_heads * cfg.head_dim_v
        checks = [("encoder.0.ffn.w1.weight", cfg.d_ff, f"d_ff={cfg.d_ff}", "feed-forward units", 1),
                  ("decoder.0.cross_attn.q_proj.weight", hk,
                   f"n_heads x d_k = {cfg.n_heads} x {cfg.head_dim_k}", "query units", 1),
                  ("decoder.0.cross_attn.kv_proj.weight", hk + hv,
                   f"n_heads x (d_k + d_v) = {cfg.n_heads} x {cfg.head_dim_k + cfg.head_dim_v}",
                   "key and value units", 1)]
        if cfg.positions == "learned":
            checks.append(("src_pos.weight", cfg.max_positions, f"max_positions={cfg.max_positions}",
                           "learned positions", 1))
        stacks = {s: ("n_layers", cfg.n_layers, s) for s in ("encoder", "decoder")}
    for key, want, field, what, per in checks:
        n = rows(key)
        if n is not None and n != want:
            raise refuse(field, f"{n // per} {what}")
    check_fits_weights(config_file, shapes, lambda: build_model(cfg), stacks)


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
    cfg = read_config(p)  # checked against the weights' shapes: nothing is allocated before
    weights = read_weights(p)
    model = build_model(cfg)
    load_state_checked(model, weights, str(p))
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
