"""`build_model(cfg)`: the one place a model is made from a config (training, loading, counting)."""

from __future__ import annotations

from torch import nn

from aiayn.config import Config
from aiayn.model.rnn import RNNSearch
from aiayn.model.transformer import Transformer


def build_model(cfg: Config) -> nn.Module:
    """The architecture `cfg.arch` names, freshly initialised: the Transformer (§3), or the
    attention-based RNN encoder-decoder baseline (`aiayn.model.rnn`)."""
    if cfg.arch == "rnn":
        return RNNSearch(cfg)
    return Transformer(cfg)
