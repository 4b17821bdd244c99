"""End-to-end recipes built from the library, each module with its presets beside it:
`g2p` (CMUdict grapheme-to-phoneme, the demo), `multi30k` (Multi30k translation; the pipeline
itself is scripts/multi30k.sh), `parsing` (constituency parsing on a Penn Treebank, §6.3;
scripts/parsing.sh), `table3` (the paper's Table 3 variations at CPU scale, run by
`table3_study` and reported by `table3_report`). `download` fetches public data sets with
checksums, resumably; `wmt14` is where the paper's WMT 2014 data is and how it unpacks (its recipe
is scripts/wmt14.sh, its presets the paper's own, in aiayn/config.py).

A recipe's presets are a `PRESETS` dict in its module, each a small delta of its parent; the
modules listed in `RECIPE_MODULES` are where `aiayn.config.get_preset` looks after the paper's.
"""

from __future__ import annotations

import importlib

RECIPE_MODULES = ("g2p", "multi30k", "parsing", "table3")

# Names that once meant a config and no longer do: asking for one fails with its successor, which
# gives exactly the settings the old name had.
RETIRED_PRESETS = {
    "multi30k-v2": "use `--preset multi30k-v3 --set lr_cooldown=0`, the same settings",
    "tiny": "use `--preset multi30k --set p_drop=0.1 max_steps=20000`, the same settings",
    "micro": ("use `--preset base --set n_layers=2 d_model=64 d_ff=256 n_heads=4 warmup_steps=200 "
              "max_tokens=2048 max_steps=2000`, the same settings"),
}


def recipe_presets() -> dict:
    """Every recipe's presets by name (name clashes between recipes are a programming error)."""
    out: dict = {}
    for name in RECIPE_MODULES:
        presets = importlib.import_module(f"aiayn.recipes.{name}").PRESETS
        clash = set(out) & set(presets)
        assert not clash, f"preset names defined twice: {clash}"
        out.update(presets)
    return out
