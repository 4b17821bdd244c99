"""Checkpoint averaging (§6.1): the final base model averages the parameters of the last 5
checkpoints (written at 10-minute intervals), the big model the last 20.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from safetensors.torch import save_file

from aiayn.data.model_dir import MODEL_DIR_FILES, WEIGHTS_FILE, read_meta, read_weights
from aiayn.data.model_dir import read_config as read_seq2seq_config
from aiayn.errors import UserError
from aiayn.files import write_dir_atomically
from aiayn.locks import output_directory


class RunningMean:
    """Element-wise mean of state dicts fed one at a time (so averaging 20 big checkpoints holds one
    of them plus a float64 sum in memory), checking keys, shapes and dtypes against the first."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self.count = 0

    def add(self, state: dict[str, torch.Tensor], name: str = "") -> None:
        label = name or f"state dict {self.count + 1}"
        if self.count == 0:
            self.dtypes = {k: v.dtype for k, v in state.items()}
            self.sums = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in state.items()}
        elif set(state) != set(self.sums):
            diff = sorted(set(state) ^ set(self.sums))
            raise UserError(f"{label} has different parameters from the first "
                            f"(e.g. {', '.join(diff[:3])})")
        for k, v in state.items():
            if v.shape != self.sums[k].shape or v.dtype != self.dtypes[k]:
                raise UserError(f"{label}: {k} is {v.dtype} {tuple(v.shape)}, the first has "
                                f"{self.dtypes[k]} {tuple(self.sums[k].shape)}")
            self.sums[k] += v.detach().to("cpu", torch.float64)
        self.count += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The mean, in each tensor's original dtype (integer buffers rounded)."""
        if self.count == 0:
            raise UserError("nothing to average: no checkpoints given")
        out = {}
        for k, s in self.sums.items():
            mean = s / self.count
            out[k] = (mean if self.dtypes[k].is_floating_point else mean.round()).to(self.dtypes[k])
        return out


def average_state_dicts(states: Iterable[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of state dicts with equal keys, shapes and dtypes, accumulated in float64
    and returned in the original dtypes. Raises UserError when they differ or none are given."""
    acc = RunningMean()
    for s in states:
        acc.add(s)
    return acc.result()


def check_same_architecture(configs: Sequence[Any], names: Sequence[str]) -> None:
    """Refuse (one line) when any architecture field differs from the first config's."""
    for cfg, name in zip(configs[1:], names[1:]):
        changes = configs[0].architecture_changes(cfg)
        if changes:
            raise UserError(f"{name} has a different architecture from {names[0]}: {changes[0]}")


# Files of a model directory that are not copied from the newest input as they are.
_NOT_COPIED = ("model.safetensors", "meta.json", "trainer_state.pt")


def average_checkpoints(inputs: Sequence[str | os.PathLike], out: str | os.PathLike,
                        overwrite: bool = False,
                        read_config: Callable[[Path], Any] | None = None) -> Path:
    """Average the model directories `inputs` into a new model directory `out`: averaged weights,
    and every other file (config, tokenizers or vocabularies) of the last input (the newest, as
    `checkpoints_of_run` orders them), which must equal the others' but for the config's recipe
    fields. No trainer state: the result is for translating, not for resuming. `read_config`
    reads a directory's config (default: a sequence-to-sequence `Config`; aiayn/tasks.py reads
    any task's). A second average into the same `out` meanwhile is refused
    (`aiayn.locks.output_directory`)."""
    read_config = read_config or read_seq2seq_config
    paths = [Path(p) for p in inputs]
    if not paths:
        raise UserError("nothing to average: no checkpoints given")
    with output_directory(out, "aiayn average", overwrite, "config.json", "a model directory", paths,
                          "wait for it to finish, or choose another --out", MODEL_DIR_FILES) as out:
        configs = [read_config(p) for p in paths]
        check_same_architecture(configs, [str(p) for p in paths])
        files = [_vocabulary_files(p) for p in paths]
        for p, f in zip(paths, files):
            if f != files[-1]:
                raise UserError(f"{p} has a different tokenizer or vocabulary from {paths[-1]}; "
                                f"they are not from one run")
        acc = RunningMean()
        for p in paths:
            acc.add(read_weights(p), str(p))
        avg = acc.result()
        meta = read_meta(paths[-1])
        meta.pop("trainer", None)
        meta["averaged_from"] = [str(p) for p in paths]

        def fill(tmp: Path) -> None:
            for f in _model_files(paths[-1]):
                if f.name not in _NOT_COPIED:
                    shutil.copyfile(f, tmp / f.name)
            save_file({k: v.contiguous() for k, v in avg.items()}, str(tmp / WEIGHTS_FILE))
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n",
                                          encoding="utf-8")

        write_dir_atomically(out, fill)
    return out


def _model_files(model_dir: Path) -> list[Path]:
    return [f for f in sorted(model_dir.iterdir()) if f.is_file() and not f.name.startswith(".")]


def _vocabulary_files(model_dir: Path) -> dict[str, bytes]:
    """The files that say what a model's ids mean (all but config, weights, meta, trainer state),
    by name."""
    return {f.name: f.read_bytes() for f in _model_files(model_dir)
            if f.name not in (*_NOT_COPIED, "config.json")}
