"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Python API (the CLI is built on the same functions):

    from aiayn import Config, PRESETS, Transformer
    cfg = replace(PRESETS["base"], vocab_size=37000)
    model = Transformer(cfg)
"""

from aiayn.config import BASE, PRESETS, Config, get_preset, load_config
from aiayn.errors import UserError
from aiayn.model import KVCache, Transformer, count_parameters, flops_per_target_token

__version__ = "0.1.0"
__all__ = ["Config", "BASE", "PRESETS", "get_preset", "load_config", "UserError", "Transformer",
           "KVCache", "count_parameters", "flops_per_target_token"]
