"""`Seq2SeqTask`: the paper's task for the trainer (aiayn/training/task.py): a sequence-to-sequence
model (the Transformer, or the RNN baseline) on a dataset made by `aiayn prepare`, its batches of
similar lengths holding `max_tokens` tokens per side per update (§5.1), the label-smoothed loss
(§5.4), dev loss, perplexity and greedy BLEU, and model directories that hold the sentencepiece
model(s) beside the weights (aiayn/data/model_dir.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from aiayn.config import Config
from aiayn.data.batching import TokenBatchSampler, collate
from aiayn.data.dataset import load_dataset_dir
from aiayn.data.model_dir import fill_model_dir, read_config, tokenizer_files, vocabulary_sha256
from aiayn.data.vocab_fit import held_pieces_per_char
from aiayn.errors import UserError
from aiayn.model.build import build_model
from aiayn.model.counting import count_parameters, flops_per_target_token
from aiayn.training.evaluate import evaluate
from aiayn.training.loss import LossSums, label_smoothed_loss


class Seq2SeqTask:
    unit = "tokens"

    def __init__(self, data_dir: str | Path, dev_split: str | None = None):
        self.directory = Path(data_dir)
        self.data = load_dataset_dir(data_dir)
        self.tokenizers = tokenizer_files(self.data.directory)
        self.vocabulary = vocabulary_sha256(self.tokenizers)  # meta.json's "vocabulary"
        self.train_set = self.data.split("train")
        splits = [s for s in self.data.splits if s != "train"]
        name = dev_split if dev_split is not None else (
            "valid" if "valid" in splits else (splits[0] if splits else None))
        self.dev_set = None if name is None else self.data.split(name)
        # what `prepare --vocab-from` compares new data with (aiayn/data/vocab_fit.py)
        self.pieces_per_char = held_pieces_per_char(self.directory, self.data.manifest)

    def config(self, cfg: Any) -> Config:
        if not isinstance(cfg, Config):
            raise UserError(f"{self.directory} is a dataset made by aiayn prepare, for the "
                            f"sequence-to-sequence Transformer; this preset's model is a "
                            f"{cfg.TASK} (train it on the data its recipe names)")
        return self.data.model_config(cfg)

    def read_config(self, model_dir: Path) -> Config:
        return read_config(model_dir)

    def check_checkpoint(self, model_dir: Path) -> None:
        """The model's sentencepiece files must be the dataset's, byte for byte: weights trained
        with one vocabulary mean nothing over another of the same size."""
        theirs = tokenizer_files(model_dir)
        if sorted(theirs) != sorted(self.tokenizers) or any(
                theirs[n].read_bytes() != self.tokenizers[n].read_bytes() for n in theirs):
            raise UserError(f"{model_dir} was trained with another vocabulary than {self.directory}'s; "
                            f"prepare the data with `aiayn prepare --vocab-from {model_dir}` so "
                            f"that they share one")

    def build_model(self, cfg: Config) -> torch.nn.Module:
        return build_model(cfg)

    def count_parameters(self, cfg: Config) -> int:
        return count_parameters(cfg)

    def update_size(self, cfg: Config) -> int:
        return cfg.max_tokens

    def sampler(self, cfg: Config, batch_size: int, seed: int, rank: int, world_size: int):
        t = self.train_set
        return TokenBatchSampler(t.src_lengths, t.tgt_lengths, batch_size, seed=seed, rank=rank,
                                 world_size=world_size, pad_multiple=cfg.pad_multiple)

    def collate(self, cfg: Config, indices: Any):
        return collate(self.train_set, indices, cfg.pad_multiple)

    def loss(self, model: torch.nn.Module, batch: Any, cfg: Config, autocast: Callable) -> LossSums:
        return seq2seq_loss(model, batch, cfg, autocast)

    def evaluate(self, model: torch.nn.Module, cfg: Config, batch_size: int, device: torch.device,
                 autocast: Callable, sentences: int) -> dict[str, Any]:
        if self.dev_set is None:
            return {}
        return evaluate(model, self.dev_set, batch_size, cfg.eps_ls, sentences, device, autocast,
                        cfg.pad_multiple)

    def write_model(self, directory: Path, weights: dict[str, torch.Tensor], cfg: Config,
                    meta: dict) -> None:
        fill_model_dir(directory, weights, cfg, self.tokenizers, meta)

    def meta(self) -> dict[str, Any]:
        m = self.data.manifest
        return {"src_lang": m.get("src_lang"), "tgt_lang": m.get("tgt_lang"),
                "dataset": str(self.data.directory), "dataset_fingerprint": m.get("fingerprint"),
                "vocabulary": self.vocabulary,
                **({"pieces_per_char": self.pieces_per_char} if self.pieces_per_char else {})}

    def flops_per_target_token(self, cfg: Config) -> float:
        split = self.data.manifest["splits"]["train"]
        pairs = max(split["pairs"], 1)
        return flops_per_target_token(cfg, split["src_tokens"] / pairs + 1,  # + EOS
                                      split["tgt_tokens"] / pairs + 1)


def seq2seq_loss(model: torch.nn.Module, batch: Any, cfg: Config, autocast: Callable) -> LossSums:
    """The label-smoothed loss (§5.4) and NLL of a micro-batch (aiayn.data.batching.Batch),
    summed over its target tokens."""
    with autocast():
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    return label_smoothed_loss(logits, batch.tgt_out, cfg.eps_ls)
