"""Every file aiayn reads is checked: a malformed config.json, manifest.json, meta.json, .npy array
or trainer_state.pt ends with one line naming the file and the field, never a traceback, and a
file holding Python objects is refused without running anything."""

from __future__ import annotations

import json
import math
import pickle
import re
import shutil
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn import checks
from aiayn.cli import main as cli_main
from aiayn.config import BASE, Config
from aiayn.data.dataset import ParallelDataset, ids_file, idx_file, load_dataset_dir
from aiayn.data.model_dir import load_model, read_config
from aiayn.errors import UserError
from aiayn.presets import load_config
from aiayn.training import checkpoint as ckpt
from aiayn.training.trainer import TrainOptions, train

from helpers import SMALL, tiny_dataset, trainer_state


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("tiny"), n_train=60, n_valid=6)


@pytest.fixture
def dataset(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "data"))


@pytest.fixture
def model(model_dir, tmp_path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


def edit_json(path: Path, **changes) -> None:
    d = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = d
        for k in parents:
            node = node[k]
        node[last] = value
    path.write_text(json.dumps(d))


# --- config.json: every field by its annotation ---------------------------------------------

def test_every_config_field_is_checked_against_its_type(model):
    path = model / "config.json"
    original = path.read_text()
    for f in fields(Config):
        edit_json(path, **{f.name: [1]})  # a list is no field's type
        with pytest.raises(UserError) as e:
            read_config(model)
        assert str(e.value).startswith(f"{path}: invalid config: field {f.name!r} must be ")
        path.write_text(original)
    cases = {"n_heads": ("x", "an integer, got 'x'"), "n_layers": (True, "an integer, got True"),
             "max_steps": (1000.0, "an integer, got 1000.0"), "p_drop": (None, "a number, got None"),
             "positions": ("rope", "one of 'learned', 'sinusoidal', got 'rope'"),
             "tie_embeddings": (1, "true or false, got 1")}
    for name, (value, message) in cases.items():
        edit_json(path, **{name: value})
        with pytest.raises(UserError, match=f"field '{name}' must be {message}$"):
            read_config(model)
        path.write_text(original)


def test_config_values_json_cannot_type_exactly(model, tmp_path, capsys):
    path = model / "config.json"
    edit_json(path, p_drop=0, d_k=None)  # JSON writes 0.0 as 0; None where a field allows it
    cfg = read_config(model)
    assert cfg.p_drop == 0.0 and isinstance(cfg.p_drop, float) and cfg.d_k is None
    edit_json(path, lr_scale=math.nan)
    with pytest.raises(UserError, match="lr_scale must be finite, got nan"):
        read_config(model)
    path.write_text("[1, 2]")
    with pytest.raises(UserError, match="config.json: expected a JSON object of config fields"):
        read_config(model)
    # the same check through the command line, for the model a user translates with
    path.write_text(json.dumps({**BASE.to_dict(), "n_heads": "x"}))
    assert cli_main(["translate", "--model", str(model), "--input", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"aiayn translate: error: {path}: invalid config: field 'n_heads' must be an integer, got 'x'\n"
    # and a --config file names itself
    conf = tmp_path / "c.json"
    conf.write_text('{"warmup_steps": "many"}')
    with pytest.raises(UserError, match=f"{conf}: invalid config: field 'warmup_steps' must be an integer"):
        load_config("base", str(conf))


# --- manifest.json and the .npy arrays ------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"shared_vocab": "yes"}, "field 'shared_vocab' must be true or false, got 'yes'"),
    ({"splits__train__pairs": "60"}, "field 'splits.train.pairs' must be an integer, got '60'"),
    ({"splits__train__pairs": -1}, "field 'splits.train.pairs' must be >= 0, got -1"),
    ({"vocab__src": None}, "field 'vocab.src' must be an object, got None"),
    ({"vocab__src__file": "../../spm.model"}, "field 'vocab.src.file' must be a file name in the dataset"),
    ({"vocab__src__size": 26}, "field 'vocab.src.size' is 26, but"),
    ({"splits": []}, "field 'splits' must be an object, got []"),
    ({"version": "1"}, "field 'version' must be an integer, got '1'"),
])
def test_a_malformed_manifest_names_its_field(dataset, change, message):
    edit_json(dataset / "manifest.json", **change)
    with pytest.raises(UserError, match="^" + re.escape(f"{dataset}/manifest.json: {message}")):
        load_dataset_dir(dataset)


def test_a_shard_list_that_does_not_add_up_is_refused(dataset):
    path = dataset / "manifest.json"
    d = json.loads(path.read_text())
    d["splits"]["train"]["shards"][0]["pairs"] = 59
    path.write_text(json.dumps(d))
    with pytest.raises(UserError, match=re.escape(f"{path}: field 'splits.train.shards': the shards' "
                                                  "pairs add up to 59, the split says 60")):
        load_dataset_dir(dataset)
    d["splits"]["train"]["shards"][0]["files"] = ["x"]
    path.write_text(json.dumps(d))
    with pytest.raises(UserError, match=re.escape("field 'splits.train.shards[0].files' must be an object")):
        load_dataset_dir(dataset)
    d["splits"]["train"]["shards"] = []
    path.write_text(json.dumps(d))
    with pytest.raises(UserError, match=re.escape(f"{path}: field 'splits.train.shards' lists no shards")):
        load_dataset_dir(dataset)


def test_a_missing_manifest_field_is_named(dataset):
    d = json.loads((dataset / "manifest.json").read_text())
    del d["splits"]["train"]["src_tokens"]
    (dataset / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="field 'splits.train.src_tokens' is missing"):
        load_dataset_dir(dataset)


@pytest.mark.parametrize("array, message", [
    (np.array([1, "x", None], dtype=object), "not a valid .npy array"),
    (np.zeros((2, 3), np.uint16), r"expected a one-dimensional integer array, found uint16 of shape \(2, 3\)"),
    (np.zeros(5, np.float32), "expected a one-dimensional integer array, found float32"),
    ("truncated", "not a valid .npy array"),
    ("out of range", "token ids outside the vocabulary of 25 pieces"),
])
def test_a_malformed_id_array_names_its_file(dataset, array, message):
    path = dataset / ids_file("train", "src", 0)
    if isinstance(array, str) and array == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif isinstance(array, str):
        ids = np.load(path)
        ids[3] = 25
        np.save(path, ids)
    else:
        np.save(path, array, allow_pickle=True)
    with pytest.raises(UserError, match=message):
        ParallelDataset(dataset, "train")
    if not isinstance(array, str) or array == "truncated":
        with pytest.raises(UserError, match=str(path)):
            ParallelDataset(dataset, "train")


def test_offsets_that_do_not_fit_are_refused(dataset):
    path = dataset / idx_file("train", "tgt", 0)
    idx = np.load(path)
    idx[[2, 3]] = idx[[3, 2]]  # decreasing somewhere
    np.save(path, idx)
    with pytest.raises(UserError, match=r"split 'train' \(tgt\): sentence offsets do not fit"):
        ParallelDataset(dataset, "train")
    np.save(path, idx[:-1])
    with pytest.raises(UserError, match="59 sentences, the manifest says 60"):
        ParallelDataset(dataset, "train")


# --- meta.json ------------------------------------------------------------------------------

def test_meta_json_is_checked(model):
    path = model / "meta.json"
    path.write_text(json.dumps({"step": "x", "anything": "else"}))
    with pytest.raises(UserError, match=f"^{path}: field 'step' must be an integer, got 'x'$"):
        load_model(model)
    path.write_text(json.dumps({"averaged_from": ["a", 3]}))
    with pytest.raises(UserError, match=r"field 'averaged_from\[1\]' must be a string, got 3"):
        load_model(model)
    path.write_text("3")
    with pytest.raises(UserError, match="the content must be an object"):
        load_model(model)
    path.write_text(json.dumps({"step": 7, "src_lang": None, "notes": {"free": "form"}}))
    assert load_model(model).meta["step"] == 7


# --- trainer_state.pt -----------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(step="x"), "field 'step' must be an integer, got 'x'"),
    (dict(ranks={}), "field 'ranks' must be a list"),
    (dict(optimizer={"state": {}}), "field 'optimizer.param_groups' is missing"),
    (dict(progress={"dev": [], "best": None}), "field 'progress.tgt_tokens' is missing"),
    (dict(run={"seed": 1, "world_size": 2, "batch_tokens": 10, "accum": 1}),
     "field 'ranks' holds 1 entries for 2 process"),
])
def test_a_malformed_trainer_state_names_its_field(tmp_path, change, message):
    torch.save({**trainer_state(3), **change}, tmp_path / ckpt.TRAINER_STATE)
    with pytest.raises(UserError, match=message):
        ckpt.load_trainer_state(tmp_path)


def mark(path: str) -> None:
    Path(path).touch()


class Payload:
    """Unpickling it calls `mark(where)`: arbitrary code, as a hostile file would run."""

    def __init__(self, where: Path):
        self.where = str(where)

    def __reduce__(self):
        return (mark, (self.where,))


def test_a_trainer_state_holding_python_objects_is_refused_without_pytorchs_advice(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / ckpt.TRAINER_STATE, "wb") as f:
        pickle.dump({"format": ckpt.STATE_FORMAT, "x": Payload(marker)}, f)
    torch.save({**trainer_state(3), "x": Payload(marker)}, tmp_path / "zip.pt")
    (tmp_path / "z").mkdir()
    shutil.copy(tmp_path / "zip.pt", tmp_path / "z" / ckpt.TRAINER_STATE)
    for d in (tmp_path, tmp_path / "z"):
        with pytest.raises(UserError) as e:
            ckpt.load_trainer_state(d)
        msg = str(e.value)
        assert "refused: it holds Python objects" in msg and "weights_only" not in msg, msg
        assert "\n" not in msg
    assert not marker.exists()  # nothing ran
    mark(str(marker))  # (the payload would have worked)
    assert marker.exists()


def test_a_trainer_state_that_does_not_fit_the_model_is_one_line(tmp_path, pristine):
    run = tmp_path / "run"
    opts = TrainOptions(threads=1, tensorboard=False, progress=False, eval_every=0, save_minutes=None,
                        eval_bleu_sentences=0, max_steps=2)
    train(load_config("base", overrides=SMALL), pristine, run, opts)
    state = torch.load(run / "last" / ckpt.TRAINER_STATE, weights_only=True)
    state["optimizer"]["param_groups"][0]["params"] = [0]  # one parameter where the model has many
    torch.save(state, run / "last" / ckpt.TRAINER_STATE)
    with pytest.raises(UserError, match=r"trainer_state.pt: does not fit this run \("):
        train(None, pristine, run, TrainOptions(**{**opts.__dict__, "resume": True, "max_steps": 3}))
    assert checks.read_json(run / "summary.json")["steps"] == 2
