"""`ChartTask`: the chart parser for the trainer (aiayn/training/task.py), on a corpus made by
`aiayn treebank`: the train split's sentences in batches of `max_cells` span cells, the span
cross-entropy normalised by the cells of the whole update, dev span loss and bracket F1 (CKY on
every dev sentence, scored as EVALB with COLLINS.prm and the gold tags), and model directories of
aiayn/parsing/chart/files.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from aiayn.errors import UserError
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.chart.data import ChartSampler, Vocabulary, collate, length_batches, read_split, sentences
from aiayn.parsing.chart.files import VOCABULARY_FILE, read_chart_config, read_vocabulary, write_model_dir
from aiayn.parsing.chart.model import SpanParser, span_loss
from aiayn.parsing.chart.trees import decode_tree
from aiayn.parsing.evalb import evalb, retag_from_gold
from aiayn.training.loss import LossSums


class ChartTask:
    unit = "cells"

    def __init__(self, corpus: str | Path, dev_split: str | None = None):
        self.directory = Path(corpus)
        if not self.directory.is_dir():
            raise UserError(f"{self.directory}: no such directory (make it with `aiayn treebank "
                            f"--out {self.directory}`)")
        words, trees, gold = read_split(self.directory, "train")
        self._vocab = {with_chars: Vocabulary.of_training_set(words, trees, with_chars)
                       for with_chars in (False, True)}
        self._train = (words, trees, gold)
        self.dev_split = dev_split or "valid"
        dev = self.directory / f"{self.dev_split}.gold"
        if dev_split is not None and not dev.exists():
            raise UserError(f"{dev}: no such file (--dev-split {dev_split})")
        self._dev = read_split(self.directory, self.dev_split) if dev.exists() else None
        self._sentences: dict[bool, tuple[list, list]] = {}

    # --- the data as a model of `cfg` reads it ------------------------------------------------

    def vocabulary(self, cfg: ChartConfig) -> Vocabulary:
        return self._vocab[cfg.d_char > 0]

    def _sents(self, cfg: ChartConfig) -> tuple[list, list]:
        """(train, dev) `Sentence`s, made once per vocabulary."""
        key = cfg.d_char > 0
        if key not in self._sentences:
            vocab = self.vocabulary(cfg)
            dev = sentences(*self._dev, vocab) if self._dev else []
            self._sentences[key] = (sentences(*self._train, vocab), dev)
        return self._sentences[key]

    # --- the seam ----------------------------------------------------------------------------

    def config(self, cfg: Any) -> ChartConfig:
        if not isinstance(cfg, ChartConfig):
            raise UserError(f"{self.directory} is a treebank corpus, which trains the chart parser "
                            f"(--preset parsing-chart-small); for a sequence-to-sequence model, "
                            f"make a dataset of it with aiayn prepare")
        return cfg

    def read_config(self, model_dir: Path) -> ChartConfig:
        return read_chart_config(model_dir)

    def check_checkpoint(self, model_dir: Path) -> None:
        saved = read_vocabulary(model_dir)
        mine = self.vocabulary(read_chart_config(model_dir))
        if saved.as_dict() != mine.as_dict():
            raise UserError(f"{model_dir / VOCABULARY_FILE}: the checkpoint's vocabulary is not "
                            f"that of {self.directory}'s training split (another corpus?)")

    def build_model(self, cfg: ChartConfig) -> SpanParser:
        v = self.vocabulary(cfg)
        return SpanParser(cfg, len(v.words), len(v.labels), len(v.chars))

    def count_parameters(self, cfg: ChartConfig) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in self.build_model(cfg).parameters())

    def update_size(self, cfg: ChartConfig) -> int:
        return cfg.max_cells

    def sampler(self, cfg: ChartConfig, batch_size: int, seed: int, rank: int, world_size: int):
        return ChartSampler([len(s.words) for s in self._sents(cfg)[0]], batch_size, seed, rank,
                            world_size)

    def collate(self, cfg: ChartConfig, indices: Any):
        train = self._sents(cfg)[0]
        return collate([train[k] for k in indices], self.vocabulary(cfg), cfg.max_chars)

    def loss(self, model: torch.nn.Module, batch: Any, cfg: ChartConfig, autocast: Callable) -> LossSums:
        with autocast():
            logits = model(batch.ids, batch.chars)  # (B, F, F, L)
        total = span_loss(logits, batch.targets)
        return LossSums(total, total, torch.tensor(batch.n_tgt_tokens))

    def evaluate(self, model: torch.nn.Module, cfg: ChartConfig, batch_size: int,
                 device: torch.device, autocast: Callable, sentences: int) -> dict[str, Any]:
        """Dev span loss per cell (dev_loss = dev_nll, dev_ppl = exp) and the bracket F1 of the
        trees CKY finds in every dev sentence (`sentences` is BLEU's; every one is parsed)."""
        dev = self._sents(cfg)[1]
        if not dev:
            return {}
        vocab = self.vocabulary(cfg)
        model.eval()
        total, cells, trees = 0.0, 0, [""] * len(dev)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            for idx in length_batches([len(s.words) for s in dev], batch_size):
                batch = collate([dev[k] for k in idx], vocab, cfg.max_chars).to(device)
                with autocast():
                    logits = model(batch.ids, batch.chars)
                total += float(span_loss(logits, batch.targets))
                cells += batch.n_tgt_tokens
                lp = F.log_softmax(logits.float(), dim=-1).cpu().numpy()  # (B, F, F, L)
                for b, k in enumerate(idx):
                    n = len(dev[k].words)
                    trees[k] = decode_tree(lp[b, : n + 1, : n + 1], dev[k].spelling, vocab.labels)
        gold = [s.gold for s in dev]
        scores = evalb(gold, [retag_from_gold(t, g) for t, g in zip(trees, gold)])
        nll = total / max(cells, 1)
        return {"dev_loss": nll, "dev_nll": nll, "dev_ppl": math.exp(min(nll, 700)),
                "dev_tokens": cells, "dev_f1": scores.all.f1}

    def write_model(self, directory: Path, weights: dict[str, torch.Tensor], cfg: ChartConfig,
                    meta: dict) -> None:
        write_model_dir(directory, weights, cfg, self.vocabulary(cfg), meta)

    def meta(self) -> dict[str, Any]:
        return {"dataset": str(self.directory)}

    def flops_per_target_token(self, cfg: ChartConfig) -> float:
        """Training FLOPs per cell (6 per weight per use, forward and backward): the encoder's
        weights once per token, the span layer's first matrix once per fencepost, its second
        once per cell; attention's scores and sums per token pair. The corpus's own ratios of
        tokens and fenceposts to cells."""
        train = self._sents(cfg)[0]
        cells = sum(s.cells for s in train)
        tokens = sum(len(s.words) + 2 for s in train)
        pairs = sum((len(s.words) + 2) ** 2 for s in train)
        d = cfg.d_model
        encoder = cfg.n_layers * (4 * d * d + 2 * d * cfg.d_ff)
        per_fencepost = d * cfg.d_span
        per_cell = cfg.d_span * len(self.vocabulary(cfg).labels)
        attention = cfg.n_layers * 2 * d
        forward = (encoder * tokens + per_fencepost * (tokens - 1) + per_cell * cells
                   + attention * pairs) / max(cells, 1)
        return 6.0 * forward
