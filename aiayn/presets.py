"""Every preset by name: the paper's (aiayn/config.py) and each recipe's (aiayn/recipes/), and the
names that were retired.

A preset is named for its task and size (`translation-tiny-v2`: its task, its size, and `-v2`
because an earlier `translation-tiny` had other settings); each is a small delta of a paper preset,
and one preset per task and size is current (`CURRENT`), beside the RNN baselines. The paper's
presets keep the paper's names. A name never changes meaning: a new setting gets a new name, and a
retired name fails with the exact `--preset CURRENT --set ...` that gives its settings
(`RETIRED`), so an old command says what to type instead. Scores and the machines they were
measured on belong in docs/experiments/, not here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiayn.checks import read_json
from aiayn.config import PRESETS as PAPER
from aiayn.config import ConfigFields
from aiayn.errors import UserError
from aiayn.recipes import g2p, multi30k, parsing, table3

# Per task, its current presets, one per size (the RNN baselines beside them), with a line each on
# what it is for.
CURRENT: dict[str, dict[str, str]] = {
    "translation": {
        "translation-tiny-v2": ("tiny, the recipe (scripts/multi30k.sh): a small corpus such as "
                                "Multi30k (~30K pairs) in an hour on a CPU; 4+4 layers, d_model "
                                "128, pre-norm, P_drop 0.3, Eq. 3 doubled after a 1,000-update warmup"),
        "translation-small-v2": ("small, the same recipe at 3+3 layers, d_model 256, P_drop 0.2, "
                                 "Eq. 3 itself after a 400-update warmup"),
        "translation-small-rnn": ("small, the RNN encoder-decoder baseline (Table 1's comparison) "
                                  "for the same data"),
    },
    "grapheme-to-phoneme": {
        "g2p-small-v2": ("small, the demo (scripts/demo.sh): CMUdict spellings to pronunciations; "
                         "3+3 layers, d_model 128, pre-norm, no dropout"),
        "g2p-small-rnn": "small, the RNN encoder-decoder baseline (Table 1's comparison) for the same data",
    },
    "parsing": {
        "parsing-chart-small": ("small, the span-based chart parser (not in the paper) on the WSJ "
                                "sample, on a CPU"),
        "parsing-seq2seq-small": ("small, §6.3's sequence-to-sequence parser at CPU size (the "
                                  "chart's voters)"),
    },
    "table3 study": {
        "table3": "the study base of Table 3 at CPU scale; table3-ROW for each row (aiayn study table3)",
    },
}

RECIPES: dict[str, Any] = {**multi30k.PRESETS, **g2p.PRESETS, **parsing.PRESETS, **table3.PRESETS}

# Names that once meant a config and no longer do, with the exact settings they had as a current
# preset and `--set` (tests/test_model_config.py checks each field for field).
_SAME = ", the same settings"
RETIRED: dict[str, str] = {
    "translation-tiny": "use `--preset translation-tiny-v2 --set warmup_steps=400 lr_scale=1`" + _SAME,
    "translation-small": ("use `--preset translation-small-v2 --set norm=post warmup_steps=1000 "
                          "p_drop=0.3 p_attn_drop=0.1 p_ffn_drop=0.1`" + _SAME),
    "multi30k-v3": ("use `--preset translation-small-v2 --set norm=post warmup_steps=1000 p_drop=0.3 "
                    "p_attn_drop=0.1 p_ffn_drop=0.1`" + _SAME),
    "multi30k-v2": ("use `--preset translation-small-v2 --set norm=post warmup_steps=1000 p_drop=0.3 "
                    "p_attn_drop=0.1 p_ffn_drop=0.1 lr_cooldown=0`" + _SAME),
    "multi30k": ("use `--preset translation-small-v2 --set norm=post warmup_steps=1000 p_drop=0.3 "
                 "alpha=0.6 lr_cooldown=0`" + _SAME),
    "tiny": ("use `--preset translation-small-v2 --set norm=post warmup_steps=1000 p_drop=0.1 "
             "alpha=0.6 lr_cooldown=0 max_steps=20000`" + _SAME),
    "micro": ("use `--preset base --set n_layers=2 d_model=64 d_ff=256 n_heads=4 warmup_steps=200 "
              "max_tokens=2048 max_steps=2000`" + _SAME),
    "rnn-multi30k": "use `--preset translation-small-rnn`" + _SAME,
    "g2p-small": "use `--preset g2p-small-v2 --set norm=post p_drop=0.1`" + _SAME,
    "g2p-v2": "use `--preset g2p-small-v2 --set norm=post p_drop=0.1`" + _SAME,
    "g2p": "use `--preset g2p-small-v2 --set norm=post p_drop=0.1 lr_cooldown=0`" + _SAME,
    "parsing-small-v3": "use `--preset parsing-seq2seq-small`" + _SAME,
    "parsing-small-v2": "use `--preset parsing-seq2seq-small --set p_drop=0.2`" + _SAME,
    "parsing-small-wd": "use `--preset parsing-seq2seq-small --set p_drop=0.3`" + _SAME,
    "parsing-small": "use `--preset parsing-seq2seq-small --set p_drop=0.3 p_word_drop=0`" + _SAME,
    "parsing-cpu": ("use `--preset parsing-seq2seq-small --set p_drop=0.3 p_word_drop=0 d_model=256 "
                    "d_ff=1024 norm=post`" + _SAME),
    "parsing-small-v3-pointer": ("removed with Config.pointer (docs/experiments/parsing.md; aiayn "
                                 "at commit 1fe4095 has it); the nearest is `--preset "
                                 "parsing-seq2seq-small`"),
}

assert not set(PAPER) & set(RECIPES), "a recipe preset reuses a paper preset's name"
assert not set(RETIRED) & (set(PAPER) | set(RECIPES)), "a retired preset name is in use"
assert all(n in RECIPES for names in CURRENT.values() for n in names), "CURRENT names a missing preset"


def all_presets() -> dict[str, Any]:
    """The paper's presets, then the recipes'."""
    return {**PAPER, **RECIPES}


def get_preset(name: str) -> Any:
    """A preset by name (a `Config`, or a task's own config such as the chart parser's). A
    retired name fails with its exact successor."""
    if name in RETIRED:
        raise UserError(f"preset {name!r} was retired; {RETIRED[name]}")
    try:
        return all_presets()[name]
    except KeyError:
        shown = [n for names in CURRENT.values() for n in names] + list(PAPER)
        raise UserError(f"unknown preset {name!r}; choose from: {', '.join(shown)} "
                        "(`aiayn info --list` says what each is for)") from None


def load_config(preset: str | None = None, config_file: str | None = None,
                overrides: list[str] | None = None, **fixed: Any) -> Any:
    """Build a config the way the CLI does: preset (default base), then a JSON config file's fields,
    then `name=value` overrides, then `fixed` fields set by the caller (e.g. vocab_size from data)."""
    cfg: ConfigFields = get_preset(preset or "base")
    if config_file:
        data = read_json(config_file)
        if not isinstance(data, dict):
            raise UserError(f"{config_file}: expected a JSON object of config fields")
        cfg = type(cfg).from_dict({**({"task": cfg.TASK} if cfg.TASK else {}), **cfg.to_dict(), **data},
                                  config_file)
    if overrides:
        cfg = cfg.with_overrides(overrides)
    if fixed:
        cfg = replace(cfg, **fixed)  # type: ignore[type-var]
    return cfg
