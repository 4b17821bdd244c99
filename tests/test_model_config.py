"""Config validation, the Table 3 presets, and their parameter counts against a closed form."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields, replace

import pytest

from aiayn import BASE, PRESETS, Config, UserError, count_parameters, get_preset, load_config

from helpers import MICRO

TABLE3_DELTAS = {  # row -> the fields the paper's Table 3 changes from base
    "A1": dict(n_heads=1, d_k=512, d_v=512), "A4": dict(n_heads=4, d_k=128, d_v=128),
    "A16": dict(n_heads=16, d_k=32, d_v=32), "A32": dict(n_heads=32, d_k=16, d_v=16),
    "B16": dict(d_k=16), "B32": dict(d_k=32),
    "C-N2": dict(n_layers=2), "C-N4": dict(n_layers=4), "C-N8": dict(n_layers=8),
    "C-d256": dict(d_model=256, d_k=32, d_v=32), "C-d1024": dict(d_model=1024, d_k=128, d_v=128),
    "C-ff1024": dict(d_ff=1024), "C-ff4096": dict(d_ff=4096),
    "D-drop0.0": dict(p_drop=0.0), "D-drop0.2": dict(p_drop=0.2),
    "D-ls0.0": dict(eps_ls=0.0), "D-ls0.2": dict(eps_ls=0.2),
    "E": dict(positions="learned"),
    "big": dict(d_model=1024, d_ff=4096, n_heads=16, p_drop=0.3, max_steps=300_000, n_average=20),
}


def test_base_is_the_paper():
    b = PRESETS["base"]
    assert (b.n_layers, b.d_model, b.d_ff, b.n_heads, b.head_dim_k, b.head_dim_v) == (6, 512, 2048, 8, 64, 64)
    assert (b.p_drop, b.eps_ls, b.warmup_steps, b.max_steps) == (0.1, 0.1, 4000, 100_000)
    assert (b.adam_beta1, b.adam_beta2, b.adam_eps) == (0.9, 0.98, 1e-9)
    assert (b.beam_size, b.alpha, b.max_len_a, b.max_len_b, b.n_average) == (4, 0.6, 1.0, 50, 5)
    assert b.norm == "post" and b.positions == "sinusoidal" and b.tie_embeddings
    assert b.p_attn_drop == 0.0 and b.p_ffn_drop == 0.0 and b.attn_window is None and not b.attn_bias


@pytest.mark.parametrize("name", TABLE3_DELTAS)
def test_presets_are_exactly_their_table3_delta(name):
    preset = PRESETS[name]
    changed = {f.name: getattr(preset, f.name) for f in fields(Config)
               if getattr(preset, f.name) != getattr(BASE, f.name)}
    expected = {k: v for k, v in TABLE3_DELTAS[name].items() if getattr(BASE, k) != v}
    assert changed == expected


def test_config_py_holds_only_the_papers_presets_and_recipes_keep_theirs():
    from aiayn.presets import CURRENT, RECIPES, all_presets

    assert set(PRESETS) == {"base", "parsing", "big-enfr", *TABLE3_DELTAS}
    assert PRESETS["big-enfr"] == replace(PRESETS["big"], p_drop=0.1)  # §6.1: EN-FR big drops 0.1
    assert not set(RECIPES) & set(PRESETS) and all_presets() == {**PRESETS, **RECIPES}
    current = {n for names in CURRENT.values() for n in names}
    assert current == set(CURRENT_FIELDS)
    # every recipe preset is a current one, or a Table 3 study row
    assert {n for n in RECIPES if not n.startswith("table3")} == current - {"table3"}


# Each current preset's fields, pinned: a name never silently changes meaning. Each is a delta of
# a paper preset (base, unless PARENTS names another; the chart parser's from ChartConfig's
# defaults), and the delta lists exactly the fields that differ from it.
_SMALL = dict(n_layers=3, d_model=256, d_ff=1024, n_heads=4, p_drop=0.3, warmup_steps=1000,
              max_tokens=4096)
_PARSING = dict(n_layers=4, d_model=1024, beam_size=21, alpha=0.3, max_len_b=300)
PARENTS = {"parsing-seq2seq-small": "parsing"}
CURRENT_FIELDS = {
    "translation-tiny-v2": dict(n_layers=4, d_model=128, d_ff=256, n_heads=4, p_drop=0.3, norm="pre",
                                warmup_steps=1000, lr_scale=2.0, max_tokens=4096, alpha=1.5,
                                lr_cooldown=0.2),
    "translation-small-v2": dict(n_layers=3, d_model=256, d_ff=1024, n_heads=4, p_drop=0.2, norm="pre",
                                 warmup_steps=400, max_tokens=4096, alpha=1.5, lr_cooldown=0.2),
    "translation-small-rnn": dict(arch="rnn", rnn_emb=256, rnn_hidden=256, rnn_attn=256, p_drop=0.3,
                                  warmup_steps=200, max_tokens=4096, lr_cooldown=0.2),
    "g2p-small-v2": dict(n_layers=3, d_model=128, d_ff=512, n_heads=4, warmup_steps=400,
                         max_tokens=4000, max_len_b=10, lr_cooldown=0.2, norm="pre", p_drop=0.0),
    "g2p-small-rnn": dict(arch="rnn", rnn_emb=128, rnn_hidden=256, rnn_attn=256,
                          warmup_steps=200, max_tokens=4000, max_len_b=10, lr_cooldown=0.2),
    "parsing-seq2seq-small": dict(n_layers=3, d_model=128, d_ff=512, n_heads=4, p_drop=0.15,
                                  p_word_drop=0.1, norm="pre", warmup_steps=500, max_tokens=2048,
                                  lr_cooldown=0.2),
    "parsing-chart-small": dict(n_layers=4, d_model=128, d_ff=512, n_heads=4, p_drop=0.2,
                                p_word_drop=0.1, d_span=128, d_char=32, max_chars=20,
                                warmup_steps=1000, lr_scale=1.0, lr_cooldown=0.2, clip_norm=1.0,
                                adam_beta1=0.9, adam_beta2=0.98, adam_eps=1e-9, max_cells=40_000,
                                max_steps=100_000, n_average=5),
    "table3": dict(n_layers=3, d_model=128, d_ff=512, warmup_steps=400, max_tokens=2048,
                   max_steps=1200),
}


@pytest.mark.parametrize("name", sorted(CURRENT_FIELDS))
def test_each_current_preset_is_its_pinned_delta_of_a_paper_preset(name):
    from aiayn.parsing.chart.config import ChartConfig

    got = get_preset(name)
    if isinstance(got, ChartConfig):
        assert got.to_dict() == CURRENT_FIELDS[name]
        return
    parent = PRESETS[PARENTS.get(name, "base")]
    assert got == replace(parent, **CURRENT_FIELDS[name])
    # the delta names only fields that differ from the parent: it says what the preset changes
    assert all(getattr(parent, k) != v for k, v in CURRENT_FIELDS[name].items()), name


def test_one_current_preset_per_task_and_size():
    import re

    from aiayn.presets import CURRENT

    # a recipe's name is its task and size, then -vN for a later version, -rnn for the RNN baseline
    shape = re.compile(r"(?P<kind>.+-(?P<size>tiny|small))(?:-v[0-9]+)?(?P<rnn>-rnn)?")
    seen = set()
    for task in CURRENT.values():
        for name, what in task.items():
            if name == "table3":  # the study's base; its rows are table3-ROW
                continue
            m = shape.fullmatch(name)
            assert m, name
            kind = (m["kind"], m["rnn"])
            assert kind not in seen, f"two current presets for {kind}"
            seen.add(kind)
            # `aiayn info --list` says the size first, so a user sees which to pick
            assert what.startswith(m["size"]), (name, what)


# The settings each retired name had (deltas from the paper's base), as it was defined.
RETIRED_FIELDS = {
    "translation-tiny": dict(_SMALL, n_layers=4, d_model=128, d_ff=256, norm="pre", warmup_steps=400,
                             p_drop=0.3, alpha=1.5, lr_cooldown=0.2),
    "translation-small": dict(_SMALL, p_attn_drop=0.1, p_ffn_drop=0.1, alpha=1.5, lr_cooldown=0.2),
    "g2p-small": dict(n_layers=3, d_model=128, d_ff=512, n_heads=4, warmup_steps=400,
                      max_tokens=4000, max_len_b=10, lr_cooldown=0.2),
    "multi30k": _SMALL,
    "multi30k-v2": dict(_SMALL, p_attn_drop=0.1, p_ffn_drop=0.1, alpha=1.5),
    "multi30k-v3": dict(_SMALL, p_attn_drop=0.1, p_ffn_drop=0.1, alpha=1.5, lr_cooldown=0.2),
    "tiny": dict(_SMALL, p_drop=0.1, max_steps=20_000),
    "micro": dict(n_layers=2, d_model=64, d_ff=256, n_heads=4, warmup_steps=200, max_tokens=2048,
                  max_steps=2000),
    "rnn-multi30k": dict(arch="rnn", rnn_emb=256, rnn_hidden=256, rnn_attn=256, p_drop=0.3,
                         warmup_steps=200, max_tokens=4096, lr_cooldown=0.2),
    "g2p": dict(n_layers=3, d_model=128, d_ff=512, n_heads=4, warmup_steps=400, max_tokens=4000,
                max_len_b=10),
    "g2p-v2": dict(n_layers=3, d_model=128, d_ff=512, n_heads=4, warmup_steps=400, max_tokens=4000,
                   max_len_b=10, lr_cooldown=0.2),
    "parsing-cpu": dict(_PARSING, n_layers=3, d_model=256, d_ff=1024, n_heads=4, p_drop=0.3,
                        warmup_steps=500, max_tokens=2048, lr_cooldown=0.2),
    "parsing-small": dict(_PARSING, n_layers=3, d_model=128, d_ff=512, n_heads=4, p_drop=0.3,
                          warmup_steps=500, max_tokens=2048, lr_cooldown=0.2, norm="pre"),
    "parsing-small-wd": dict(_PARSING, n_layers=3, d_model=128, d_ff=512, n_heads=4, p_drop=0.3,
                             warmup_steps=500, max_tokens=2048, lr_cooldown=0.2, norm="pre",
                             p_word_drop=0.1),
    "parsing-small-v2": dict(_PARSING, n_layers=3, d_model=128, d_ff=512, n_heads=4, p_drop=0.2,
                             warmup_steps=500, max_tokens=2048, lr_cooldown=0.2, norm="pre",
                             p_word_drop=0.1),
    "parsing-small-v3": dict(_PARSING, n_layers=3, d_model=128, d_ff=512, n_heads=4, p_drop=0.15,
                             warmup_steps=500, max_tokens=2048, lr_cooldown=0.2, norm="pre",
                             p_word_drop=0.1),
}


@pytest.mark.parametrize("name", sorted(RETIRED_FIELDS))
def test_a_retired_preset_fails_naming_a_successor_with_the_same_settings(name, capsys):
    from aiayn.cli import main as cli_main
    from aiayn.presets import CURRENT, RETIRED

    with pytest.raises(UserError, match=f"preset '{name}' was retired; use `--preset"):
        load_config(name)
    # the successor the message names gives exactly the settings the name had
    successor = RETIRED[name].split("`")[1].split()
    preset = successor[1]
    overrides = successor[3:] if "--set" in successor else []
    # ... on a current preset or a paper one, never another retired or earlier name
    assert preset in {n for task in CURRENT.values() for n in task} | set(PRESETS)
    assert load_config(preset, overrides=overrides) == replace(BASE, **RETIRED_FIELDS[name])
    # and the command line says so in one line
    assert cli_main(["info", "--preset", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and successor[1] in err


def test_every_retired_name_is_tested_and_none_is_in_use():
    from aiayn.presets import RETIRED, all_presets

    # the pointer's preset has no successor with its settings: the option is gone
    assert set(RETIRED) == set(RETIRED_FIELDS) | {"parsing-small-v3-pointer"}
    assert not set(RETIRED) & set(all_presets())
    with pytest.raises(UserError, match="removed with Config.pointer"):
        load_config("parsing-small-v3-pointer")


def test_saved_configs_of_retired_fields_still_load():
    d = replace(BASE, vocab_size=100).to_dict()
    assert Config.from_dict({**d, "p_bpe_drop": 0.0}) == Config.from_dict(d)


def closed_form_parameters(c: Config) -> int:
    """Independent count: embeddings, per-layer attention/FFN/LayerNorm, optional extras."""
    d, hk, hv = c.d_model, c.n_heads * c.head_dim_k, c.n_heads * c.head_dim_v
    attn = d * hk * 2 + d * hv + hv * d + ((2 * hk + hv + d) if c.attn_bias else 0)
    ffn = d * c.d_ff + c.d_ff + c.d_ff * d + d
    ln = 2 * d
    enc = attn + ffn + 2 * ln
    dec = 2 * attn + ffn + 3 * ln
    emb = c.vocab_size * d
    if not c.tie_embeddings:
        emb += (c.tgt_vocab_size or c.vocab_size) * d
        if not c.tie_output:
            emb += (c.tgt_vocab_size or c.vocab_size) * d
    pos = 2 * c.max_positions * d if c.positions == "learned" else 0
    final_ln = 2 * ln if c.norm == "pre" else 0
    return c.n_layers * (enc + dec) + emb + pos + final_ln


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_parameter_count_matches_closed_form(name):
    cfg = replace(PRESETS[name], vocab_size=37000)
    assert count_parameters(cfg) == closed_form_parameters(cfg)


@pytest.mark.parametrize("delta", [dict(norm="pre"), dict(attn_bias=True),
                                   dict(tie_embeddings=False, tgt_vocab_size=900, tie_output=False),
                                   dict(tie_embeddings=False, tgt_vocab_size=900)])
def test_options_parameter_count_matches_closed_form(delta):
    cfg = replace(MICRO, vocab_size=1000, **delta)
    assert count_parameters(cfg) == closed_form_parameters(cfg)


def test_parameter_differences_match_table3():
    # The paper's vocabulary is only "about 37K", so absolute counts drift with it; differences
    # between rows do not depend on the vocabulary and must match Table 3 (rounded to 1M).
    base = count_parameters(replace(BASE, vocab_size=37000)) / 1e6
    for name, paper_m in [("big", 213), ("C-d256", 28), ("C-d1024", 168), ("C-ff1024", 53),
                          ("C-ff4096", 90), ("C-N2", 36), ("C-N4", 50), ("C-N8", 80),
                          ("B16", 58), ("B32", 60)]:
        n = count_parameters(replace(PRESETS[name], vocab_size=37000)) / 1e6
        # a d_model change also resizes the embedding, whose true vocabulary size is unknown
        tolerance = 6 if PRESETS[name].d_model != 512 else 1.6
        assert abs((n - base) - (paper_m - 65)) < tolerance, (name, n - base, paper_m - 65)


@pytest.mark.parametrize("bad,needle", [
    (dict(d_model=500, n_heads=3), "not divisible"),
    (dict(p_drop=1.5), "p_drop"),
    (dict(n_layers=0), "n_layers"),
    (dict(norm="middle"), "norm"),
    (dict(vocab_size=10, tgt_vocab_size=20), "tie_embeddings"),
    (dict(d_k=0), "d_k"),
])
def test_invalid_configs_raise_user_error(bad, needle):
    with pytest.raises(UserError, match=needle):
        replace(BASE, **bad)


def test_d_k_given_makes_indivisible_d_model_valid():
    cfg = replace(BASE, d_model=500, n_heads=3, d_k=64, d_v=64)
    assert cfg.head_dim_k == 64


def test_overrides_and_config_file(tmp_path):
    cfg = load_config("base", overrides=["d_ff=1024", "norm=pre", "d_k=None", "tie_embeddings=false"])
    assert (cfg.d_ff, cfg.norm, cfg.d_k, cfg.tie_embeddings) == (1024, "pre", None, False)
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"n_layers": 2, "p_drop": 0.2}))
    assert load_config("big", str(f)).n_layers == 2
    with pytest.raises(UserError, match="unknown config field"):
        load_config("base", overrides=["dmodel=3"])
    with pytest.raises(UserError, match="invalid value"):
        load_config("base", overrides=["d_model=big"])
    f.write_text('{"n_layer": 2}')
    with pytest.raises(UserError, match="n_layer"):
        load_config("base", str(f))
    assert Config.from_dict(cfg.to_dict()) == cfg


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "aiayn", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_info_cli_reports_exact_parameter_count():
    r = run_cli("info", "--preset", "base", "--vocab-size", "37000", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["parameters"] == closed_form_parameters(replace(BASE, vocab_size=37000))
    assert out["train_flops_per_target_token"] > 6 * out["parameters"] * 0.5


def test_info_cli_bad_input_is_one_line_error():
    r = run_cli("info", "--preset", "nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "unknown preset" in r.stderr
