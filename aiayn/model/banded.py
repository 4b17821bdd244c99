"""Restricted self-attention computed banded (Table 1, "self-attention (restricted)": O(r n d)).

Each query i attends only to keys j with |i - j| <= r (and j <= i in the decoder); `r` counts the
keys on one side, so a query's neighbourhood holds 2r + 1 positions (r + 1 when causal). Instead
of masking a dense n x n score matrix, which costs O(n^2 d) like full attention, the sequence is
cut into blocks of b = r queries; block m's queries can only see keys in blocks m - 1, m and
m + 1 (m - 1 and m when causal), a window of 3b (2b) keys read out of the padded key sequence with
`unfold`. Scores, weights and their gradients are then (B, h, n/b, b, 3b): about 3 r n entries
instead of n^2, and time and memory are O(r n d) (`aiayn study table1` measures the slope).

The mask inside a block's window is exact, so the result equals dense attention under the mask
`Band.dense` (tested, forward and gradients): a query may attend key j when j is in its window and
is a real token, and always itself, so that a padded query far from any real token has a finite
(ignored) output instead of a softmax over nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def window_mask(t_q: int, t_k: int, r: int, causal: bool, offset: int = 0,
                device: torch.device | None = None) -> Tensor:
    """Restricted self-attention (Table 1): query i may attend key j when |i - j| <= r
    (and j <= i when causal). `offset` is the absolute position of the first query (decoding).
    Returns (t_q, t_k) bool."""
    i = torch.arange(t_q, device=device).unsqueeze(1) + offset  # (t_q, 1)
    j = torch.arange(t_k, device=device).unsqueeze(0)  # (1, t_k)
    allowed = (i - j).abs() <= r
    if causal:
        allowed &= j <= i
    return allowed


@dataclass(frozen=True)
class Band:
    """What restricted self-attention needs instead of a dense mask.

    r: keys on each side (`Config.attn_window`); causal: decoder (j <= i);
    key_mask: (B, T) bool, True at real tokens, or None (every key real, as in the right-padded
    decoder, where the causal window already hides padding from real queries).
    """

    r: int
    causal: bool
    key_mask: Tensor | None = None

    def dense(self, t: int, device: torch.device | None = None) -> Tensor:
        """The same mask as a dense (B or 1, 1, t, t) bool tensor: the slow reference, and what
        the attention-weights path (visualisation) uses."""
        allowed = window_mask(t, t, self.r, self.causal, device=device)  # (t, t)
        if self.key_mask is not None:
            allowed = self.key_mask[:, None, None, :] & allowed  # (B, 1, t, t)
        return allowed | torch.eye(t, dtype=torch.bool, device=device)


def _blocks(x: Tensor, b: int, n_blocks: int, left: int, width: int) -> Tensor:
    """Overlapping windows of `width` positions, one per block of b, along dim -2 of x (..., T, d),
    starting `left` positions before each block: (..., n_blocks, width, d), padded with zeros."""
    right = n_blocks * b + width - b - left - x.size(-2)
    xp = F.pad(x, (0, 0, left, right))  # (..., left + T + right, d)
    return xp.unfold(-2, width, b).transpose(-1, -2)  # (..., n_blocks, width, d)


def band_allowed(t: int, r: int, causal: bool, key_mask: Tensor | None,
                 device: torch.device | None = None) -> tuple[Tensor, int]:
    """Which window slots each query may attend, in the blocked layout: (B or 1, n_blocks, b, w)
    bool, and the block size b. Slot c of block m is key j = (m - 1) b + c; query a of block m is
    i = m b + a, so i - j = b + a - c is the same for every block."""
    b = max(r, 1)
    n_blocks = -(-t // b)
    w = 2 * b if causal else 3 * b
    rel = b + torch.arange(b, device=device)[:, None] - torch.arange(w, device=device)  # (b, w)
    in_band = rel.abs() <= r
    if causal:
        in_band &= rel >= 0
    real = torch.ones(1, t, dtype=torch.bool, device=device) if key_mask is None else key_mask
    real = _blocks(real[:, :, None].float(), b, n_blocks, b, w)[..., 0] > 0  # (B, n_blocks, w)
    return (in_band & real[:, :, None, :]) | (rel == 0), b  # (B, n_blocks, b, w)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, band: Band, dropout_p: float = 0.0) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V over each query's window only (§3.2.1, Eq. 1; Table 1).
    q, k: (B, h, T, d_k), v: (B, h, T, d_v) -> (B, h, T, d_v), equal to dense attention under
    `band.dense(T)`. O(r T d) time and memory."""
    bsz, h, t, d_k = q.shape
    if band.r >= t - 1:  # every pair is in the window: the dense computation is the banded one
        mask = band.dense(t, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    allowed, b = band_allowed(t, band.r, band.causal, band.key_mask, q.device)
    n_blocks, w = allowed.size(1), allowed.size(-1)
    qb = F.pad(q, (0, 0, 0, n_blocks * b - t)).view(bsz, h, n_blocks, b, d_k)  # (B, h, nb, b, d_k)
    kb = _blocks(k, b, n_blocks, b, w)  # (B, h, nb, w, d_k)
    vb = _blocks(v, b, n_blocks, b, w)  # (B, h, nb, w, d_v)
    scores = qb @ kb.transpose(-1, -2) / math.sqrt(d_k)  # (B, h, nb, b, w)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    weights = F.dropout(scores.softmax(dim=-1), dropout_p, training=dropout_p > 0)
    out = weights @ vb  # (B, h, nb, b, d_v)
    return out.reshape(bsz, h, n_blocks * b, -1)[:, :, :t]  # (B, h, T, d_v)
