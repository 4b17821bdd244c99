"""A chart parser's model directory, as `aiayn train` checkpoints it and `aiayn average` and
`aiayn parse` read it:

    config.json        the `ChartConfig`, with "task": "chart-parser"
    chart.json         the vocabularies: words, labels, characters (`data.Vocabulary`)
    model.safetensors  the weights
    meta.json          facts about the model: step, corpus, dev figures

Models saved before the chart parser trained through `aiayn train` hold their config inside
chart.json ("kind": "chart") and no config.json; they still load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from aiayn.checks import read_json
from aiayn.data.model_dir import (
    CONFIG_FILE,
    META_FILE,
    WEIGHTS_FILE,
    check_fits_weights,
    load_state_checked,
    read_weights,
    weight_shapes,
)
from aiayn.errors import UserError
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.chart.data import Vocabulary
from aiayn.parsing.chart.model import SpanParser, char_ids, encode, model_words

VOCABULARY_FILE = "chart.json"
_VOCABULARY_SCHEMA = {"words": [str], "labels": [str], "?chars": [str]}


@dataclass
class ChartModel:
    model: SpanParser
    vocab: Vocabulary

    def logits(self, spellings: list[list[str]]) -> torch.Tensor:
        """(B, F, F, L) span logits of sentences given as their words as written."""
        ids = encode([model_words(w, self.vocab.word_index) for w in spellings], self.vocab.word_index)
        chars = (char_ids(spellings, self.vocab.char_index, self.model.cfg.max_chars)
                 if self.model.char_encoder is not None else None)
        device = next(self.model.parameters()).device  # `aiayn parse --device`
        if chars is not None:
            chars = tuple(c.to(device) for c in chars)
        return self.model(ids.to(device), chars)


def write_model_dir(directory: Path, weights: dict[str, torch.Tensor], cfg: ChartConfig,
                    vocab: Vocabulary, meta: dict[str, Any]) -> None:
    """The files of a model directory into `directory` (a fresh temporary one: the caller makes
    the directory appear whole, `aiayn.files.write_dir_atomically`)."""
    (directory / CONFIG_FILE).write_text(cfg.to_json() + "\n", encoding="utf-8")
    (directory / VOCABULARY_FILE).write_text(json.dumps(vocab.as_dict()) + "\n", encoding="utf-8")
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()},
              str(directory / WEIGHTS_FILE))
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")


def is_chart_model(path: str | os.PathLike) -> bool:
    """Whether `path` holds a chart parser (either layout)."""
    p = Path(path)
    for name, key, value in (("config.json", "task", ChartConfig.TASK), (VOCABULARY_FILE, "kind", "chart")):
        try:
            if json.loads((p / name).read_text(encoding="utf-8")).get(key) == value:
                return True
        except (OSError, ValueError, UnicodeDecodeError, AttributeError):
            continue
    return False


def read_chart_config(path: str | os.PathLike) -> ChartConfig:
    """A chart parser's config; where the directory holds weights, checked against their shapes
    before any model is built (`aiayn.data.model_dir.check_fits_weights`)."""
    p = Path(path)
    if (p / "config.json").exists():
        where = p / "config.json"
        cfg = ChartConfig.from_dict(read_json(where), str(where))
    else:
        where = p / VOCABULARY_FILE
        old = read_json(where, {"kind": str, "config": dict})
        # models saved before d_char read no characters
        cfg = ChartConfig.from_dict({"task": ChartConfig.TASK, "d_char": 0, **old["config"]}, str(where))
    if (p / WEIGHTS_FILE).exists():
        v = read_vocabulary(p)
        check_fits_weights(where, weight_shapes(p),
                           lambda: SpanParser(cfg, len(v.words), len(v.labels), len(v.chars)),
                           {"layers": ("n_layers", cfg.n_layers, "encoder")})
    return cfg


def read_vocabulary(path: str | os.PathLike) -> Vocabulary:
    meta = read_json(Path(path) / VOCABULARY_FILE, _VOCABULARY_SCHEMA)
    return Vocabulary(meta["words"], meta["labels"], meta.get("chars", []))


def load_chart(path: str | os.PathLike, device: str | torch.device = "cpu") -> ChartModel:
    """A chart parser model directory, in eval mode; anything amiss is one line naming it."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p}: no such model directory")
    cfg = read_chart_config(p)
    vocab = read_vocabulary(p)
    model = SpanParser(cfg, len(vocab.words), len(vocab.labels), len(vocab.chars))
    load_state_checked(model, read_weights(p), str(p))
    return ChartModel(model.to(device).eval(), vocab)
