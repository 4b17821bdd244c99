"""Word dropout (Sennrich et al., 2016), an option beside the paper's dropout (`Config.p_word_drop`,
0 by default): source tokens replaced by UNK, so the model learns to translate around words it does
not know. The paper's dropout (§5.4) is `aiayn.kernels.dropout.dropout`."""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.special import EOS_ID, UNK_ID


def word_dropout(ids: Tensor, p: float, training: bool) -> Tensor:
    """Token ids (B, S) with each ordinary token replaced by UNK with probability p (the config's
    p_word_drop); PAD, BOS, EOS and UNK stay. Identity when not training or p == 0."""
    if not training or p == 0.0:
        return ids
    drop = (torch.rand(ids.shape, device=ids.device) < p) & (ids > EOS_ID)  # ids 0-3 are the specials
    return ids.masked_fill(drop, UNK_ID)
