"""The seam between the trainer and what it trains: a `Task` is the data of a run and everything
the trainer must not know about the model it trains on it.

The trainer (aiayn/training/trainer.py) owns the run: its lock, checkpoints and exact resume, the
optimizer and Eq. 3, precision, data parallelism, accumulation, skipped updates, time budgets,
logs and the summary. A task owns the rest, behind the methods below. Two tasks exist:
`Seq2SeqTask` (aiayn/training/seq2seq.py), the paper's sequence-to-sequence Transformer on a
dataset made by `aiayn prepare`, and the chart parser's (`ChartTask`, in the parsing package) on
a corpus made by `aiayn treebank`. aiayn/tasks.py picks one for a data or model directory.

A task's config is a frozen dataclass built on `aiayn.config.ConfigFields` that has the recipe
fields the trainer reads by their `Config` names: max_steps, warmup_steps, lr_scale, d_model
(Eq. 3), adam_beta1, adam_beta2, adam_eps, clip_norm, lr_cooldown and n_average.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from aiayn.training.loss import LossSums


class Batch(Protocol):
    """A micro-batch on its way to the device: host-side counts, so the trainer never reads them
    back from the device."""

    n_src_tokens: int  # what an update's throughput counts on the input side
    n_tgt_tokens: int  # what the loss is normalised by: target tokens (translation), cells (chart)

    def to(self, device: torch.device) -> "Batch": ...


class Task(Protocol):
    directory: Path  # the data directory, as given
    unit: str  # what `n_tgt_tokens` counts, for logs: "tokens", "cells"

    def config(self, cfg: Any) -> Any:
        """The run's config from the caller's: what the data decides (vocabulary sizes) filled
        in; a config of another kind of model is refused in one line."""

    def read_config(self, model_dir: Path) -> Any:
        """The config saved in a checkpoint of this task (on resume)."""

    def check_checkpoint(self, model_dir: Path) -> None:
        """Refuse, in one line, a checkpoint whose vocabulary is not this data's."""

    def build_model(self, cfg: Any) -> torch.nn.Module:
        """A freshly initialised model (the caller seeds the generators first)."""

    def count_parameters(self, cfg: Any) -> int: ...

    def update_size(self, cfg: Any) -> int:
        """The size of one update in the sampler's units, split over micro-batches and ranks."""

    def sampler(self, cfg: Any, batch_size: int, seed: int, rank: int, world_size: int) -> Any:
        """Length-grouped batches of training examples for one rank, resumable: `len()` batches
        per epoch, iteration from `position`, `epoch`, `state_dict()` with integer "epoch" and
        "position", `load_state_dict()` refusing a state of other data or settings."""

    def collate(self, cfg: Any, indices: Any) -> Batch:
        """The padded tensors of the training examples `indices` (a sampler's batch)."""

    def loss(self, model: torch.nn.Module, batch: Any, cfg: Any, autocast: Callable) -> LossSums:
        """The micro-batch's summed objective and NLL, and the count they are summed over (equal
        to `batch.n_tgt_tokens`); the forward pass runs under `autocast()`."""

    def evaluate(self, model: torch.nn.Module, cfg: Any, batch_size: int, device: torch.device,
                 autocast: Callable, sentences: int) -> dict[str, Any]:
        """Dev figures, at least dev_loss, dev_nll and dev_ppl, plus the task's own score of
        decoded output ("dev_bleu" over `sentences` greedy translations; "dev_f1"), and
        optionally "example" ({"ref", "hyp"}) and "bleu_signature"; {} without a dev split.
        Leaves every random generator as it found it."""

    def write_model(self, directory: Path, weights: dict[str, torch.Tensor], cfg: Any,
                    meta: dict) -> None:
        """Write a complete model directory's files into `directory` (a fresh temporary one):
        config.json, model.safetensors, meta.json, and what the task needs to read inputs."""

    def meta(self) -> dict[str, Any]:
        """Facts about the data for meta.json and the summary."""

    def flops_per_target_token(self, cfg: Any) -> float:
        """Training FLOPs per `n_tgt_tokens` unit, for the summary's compute and MFU."""
