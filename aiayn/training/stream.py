"""The trainer's supply of micro-batches: the data module's length-grouped, sharded, resumable
batches (§5.1) as one endless stream of padded tensors on the training device, and how an update's
token budget splits into micro-batches."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch


def batch_plan(max_tokens: int, world_size: int, accum: int | None, batch_tokens: int | None
               ) -> tuple[int, int]:
    """(micro-batch tokens per rank, micro-batches per update per rank) from the update size
    `max_tokens` and whichever of `accum` / `batch_tokens` is given:
    accum = ceil(max_tokens / (batch_tokens * world_size)), or the other way round."""
    if accum is None and batch_tokens is None:
        return math.ceil(max_tokens / world_size), 1
    if accum is None:
        return batch_tokens, max(1, math.ceil(max_tokens / (batch_tokens * world_size)))
    if batch_tokens is None:
        return math.ceil(max_tokens / (accum * world_size)), accum
    return batch_tokens, accum


class BatchStream:
    """Endless micro-batches from the sampler, crossing epoch boundaries; `None` once `max_epochs`
    epochs are done. The sampler's state at an update boundary is the resume position."""

    def __init__(self, sampler: Any, collate: Callable[[Any], Any], device: torch.device,
                 max_epochs: int | None):
        """`collate(indices)` makes a batch's tensors from the sampler's indices."""
        self.sampler, self.collate, self.device, self.max_epochs = sampler, collate, device, max_epochs
        self._it = None

    def next(self):
        while True:
            if self._it is None:
                s = self.sampler
                if self.max_epochs is not None and (
                        s.epoch >= self.max_epochs or (s.epoch == self.max_epochs - 1 and s.position >= len(s))):
                    return None
                self._it = iter(s)
            idx = next(self._it, None)
            if idx is not None:
                batch = self.collate(idx)
                if self.device.type != "cuda":
                    return batch.to(self.device)
                # from page-locked memory the copy runs beside the GPU's work on the last batch
                return batch.pin_memory().to(self.device, non_blocking=True)
            self._it = None  # the epoch is over: the next iter() starts the next one

    @property
    def epochs_done(self) -> float:
        s = self.sampler
        return s.epoch + s.position / max(len(s), 1)
