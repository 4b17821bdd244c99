"""The Table 3 study: each row scaled from the paper's preset as worked out by hand, the verdicts
and noise on hand-made results, and a whole study on a tiny fixture that is killed in a row,
resumed (bit for bit, finished rows untouched), measured independently and reported."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from aiayn.cli import main as cli_main
from aiayn.config import PRESETS
from aiayn.errors import UserError
from aiayn.presets import get_preset, load_config
from aiayn.recipes import table3_study as study
from aiayn.recipes.table3 import CLAIMS, PAPER_TABLE3, ROWS, TABLE3, row_config
from aiayn.recipes.table3_plot import spread
from aiayn.recipes.table3_report import Noise, judge, noise, report, verdict
from aiayn.training import step as step_module

from helpers import SMALL, tiny_dataset

# Worked out by hand from Table 3 with N x 1/2 and widths x 1/4 (study base: N 3, d_model 128,
# d_ff 512, h 8, d_k = d_v = 16): (n_layers, d_model, d_ff, h, d_k, d_v, p_drop, eps_ls, positions)
EXPECTED = {
    "base": (3, 128, 512, 8, 16, 16, 0.1, 0.1, "sinusoidal"),
    "A1": (3, 128, 512, 1, 128, 128, 0.1, 0.1, "sinusoidal"),
    "A4": (3, 128, 512, 4, 32, 32, 0.1, 0.1, "sinusoidal"),
    "A16": (3, 128, 512, 16, 8, 8, 0.1, 0.1, "sinusoidal"),
    "A32": (3, 128, 512, 32, 4, 4, 0.1, 0.1, "sinusoidal"),
    "B16": (3, 128, 512, 8, 4, 16, 0.1, 0.1, "sinusoidal"),
    "B32": (3, 128, 512, 8, 8, 16, 0.1, 0.1, "sinusoidal"),
    "C-N2": (1, 128, 512, 8, 16, 16, 0.1, 0.1, "sinusoidal"),
    "C-N4": (2, 128, 512, 8, 16, 16, 0.1, 0.1, "sinusoidal"),
    "C-N8": (4, 128, 512, 8, 16, 16, 0.1, 0.1, "sinusoidal"),
    "C-d256": (3, 64, 512, 8, 8, 8, 0.1, 0.1, "sinusoidal"),
    "C-d1024": (3, 256, 512, 8, 32, 32, 0.1, 0.1, "sinusoidal"),
    "C-ff1024": (3, 128, 256, 8, 16, 16, 0.1, 0.1, "sinusoidal"),
    "C-ff4096": (3, 128, 1024, 8, 16, 16, 0.1, 0.1, "sinusoidal"),
    "D-drop0.0": (3, 128, 512, 8, 16, 16, 0.0, 0.1, "sinusoidal"),
    "D-drop0.2": (3, 128, 512, 8, 16, 16, 0.2, 0.1, "sinusoidal"),
    "D-ls0.0": (3, 128, 512, 8, 16, 16, 0.1, 0.0, "sinusoidal"),
    "D-ls0.2": (3, 128, 512, 8, 16, 16, 0.1, 0.2, "sinusoidal"),
    "E": (3, 128, 512, 8, 16, 16, 0.1, 0.1, "learned"),
}
SHAPE = ("n_layers", "d_model", "d_ff", "n_heads", "head_dim_k", "head_dim_v", "p_drop", "eps_ls",
         "positions")


def test_the_rows_are_the_papers_table3_presets_but_big():
    assert list(ROWS) == list(EXPECTED)
    assert set(PRESETS) - set(ROWS) == {"big", "big-enfr", "parsing"} and set(PAPER_TABLE3) == {*ROWS, "big"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_row_is_the_papers_change_scaled(name):
    cfg = row_config(name)
    assert tuple(getattr(cfg, f) for f in SHAPE) == EXPECTED[name]
    # nothing else differs from the study base (recipe, decoding), and the preset is the row
    shape = {"d_k", "d_v", *SHAPE} - {"head_dim_k", "head_dim_v"}
    assert replace(cfg, **{f: getattr(TABLE3, f) for f in shape}) == TABLE3
    assert get_preset("table3" if name == "base" else f"table3-{name}") == cfg
    if name.startswith("A"):  # constant computation: h * d_k = d_model
        assert cfg.n_heads * cfg.head_dim_k == cfg.d_model == TABLE3.d_model


def test_a_base_that_cannot_scale_a_row_is_refused(tmp_path):
    with pytest.raises(ValueError, match="n_layers=2 scales to 0.666667"):
        row_config("C-N2", replace(TABLE3, n_layers=2))
    data = tiny_dataset(tmp_path, n_train=20, n_valid=4)
    settings = study.StudySettings(base=replace(TABLE3, n_layers=2))
    with pytest.raises(UserError, match="row C-N2: n_layers=2 scales"):
        study.run_study(data, tmp_path / "s", study.plan(["base", "C-N2"]), settings)
    assert not (tmp_path / "s").exists()  # refused before anything was written


def test_plan_orders_rows_as_the_paper_and_seeds_only_the_base():
    runs = study.plan(["E", "A1", "base"], [3, 1])
    assert [r.name for r in runs] == ["base", "base-seed3", "A1", "E"]
    assert [r.name for r in study.plan()][:4] == ["base", "base-seed2", "base-seed3", "A1"]
    assert len(study.plan()) == len(ROWS) + 2
    with pytest.raises(UserError, match="unknown Table 3 row 'F'"):
        study.plan(["F"])


@pytest.mark.parametrize("ours,paper,threshold,same,expected", [
    (0.5, 0.2, 0.3, False, "reproduced"), (-0.5, -0.9, 0.3, False, "reproduced"),
    (-0.5, 0.2, 0.3, False, "reversed"), (0.29, -0.9, 0.3, False, "within noise"),
    (0.1, 0.0, 0.3, True, "reproduced"), (-0.4, -0.1, 0.3, True, "not reproduced"),
    (0.01, 0.2, None, False, "reproduced (no noise estimate)"),
])
def test_verdicts_by_hand(ours, paper, threshold, same, expected):
    assert verdict(ours, paper, threshold, same) == expected


def result(row, seed=1, ppl=10.0, bleu=20.0):
    return study.RowResult(name=study.Run(row, seed).name, row=row, seed=seed, params=1, dev_ppl=ppl,
                           dev_nll=math.log(ppl), dev_bleu=bleu, tok_s=1.0, updates=1, tgt_tokens=1,
                           train_seconds=1.0, decode_seconds=1.0, bleu_signature="")


def test_noise_and_a_claim_judged_by_hand():
    base = [result("base", 1, 10.0, 20.0), result("base", 2, 10.4, 21.0), result("base", 3, 10.2, 22.0)]
    n = noise(base + [result("A1", 1, 11.0, 18.0)])
    assert n.seeds == [1, 2, 3]
    assert n.ppl_std == pytest.approx(0.2) and n.bleu_std == pytest.approx(1.0)
    assert n.bleu_threshold == pytest.approx(2 * math.sqrt(2))
    single_head = CLAIMS[0]
    assert (single_head.row, single_head.against) == ("A1", "base")
    assert single_head.paper() == pytest.approx((5.29 - 4.92, 24.9 - 25.8))
    c = judge(single_head, {"base": base[0], "A1": result("A1", 1, 11.0, 18.0)}, n)
    assert (c.d_ppl, c.d_bleu) == pytest.approx((1.0, -2.0))
    # +1.0 PPL beyond 2 sqrt(2) x 0.2 = 0.57: reproduced; -2.0 BLEU within 2.83
    assert (c.ppl_verdict, c.bleu_verdict) == ("reproduced", "within noise")
    assert judge(single_head, {"base": base[0]}, n) is None
    assert noise(base[:1]) == Noise([1], None, None)


# --- a whole study on the tiny fixture --------------------------------------------------------

TINY_ROWS, TINY_SEEDS, UPDATES = ["base", "A1", "D-ls0.0", "E"], [1, 2], 12


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("tiny"), n_train=300, n_valid=12)


def tiny_settings():
    # the study base at the width of the training tests' SMALL model, with h 8 (d_k 4) as the
    # study base has, so that A1's d_k is 32
    base = load_config("table3", overrides=[*SMALL, "n_heads=8", f"max_steps={UPDATES}"])
    return study.StudySettings(base=base, eval_every=6)


def options():
    # fp32, so that the dev perplexity measured in training equals `aiayn evaluate`'s (fp32) on
    # every machine; under bf16 autocast (a CPU with native bf16) they differ in the 4th digit
    return study.RunOptions(threads=1, save_every=4, precision="fp32", progress=False,
                            say=lambda _: None)


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory):
    """The tiny study, uninterrupted."""
    out = tmp_path_factory.mktemp("whole") / "study"
    results = study.run_study(data, out, study.plan(TINY_ROWS, TINY_SEEDS), tiny_settings(), options())
    return out, results


@pytest.mark.slow
def test_a_killed_study_resumes_where_it_stopped(whole, data, tmp_path, monkeypatch):
    out_whole, expected = whole
    out = tmp_path / "study"
    runs = study.plan(TINY_ROWS, TINY_SEEDS)
    assert [r.name for r in runs] == ["base", "base-seed2", "A1", "D-ls0.0", "E"]
    calls = {"n": 0}
    real = step_module.Updater.update

    def dies_in_A1(self, micro, step, lr_factor=1.0):  # A1 is the third run: update 7 of it
        calls["n"] += 1
        if calls["n"] == 2 * UPDATES + 7:
            raise KeyboardInterrupt
        return real(self, micro, step, lr_factor)

    monkeypatch.setattr(step_module.Updater, "update", dies_in_A1)
    with pytest.raises(KeyboardInterrupt):
        study.run_study(data, out, runs, tiny_settings(), options())
    monkeypatch.setattr(step_module.Updater, "update", real)
    assert (out / "runs/base-seed2/row.json").exists() and not (out / "runs/A1/row.json").exists()
    done_before = {n: (out / f"runs/{n}/row.json").stat().st_mtime_ns for n in ("base", "base-seed2")}

    trained = []
    from aiayn.training import trainer

    real_train = trainer.train

    def recorded(cfg, data_dir, run_dir, opts):
        trained.append((run_dir.name, opts.resume))
        return real_train(cfg, data_dir, run_dir, opts)

    monkeypatch.setattr(trainer, "train", recorded)
    said = []
    results = study.run_study(data, out, runs, tiny_settings(),
                              replace(options(), say=said.append))
    assert [name for name, _ in trained] == ["A1", "D-ls0.0", "E"]  # finished rows not retrained
    assert all(resume for _, resume in trained)
    assert said[0] == "[1/5] base: done" and said[2].startswith("[3/5] A1: h=1 d_k=32 d_v=32")
    assert {n: (out / f"runs/{n}/row.json").stat().st_mtime_ns for n in done_before} == done_before
    # A1 went on from its checkpoint at update 4 and ended exactly where the uninterrupted run did
    log = (out / "runs/A1/metrics.jsonl").read_text()
    assert sorted(json.loads(l)["step"] for l in log.splitlines() if '"dev"' in l) == [6, 12]
    for r, e in zip(results, expected):
        assert (r.name, r.dev_ppl, r.dev_bleu, r.params, r.updates) == \
               (e.name, e.dev_ppl, e.dev_bleu, e.params, e.updates)
        a = load_file(str(out / "runs" / r.name / "last" / "model.safetensors"))
        b = load_file(str(out_whole / "runs" / r.name / "last" / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), r.name


def test_rows_measure_what_table3_measures(whole, data):
    """dev PPL and beam-4 BLEU of each row again, through the text paths of `aiayn evaluate` and
    `aiayn translate` on the final weights (no averaging)."""
    from aiayn.commands.evaluate import model_perplexity
    from aiayn.data.dataset import ParallelDataset
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator
    from aiayn.evaluation.sacre import sacre_bleu
    from aiayn.model.counting import count_parameters

    out, results = whole
    dev = ParallelDataset(data, "valid")
    srcs, refs = dev.reference_lines("src"), dev.reference_lines("tgt")
    for r in results:
        loaded = load_model(out / "runs" / r.name / "last")
        assert loaded.meta["step"] == UPDATES == r.updates and loaded.cfg.beam_size == 4
        hyps = Translator(loaded, precision="fp32", beam_size=4).translate(srcs)  # as the study
        assert r.dev_bleu == pytest.approx(sacre_bleu(hyps, refs).score, abs=1e-9)
        assert r.dev_ppl == pytest.approx(model_perplexity(str(loaded.path), srcs, refs)["ppl"], rel=1e-5)
        assert r.params == count_parameters(loaded.cfg)
        assert r.tok_s > 0 and [c["step"] for c in r.curve] == [6, 12]
    by = {r.name: r for r in results}
    assert by["A1"].config == {"n_heads": 1, "d_k": 32, "d_v": 32}
    assert by["E"].config == {"positions": "learned"} and by["base-seed2"].config == {}
    assert by["E"].params > by["base"].params  # the learned position table
    assert by["base"].dev_ppl != by["base-seed2"].dev_ppl  # another seed is another run


def test_curve_labels_spread_apart_in_order_around_their_ends():
    assert spread([0.0, 1.0], 0.05) == [0.0, 1.0]  # far apart: left where they are
    got = spread([0.02, 0.0, 0.01, 1.0], 0.05)  # three touching ends, given out of order
    assert got[1] == pytest.approx(-0.04) and got[2] == pytest.approx(0.01)
    assert got[0] == pytest.approx(0.06) and got[3] == 1.0  # centred on 0.01, 0.05 apart
    # a cluster pushed into its neighbour merges with it
    got = spread([0.0, 0.0, 0.0, 0.08], 0.05)  # 0.08 is within 0.05 of the cluster's top, 0.05
    assert got == pytest.approx([-0.055, -0.005, 0.045, 0.095])


@pytest.mark.slow
def test_report_files(whole, tmp_path):
    out, results = whole
    doc = report(out)
    folder = out / "report"
    assert [r["name"] for r in doc["rows"]] == [r.name for r in results]
    row = doc["rows"][2]
    assert (row["name"], row["paper_ppl"], row["paper_bleu"], row["paper_params_m"]) == \
           ("A1", 5.29, 24.9, None)
    assert row["change"] == "h=1 d_k=32 d_v=32" and row["curve"][-1]["step"] == UPDATES
    assert doc["noise"]["seeds"] == [1, 2] and doc["noise"]["bleu_std"] is not None
    assert [c["row"] for c in doc["claims"]] == ["A1", "base", "E"]  # the claims these rows test
    assert json.loads((folder / "results.json").read_text()) == doc
    lines = (folder / "results.csv").read_text().splitlines()
    assert lines[0] == "name,row,seed,params,dev_ppl,dev_bleu,tok_s,paper_ppl,paper_bleu,paper_params_m,change"
    assert len(lines) == 1 + len(results) and lines[3].startswith("A1,A1,1,")
    md = (folder / "table3.md").read_text()
    assert "| base (seed 2) |" in md and "| A1 − base |" in md and "2·√2·σ" in md
    for png in ("table3.png", "curves.png"):
        assert (folder / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # gathering rows run apart: a copy holding some of the runs reports just those
    part = tmp_path / "part"
    (part / "runs").mkdir(parents=True)
    shutil.copy(out / "study.json", part / "study.json")
    shutil.copytree(out / "runs" / "E", part / "runs" / "E")
    assert cli_main(["study", "table3", "--out", str(part), "--report-only"]) == 0
    assert [r["name"] for r in json.loads((part / "report/results.json").read_text())["rows"]] == ["E"]


def test_a_study_with_other_settings_is_refused(whole, data, capsys):
    out, _ = whole
    with pytest.raises(UserError, match="holds a study with other settings"):
        study.run_study(data, out, study.plan(["base"], [1]),
                        replace(tiny_settings(), eval_every=3), options())
    args = ["study", "table3", "--data", str(data), "--out", str(out), "--rows", "base",
            "--seeds", "1", "--no-progress"]
    assert cli_main(args) == 2  # the table3 preset's settings, not the tiny study's
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("aiayn study: error:") and "updates" in err
    for bad in (["--rows", "F"], ["--max-steps", "0"]):
        assert cli_main(["study", "table3", "--data", str(data), "--out", str(out), *bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert cli_main(["study", "table3", "--out", str(out / "none"), "--report-only"]) == 2
    assert "holds no study" in capsys.readouterr().err
