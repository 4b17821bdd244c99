"""Checkpoint averaging (§6.1): the final base model averages the parameters of the last 5
checkpoints (written at 10-minute intervals), the big model the last 20.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

from aiayn.config import Config
from aiayn.errors import UserError

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


def check_same_architecture(configs: Sequence[Config], names: Sequence[str]) -> None:
    """Refuse (one line) when any architecture field differs from the first config's."""
    for cfg, name in zip(configs[1:], names[1:]):
        changes = configs[0].architecture_changes(cfg)
        if changes:
            raise UserError(f"{name} has a different architecture from {names[0]}: {changes[0]}")


def average_checkpoints(inputs: Sequence[str | os.PathLike], out: str | os.PathLike,
                        overwrite: bool = False) -> Path:
    """Average the model directories `inputs` into a new model directory `out`: averaged weights,
    with the config, tokenizer and meta of the last input (the newest, as `checkpoints_of_run`
    orders them). No trainer state: the result is for translating, not for resuming. A second
    average into the same `out` meanwhile is refused (`aiayn.io.exclusive_lock`)."""
    from aiayn.io import check_writable, exclusive_lock, write_dir_atomically
    from aiayn.model.io import fill_model_dir, read_config, read_meta, read_weights, tokenizer_files

    paths = [Path(p) for p in inputs]
    if not paths:
        raise UserError("nothing to average: no checkpoints given")
    with exclusive_lock(out, "aiayn average", "wait for it to finish, or choose another --out"):
        out = check_writable(out, overwrite)
        if out.exists() and not (out / "config.json").is_file():
            raise UserError(f"{out} exists and is not a model directory; refusing to replace it")
        if any(out.resolve() == p.resolve() for p in paths):
            raise UserError(f"{out} is one of the inputs; choose another --out")
        configs = [read_config(p) for p in paths]
        check_same_architecture(configs, [str(p) for p in paths])
        toks = [tokenizer_files(p) for p in paths]
        last_toks = {n: f.read_bytes() for n, f in toks[-1].items()}
        for p, t in zip(paths, toks):
            if {n: f.read_bytes() for n, f in t.items()} != last_toks:
                raise UserError(f"{p} has a different tokenizer from {paths[-1]}; they are not from one run")
        acc = RunningMean()
        for p in paths:
            acc.add(read_weights(p), str(p))
        avg = acc.result()
        meta = read_meta(paths[-1])
        meta.pop("trainer", None)
        meta["averaged_from"] = [str(p) for p in paths]
        write_dir_atomically(out, lambda tmp: fill_model_dir(tmp, avg, configs[-1], toks[-1], meta))
    return out
