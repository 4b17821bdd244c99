"""The Transformer model (§3): `Transformer`, `KVCache`, counting helpers; `build_model` makes the
model a config names (the Transformer, or the RNN baseline of `aiayn.model.rnn`)."""

from aiayn.model.build import build_model
from aiayn.model.cache import KVCache
from aiayn.model.counting import count_parameters, flops_per_target_token
from aiayn.model.transformer import Transformer

__all__ = ["build_model", "Transformer", "KVCache", "count_parameters", "flops_per_target_token"]
