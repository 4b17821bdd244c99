"""The trainer's supply of micro-batches: the data module's length-grouped, sharded, resumable
batches (§5.1) as one endless stream of padded tensors on the training device."""

from __future__ import annotations

from typing import Any

import torch


class BatchStream:
    """Endless micro-batches from the sampler, crossing epoch boundaries; `None` once `max_epochs`
    epochs are done. The sampler's state at an update boundary is the resume position."""

    def __init__(self, sampler: Any, dataset: Any, device: torch.device, max_epochs: int | None):
        self.sampler, self.dataset, self.device, self.max_epochs = sampler, dataset, device, max_epochs
        self._it = None

    def next(self):
        from aiayn.data.batching import collate

        while True:
            if self._it is None:
                s = self.sampler
                if self.max_epochs is not None and (
                        s.epoch >= self.max_epochs or (s.epoch == self.max_epochs - 1 and s.position >= len(s))):
                    return None
                self._it = iter(s)
            idx = next(self._it, None)
            if idx is not None:
                # with BPE-dropout the sampler holds this epoch's segmentation of the text
                data = self.sampler.epoch_data() if hasattr(self.sampler, "epoch_data") else self.dataset
                return collate(data, idx).to(self.device)
            self._it = None  # the epoch is over: the next iter() starts the next one

    @property
    def epochs_done(self) -> float:
        s = self.sampler
        return s.epoch + s.position / max(len(s), 1)
