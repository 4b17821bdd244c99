"""Token embeddings scaled by sqrt(d_model) (§3.4) and positional encodings (§3.5)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5), interleaved:
    even dimensions sine, odd dimensions cosine. Returns (n_positions, d_model) float32."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (P, ceil(d/2))
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


class SinusoidalPositions(nn.Module):
    """Fixed encodings; the table grows on demand, so any length works (§3.5: "may allow the model
    to extrapolate to sequence lengths longer than the ones encountered during training")."""

    def __init__(self, d_model: int, initial: int = 1024):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(initial, d_model), persistent=False)

    def forward(self, t: int, offset: int = 0) -> Tensor:
        """Encodings of positions [offset, offset + t): (t, d_model)."""
        if offset + t > self.table.size(0):
            n = max(offset + t, 2 * self.table.size(0))
            self.table = sinusoidal_table(n, self.d_model).to(self.table.device)
        return self.table[offset : offset + t]


class LearnedPositions(nn.Module):
    """Learned positional embeddings, Table 3 row (E); limited to `max_positions`."""

    def __init__(self, max_positions: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_positions, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)

    def forward(self, t: int, offset: int = 0) -> Tensor:
        if offset + t > self.weight.size(0):
            raise ValueError(
                f"sequence of {offset + t} positions exceeds max_positions={self.weight.size(0)} "
                "of the learned positional embeddings")
        return self.weight[offset : offset + t]


class ScaledEmbedding(nn.Module):
    """Embedding lookup multiplied by sqrt(d_model) (§3.4). Initialised N(0, d_model^-1/2) so the
    scaled vectors start at unit variance, comparable to the positional encodings."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    def forward(self, ids: Tensor) -> Tensor:
        return nn.functional.embedding(ids, self.weight) * self.scale  # (B, T, d_model)
