"""Checkpoint files alone: averaging, atomic writes, pruning, the `last` pointer, RNG states."""

from __future__ import annotations

import os
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from aiayn import files
from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model, save_model
from aiayn.errors import UserError
from aiayn.model.transformer import Transformer
from aiayn.training import checkpoint as ckpt
from aiayn.training.average import average_checkpoints, average_state_dicts

from helpers import MICRO, dead_pid, tiny_dataset, trainer_state


def test_average_of_two_known_state_dicts():
    a = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "h": torch.tensor([1.0, 3.0], dtype=torch.bfloat16),
         "n": torch.tensor([2, 5])}
    b = {"w": torch.tensor([[3.0, 2.0], [-3.0, 0.0]]), "h": torch.tensor([2.0, 4.0], dtype=torch.bfloat16),
         "n": torch.tensor([4, 8])}
    avg = average_state_dicts([a, b])
    assert torch.equal(avg["w"], torch.tensor([[2.0, 2.0], [0.0, 2.0]]))
    assert avg["h"].dtype == torch.bfloat16 and torch.equal(avg["h"].float(), torch.tensor([1.5, 3.5]))
    assert avg["n"].dtype == torch.int64 and avg["n"].tolist() == [3, 6]  # 6.5 rounds to even
    # accumulated in float64: many float32 copies of the same value average back to it exactly
    x = {"w": torch.full((3,), 0.1)}
    assert torch.equal(average_state_dicts([x] * 7)["w"], x["w"])
    assert torch.equal(average_state_dicts([a])["w"], a["w"])


def test_average_refuses_mismatches():
    a = {"w": torch.zeros(2, 2)}
    with pytest.raises(UserError, match="different parameters"):
        average_state_dicts([a, {"v": torch.zeros(2, 2)}])
    with pytest.raises(UserError, match=r"w is torch.float32 \(3, 2\)"):
        average_state_dicts([a, {"w": torch.zeros(3, 2)}])
    with pytest.raises(UserError, match="nothing to average"):
        average_state_dicts([])


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """The tokenizer file of the tiny dataset (a model directory needs one)."""
    data = tiny_dataset(tmp_path_factory.mktemp("tiny"), n_train=50, n_valid=5)
    return {"spm.model": data / "spm.model"}


def model_dir(path, cfg, seed, spm):
    torch.manual_seed(seed)
    return save_model(path, Transformer(cfg), cfg, spm, {"src_lang": "xx", "tgt_lang": "yy"})


def test_average_checkpoints_and_architecture_mismatch(tmp_path, spm, capsys):
    cfg = replace(MICRO, vocab_size=25, d_model=16, d_ff=32, n_layers=1)
    a = model_dir(tmp_path / "a", cfg, 1, spm)
    b = model_dir(tmp_path / "b", replace(cfg, p_drop=0.3), 2, spm)  # recipe fields may differ
    out = average_checkpoints([a, b], tmp_path / "avg")
    m = load_model(out)
    wa, wb = load_model(a).model.state_dict(), load_model(b).model.state_dict()
    for k, v in m.model.state_dict().items():
        torch.testing.assert_close(v, (wa[k] + wb[k]) / 2)
    assert m.cfg.p_drop == 0.3 and m.meta["averaged_from"] == [str(a), str(b)]

    c = model_dir(tmp_path / "c", replace(cfg, d_ff=64), 3, spm)
    with pytest.raises(UserError, match="different architecture.*d_ff: 32 -> 64"):
        average_checkpoints([a, c], tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    code = cli_main(["average", "--inputs", str(a), str(c), "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("aiayn average: error:")
    # an output that is an input, or not a model directory, is never replaced
    with pytest.raises(UserError, match="one of the inputs"):
        average_checkpoints([a, b], a, overwrite=True)
    (tmp_path / "notes").mkdir()
    with pytest.raises(UserError, match="not a model directory"):
        average_checkpoints([a, b], tmp_path / "notes", overwrite=True)


def writer(cfg, tokenizers, meta=None):
    """A model directory's files, as the sequence-to-sequence task writes them."""
    from aiayn.data.model_dir import fill_model_dir

    return lambda directory, weights: fill_model_dir(directory, weights, cfg, tokenizers, meta or {})


def test_checkpoints_prune_point_and_survive_an_interrupted_write(tmp_path, spm, monkeypatch):
    cfg = replace(MICRO, vocab_size=25, d_model=16, d_ff=32, n_layers=1)
    w = Transformer(cfg).state_dict()
    for step in (1, 2, 3, 4):
        ckpt.save_checkpoint(tmp_path, step, w, writer(cfg, spm, {"step": step}),
                             trainer_state(step), keep=3)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3, 4]
    assert os.readlink(tmp_path / "last") == "checkpoints/step_000004"
    assert ckpt.latest_resumable(tmp_path) == ckpt.step_dir(tmp_path, 4)
    assert not (ckpt.step_dir(tmp_path, 3) / ckpt.TRAINER_STATE).exists()
    assert ckpt.load_trainer_state(tmp_path / "last")["step"] == 4

    # a write that dies half-way leaves no listed checkpoint and the last one intact
    def boom(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(torch, "save", boom)
        with pytest.raises(KeyboardInterrupt):
            ckpt.save_checkpoint(tmp_path, 5, w, writer(cfg, spm), trainer_state(5), keep=3)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3, 4]
    assert ckpt.latest_resumable(tmp_path) == ckpt.step_dir(tmp_path, 4)
    # leftover temporary directories (as after SIGKILL; of this version and an earlier one) are
    # never taken for checkpoints, and are removed
    (tmp_path / "checkpoints" / ".step_000006.abc.tmp").mkdir()
    os.mkdir(files.temp_path(tmp_path / "checkpoints" / "step_000006", pid=dead_pid()))
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3, 4]
    ckpt.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000002", "step_000003", "step_000004"]

    bad = {k: v.clone() for k, v in w.items()}
    next(iter(bad.values())).view(-1)[0] = float("nan")
    with pytest.raises(UserError, match="not finite"):
        ckpt.save_checkpoint(tmp_path, 7, bad, writer(cfg, spm), trainer_state(7), keep=3)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3, 4]

    (tmp_path / "last" / ckpt.TRAINER_STATE).write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot read trainer state"):
        ckpt.load_trainer_state(tmp_path / "last")


def test_rng_states_round_trip(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = ckpt.capture_rng()
    torch.save(ckpt.new_trainer_state(ranks=[{"rng": state}]), tmp_path / "s.pt")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)  # plain types only
    ckpt.restore_rng(ckpt.rng_from_state(loaded["ranks"][0]))
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
