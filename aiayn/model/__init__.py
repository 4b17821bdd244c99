"""The Transformer model (§3): `Transformer`, `KVCache`, counting helpers."""

from aiayn.model.cache import KVCache
from aiayn.model.counting import count_parameters, flops_per_target_token
from aiayn.model.transformer import Transformer

__all__ = ["Transformer", "KVCache", "count_parameters", "flops_per_target_token"]
