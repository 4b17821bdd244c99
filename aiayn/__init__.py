"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Python API (the CLI is built on the same functions):

    from dataclasses import replace
    from aiayn import PRESETS, Transformer
    model = Transformer(replace(PRESETS["base"], vocab_size=37000))

Names are imported on first use, so `import aiayn` (and every `aiayn` command) does not pay for
importing torch until it needs it.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "Config": "aiayn.config", "BASE": "aiayn.config", "PRESETS": "aiayn.config",
    "get_preset": "aiayn.presets", "load_config": "aiayn.presets", "UserError": "aiayn.errors",
    "Transformer": "aiayn.model", "build_model": "aiayn.model", "KVCache": "aiayn.model",
    "count_parameters": "aiayn.model", "flops_per_target_token": "aiayn.model",
    "load_model": "aiayn.data.model_dir", "save_model": "aiayn.data.model_dir",
}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
