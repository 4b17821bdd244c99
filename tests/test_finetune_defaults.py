"""Fine-tuning that works as written: `train --init-from`'s defaults (aiayn/training/finetune.py)
apply with --init-from and not without, an explicit --set or --save-minutes wins, a resumed run
keeps them; `prepare --vocab-from` says in one line when the model's vocabulary splits a side of
the new data into far more pieces than the model's own data (aiayn/data/vocab_fit.py)."""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from dataclasses import replace

import pytest

from aiayn.cli import main as cli_main
from aiayn.commands import train as train_command
from aiayn.data.model_dir import read_config
from aiayn.data.tokenizer import Tokenizer
from aiayn.presets import get_preset
from aiayn.training import distributed, finetune
from aiayn.training.checkpoint import list_checkpoints
from aiayn.training.schedule import lr_at, peak_learning_rate
from aiayn.training.seq2seq import Seq2SeqTask
from aiayn.training.trainer import Trainer, TrainOptions

from helpers import SMALL

QUIET = ["--threads", "1", "--no-progress", "--no-tensorboard", "--eval-bleu-sentences", "0",
         "--eval-every", "0"]


# --- two tiny "languages" and a third ------------------------------------------------------------

def lexicon(seed: int, letters: str, n: int = 10) -> list[str]:
    rng, words = random.Random(seed), set()
    while len(words) < n:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(4, 6))))
    return sorted(words)


XX = lexicon(1, "abcdefghij")  # the source language
YY = [w.translate(str.maketrans("abcdefghij", "klmnopqrst")) for w in XX]  # its translation
ZZ = lexicon(2, "klmnopqrst")  # another target language in the same letters, unseen by the vocabulary


def corpus(path, n: int, seed: int, target: list[str]) -> None:
    """n pairs: 3-6 words of XX, and the same words of `target`, word for word."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        ids = [rng.randrange(len(XX)) for _ in range(rng.randint(3, 6))]
        src.append(" ".join(XX[i] for i in ids))
        tgt.append(" ".join(target[i] for i in ids))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".xx").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    path.with_suffix(".yy").write_text("".join(t + "\n" for t in tgt), encoding="utf-8")


def prepare(root, target: list[str], seed: int, *options: str) -> list[str]:
    corpus(root / "train", 300, seed, target)
    corpus(root / "valid", 30, seed + 1, target)
    assert cli_main(["prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train", str(root / "train"),
                     "--valid", str(root / "valid"), "--out", str(root / "data"), "--no-progress",
                     "--workers", "0", *options]) == 0
    return root / "data"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A model of 2 updates whose BPE vocabulary was learned on XX -> YY: its model directory
    and the dataset it was trained on."""
    root = tmp_path_factory.mktemp("xxyy")
    data = prepare(root, YY, 0, "--vocab-size", "360", "--model-type", "bpe")
    assert cli_main(["train", "--data", str(data), "--out", str(root / "run"), "--preset", "base",
                     "--set", *SMALL, "--max-steps", "2", *QUIET]) == 0
    return list_checkpoints(root / "run")[-1][1], data


def measured(tokenizer: Tokenizer, path) -> float:
    """Pieces per non-space character of a text file, by hand."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(len(tokenizer.encode(line)) for line in lines) / sum(
        len(line.replace(" ", "")) for line in lines)


# --- the defaults ---------------------------------------------------------------------------------

def test_the_defaults_halve_the_models_peak_rate_over_a_short_warmup():
    tiny = get_preset("translation-tiny-v2")  # warmup 1000, lr_scale 2
    got = finetune.recipe_defaults(tiny, tiny, set(), None)
    assert got == {"warmup_steps": 200, "lr_scale": 0.45}
    # the peak, by Eq. 3 itself: half the model's, to the rounding of lr_scale to two digits
    ratio = peak_learning_rate(replace(tiny, **got)) / peak_learning_rate(tiny)
    assert ratio == pytest.approx(0.5, rel=0.05)
    assert finetune.recipe_defaults(tiny, tiny, set(), 300)["warmup_steps"] == 30  # a tenth
    base = get_preset("base")
    got = finetune.recipe_defaults(base, base, set(), None)
    assert got["warmup_steps"] == 200
    assert peak_learning_rate(replace(base, **got)) / peak_learning_rate(base) == pytest.approx(0.5, rel=0.05)
    # a field the user gave is left out; lr_scale then follows the warmup the user gave
    assert finetune.recipe_defaults(tiny, tiny, {"lr_scale"}, None) == {"warmup_steps": 200}
    mine = replace(tiny, warmup_steps=50)
    got = finetune.recipe_defaults(tiny, mine, {"warmup_steps"}, None)
    assert list(got) == ["lr_scale"]
    assert peak_learning_rate(replace(mine, **got)) / peak_learning_rate(tiny) == pytest.approx(0.5, rel=0.05)
    # checkpoints: with --max-steps and no choice of the user's, n_average + 1 of them
    opts = TrainOptions(max_steps=120, fit_saves_to_budget=True)
    assert finetune.save_every(opts, 5, 1000) == 20
    assert finetune.save_every(replace(opts, save_every=7), 5, 1000) is None
    assert finetune.save_every(replace(opts, fit_saves_to_budget=False), 5, 1000) is None  # --save-minutes
    assert finetune.save_every(replace(opts, max_steps=None), 5, 1000) is None  # a time budget fits its own
    # an epoch limit counts its updates: 3 epochs of 8 updates, 6 checkpoints' worth
    assert finetune.save_every(replace(opts, max_steps=None, max_epochs=3), 5, 8) == 4


def test_fine_tuning_stops_after_ten_epochs_unless_told_otherwise():
    assert finetune.max_epochs(TrainOptions()) == finetune.MAX_EPOCHS == 10
    assert finetune.max_epochs(TrainOptions(time_budget=5)) == 10  # the budget may stop it sooner
    assert finetune.max_epochs(TrainOptions(max_epochs=40)) == 40
    assert finetune.max_epochs(TrainOptions(max_steps=500)) is None


def test_the_fields_a_user_gives_are_the_set_names_and_the_config_files_keys(tmp_path):
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    common = ["--data", "d", "--out", "r", "--init-from", "m"]
    assert train_command.train_options(parser.parse_args(common)).set_fields == ()
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"task": None, "warmup_steps": 100, "p_drop": 0.2}))
    args = parser.parse_args([*common, "--set", "lr_scale=0.3", "p_drop=0.1", "--config", str(config)])
    assert train_command.train_options(args).set_fields == ("lr_scale", "p_drop", "warmup_steps")


def trainer(cfg, data, run, **options):
    base = dict(threads=1, progress=False, tensorboard=False, eval_every=0, fit_saves_to_budget=True)
    return Trainer(cfg, Seq2SeqTask(data), run, TrainOptions(**{**base, **options}),
                   distributed.setup("cpu"))


def test_defaults_apply_with_init_from_and_not_without(model, tmp_path):
    ckpt, data = model
    own = read_config(ckpt)
    assert (own.warmup_steps, own.lr_scale) == (30, 1.0)
    t = trainer(None, data, tmp_path / "a", init_from=str(ckpt), max_steps=100)
    assert t.finetune == {"warmup_steps": 10, "lr_scale": 0.29}  # a tenth of 100; sqrt(10/30) / 2
    assert t.cfg == replace(own, max_steps=100, warmup_steps=10, lr_scale=0.29)
    assert lr_at(t.cfg, 10) / lr_at(own, 30) == pytest.approx(0.5, rel=0.05)
    assert t.save_every == 100 // 6
    # the same config without --init-from: a run from scratch keeps its recipe
    t = trainer(own, data, tmp_path / "b", max_steps=100)
    assert t.finetune == {} and t.cfg == replace(own, max_steps=100) and t.save_every is None
    # given fields win: here lr_scale, and the checkpoints of --save-minutes
    t = trainer(replace(own, lr_scale=2.0), data, tmp_path / "c", init_from=str(ckpt),
                max_steps=100, set_fields=("lr_scale",), save_minutes=5.0, fit_saves_to_budget=False)
    assert t.finetune == {"warmup_steps": 10} and t.cfg.lr_scale == 2.0 and t.save_every is None


def test_the_cli_says_applies_records_and_resumes_the_defaults(model, tmp_path, capsys):
    ckpt, data = model
    run = tmp_path / "run"
    args = ["train", "--data", str(data), "--out", str(run), "--init-from", str(ckpt), *QUIET]
    capsys.readouterr()
    assert cli_main([*args, "--max-steps", "12"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "fine-tuning defaults" in x]
    assert lines == ["fine-tuning defaults (--init-from): warmup_steps=1, lr_scale=0.091, a "
                     "checkpoint every 2 updates (Eq. 3 peaks at 0.016, the model's own peak was "
                     "0.032); override with --set warmup_steps=N lr_scale=X, --max-epochs, "
                     "--max-steps, --save-every or --save-minutes"]
    recorded = json.loads((run / "run.json").read_text())
    assert recorded["finetune"] == {"warmup_steps": 1, "lr_scale": 0.091}
    assert [s for s, _ in list_checkpoints(run)] == [4, 6, 8, 10, 12]  # 5 kept: average finds them
    # resumed, with the same command and a longer limit: the values the run started with stay (a
    # tenth of 20 would be 2), and nothing changes on resume
    assert cli_main([*args, "--max-steps", "20", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "config change on resume: max_steps" in err and "warmup_steps:" not in err
    assert "lr_scale:" not in err
    last = read_config(list_checkpoints(run)[-1][1])
    assert (last.warmup_steps, last.lr_scale, last.max_steps) == (1, 0.091, 20)
    # resumed without --init-from: the same; with --set: the user's value wins
    assert cli_main(["train", "--data", str(data), "--out", str(run), *QUIET, "--max-steps", "22",
                     "--resume"]) == 0
    assert read_config(list_checkpoints(run)[-1][1]).lr_scale == 0.091
    assert cli_main([*args, "--max-steps", "24", "--resume", "--set", "lr_scale=0.05"]) == 0
    assert "config change on resume: lr_scale: 0.091 -> 0.05" in capsys.readouterr().err
    assert read_config(list_checkpoints(run)[-1][1]).lr_scale == 0.05
    # a new run with --set: that field is the user's, the line names only the others
    assert cli_main([*args, "--max-steps", "12", "--overwrite", "--set", "lr_scale=0.7",
                     "--save-minutes", "100"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "fine-tuning defaults" in x]
    assert len(lines) == 1
    assert lines[0].startswith("fine-tuning defaults (--init-from): warmup_steps=1 (Eq. 3 peaks at")
    assert json.loads((run / "run.json").read_text())["config"]["lr_scale"] == 0.7
    # no step or epoch limit: 10 epochs at most (a time budget may stop it sooner), said in the
    # line, with checkpoints enough to average
    capped = tmp_path / "capped"
    assert cli_main(["train", "--data", str(data), "--out", str(capped), "--init-from", str(ckpt),
                     *QUIET, "--time-budget", "30"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "fine-tuning defaults" in x]
    assert len(lines) == 1 and "at most 10 epochs" in lines[0]
    summary = json.loads((capped / "summary.json").read_text())
    assert summary["stopped_by"] == "max_epochs" and summary["epochs"] == pytest.approx(10)
    assert len(list_checkpoints(capped)) >= 5
    # without --init-from: no line, nothing recorded
    assert cli_main(["train", "--data", str(data), "--out", str(tmp_path / "scratch"), "--preset",
                     "base", "--set", *SMALL, "--max-steps", "2", *QUIET]) == 0
    assert "fine-tuning defaults" not in capsys.readouterr().err
    assert json.loads((tmp_path / "scratch" / "run.json").read_text())["finetune"] == {}


# --- the vocabulary's fit -------------------------------------------------------------------------

def warnings(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("warning: --vocab-from")]


def test_a_fragmenting_vocabulary_is_one_line_and_a_fitting_one_none(model, tmp_path, capsys):
    ckpt, own_data = model
    meta = json.loads((ckpt / "meta.json").read_text())
    tok = Tokenizer.load(ckpt / "spm.model")
    # the model records what its data took, measured on its dev split
    for side in ("src", "tgt"):
        assert meta["pieces_per_char"][side] == pytest.approx(
            measured(tok, own_data / f"valid.{side}.txt"), rel=1e-9)
    capsys.readouterr()
    prepare(tmp_path / "fit", YY, 7, "--vocab-from", str(ckpt))  # more of the same languages
    assert warnings(capsys.readouterr().err) == []
    new = prepare(tmp_path / "zz", ZZ, 8, "--vocab-from", str(ckpt))  # a target language it never saw
    lines = warnings(capsys.readouterr().err)
    assert len(lines) == 1 and "splits the yy side into" in lines[0] and "train from scratch" in lines[0]
    ratio = measured(tok, new.parent / "train.yy") / measured(tok, own_data / "valid.tgt.txt")
    assert ratio > 1.5
    assert f"{ratio:.2f}x the pieces per character of the model's own tgt" in lines[0]

    # a model whose meta.json does not record it: the dataset it names gives the same figure
    older = tmp_path / "older"
    shutil.copytree(ckpt, older)
    del meta["pieces_per_char"]
    (older / "meta.json").write_text(json.dumps(meta))
    prepare(tmp_path / "zz2", ZZ, 8, "--vocab-from", str(older))
    assert warnings(capsys.readouterr().err) == [line.replace(str(ckpt), str(older)) for line in lines]
    # nor is the dataset at hand: the new data's two sides against each other
    meta["dataset"] = str(tmp_path / "gone")
    (older / "meta.json").write_text(json.dumps(meta))
    prepare(tmp_path / "zz3", ZZ, 8, "--vocab-from", str(older))
    lines = warnings(capsys.readouterr().err)
    assert len(lines) == 1 and "of the xx side (the model's own data is not at hand" in lines[0]
    sides = measured(tok, tmp_path / "zz3" / "train.yy") / measured(tok, tmp_path / "zz3" / "train.xx")
    assert re.search(rf"into {sides:.2f}x the pieces", lines[0])
    prepare(tmp_path / "fit2", YY, 9, "--vocab-from", str(older))
    assert warnings(capsys.readouterr().err) == []
