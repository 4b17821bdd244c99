"""Whole training runs on a tiny prepared dataset: the dev loss falls, logs and checkpoints are
where they should be, a SIGKILLed run resumes bit for bit, non-finite updates are skipped and then
stop the run, and a run directory is never silently reused."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model
from aiayn.presets import load_config
from aiayn.training import seq2seq as seq2seq_module
from aiayn.training import step as step_module
from aiayn.training.checkpoint import TRAINER_STATE, list_checkpoints
from aiayn.training.loss import LossSums, label_smoothed_loss
from aiayn.training.trainer import TrainingDiverged, TrainOptions, train

from helpers import SMALL, run_cli, tiny_dataset, train_until_killed


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_dataset(tmp_path_factory.mktemp("tiny"))


def small_cfg(*extra):
    return load_config("base", overrides=[*SMALL, *extra])


def quiet(**kw):
    base = dict(threads=1, tensorboard=False, progress=False, eval_bleu_sentences=0, save_minutes=None)
    base.update(kw)
    return TrainOptions(**base)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """120 updates, dev evaluation every 30, a checkpoint every 20, TensorBoard on."""
    run = tmp_path_factory.mktemp("run") / "r"
    opts = quiet(max_steps=120, eval_every=30, save_every=20, keep=4, eval_bleu_sentences=8,
                 tensorboard=True)
    summary = train(small_cfg(), data, run, opts)
    return run, summary


@pytest.mark.slow
def test_dev_loss_falls_and_everything_is_logged(trained):
    run, summary = trained
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in records if r["kind"] == "dev"]
    assert [r["step"] for r in dev] == [30, 60, 90, 120]
    assert dev[-1]["dev_loss"] < dev[0]["dev_loss"] - 0.1
    assert all(r["dev_ppl"] == pytest.approx(math.exp(r["dev_nll"])) for r in dev)
    assert all(r["dev_loss"] > r["dev_nll"] for r in dev)  # smoothing (eps 0.1) costs on dev
    assert all("dev_bleu" in r and r["bleu_sentences"] == 8 for r in dev)
    train_recs = [r for r in records if r["kind"] == "train"]
    assert train_recs[0]["step"] == 1 and train_recs[-1]["step"] == 120
    assert train_recs[-1]["loss"] < train_recs[0]["loss"]
    elapsed = [r["elapsed"] for r in train_recs]
    assert elapsed == sorted(elapsed) and elapsed[0] > 0  # seconds since training started
    assert all(0 <= r["data_share"] < 1 for r in train_recs)
    assert all(0.05 < r["rss_gb"] < 64 for r in train_recs)  # this test process: torch and all
    assert list((run / "tb").glob("events.out.tfevents.*"))
    assert summary["steps"] == 120 and summary["stopped_by"] == "max_steps"
    assert summary["train_flops"] == pytest.approx(summary["flops_per_target_token"] * summary["tgt_tokens"])
    assert summary["achieved_tflops"] > 0 and summary["mfu"] is None
    assert json.loads((run / "summary.json").read_text())["steps"] == 120
    assert json.loads((run / "run.json").read_text())["config"]["vocab_size"] == 25


def test_checkpoint_layout(trained):
    run, _ = trained
    steps = [s for s, _ in list_checkpoints(run)]
    assert steps == [60, 80, 100, 120]  # keep=4
    assert os.readlink(run / "last") == "checkpoints/step_000120"
    with_state = [s for s, d in list_checkpoints(run) if (d / TRAINER_STATE).exists()]
    assert with_state == [120]
    for d in (run / "last", run / "best"):
        loaded = load_model(d)
        assert loaded.cfg.vocab_size == 25 and loaded.meta["src_lang"] == "xx"
    best = json.loads((run / "best" / "meta.json").read_text())
    assert best["dev"]["dev_nll"] == min(
        json.loads(line)["dev_nll"] for line in (run / "metrics.jsonl").read_text().splitlines()
        if '"dev"' in line)
    assert not (run / "best" / TRAINER_STATE).exists()


@pytest.mark.slow
def test_average_cli_on_a_run(trained, tmp_path, capsys):
    run, _ = trained
    r = run_cli("average", "--run", str(run), "--last", "3", "--out", str(tmp_path / "avg"))
    assert r.returncode == 0, r.stderr
    assert "step_000080, step_000100, step_000120" in r.stdout
    avg = load_model(tmp_path / "avg")
    states = [load_file(str(d / "model.safetensors")) for _, d in list_checkpoints(run)[-3:]]
    for k, v in avg.model.state_dict().items():
        torch.testing.assert_close(v, (states[0][k] + states[1][k] + states[2][k]) / 3)
    assert not (tmp_path / "avg" / TRAINER_STATE).exists()
    # too many asked, and an existing output: one line, exit 2
    assert cli_main(["average", "--run", str(run), "--last", "9", "--out", str(tmp_path / "a9")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fewer than the 9" in err
    assert cli_main(["average", "--run", str(run), "--last", "2", "--out", str(tmp_path / "avg")]) == 2
    assert "already exists" in capsys.readouterr().err
    # the default is the config's n_average (5), more than the 4 kept
    assert cli_main(["average", "--run", str(run), "--out", str(tmp_path / "a5")]) == 2
    assert "fewer than the 5" in capsys.readouterr().err


def test_refuses_to_reuse_a_run_directory(trained, data, capsys):
    run, _ = trained
    args = ["train", "--data", str(data), "--out", str(run), "--preset", "base", "--set", *SMALL, "--max-steps", "1"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume" in err and "--overwrite" in err
    assert [s for s, _ in list_checkpoints(run)] == [60, 80, 100, 120]  # untouched


def test_a_fresh_run_never_replaces_logs_it_did_not_write(data, tmp_path, capsys):
    """metrics.jsonl and tb/ of a run killed before its first checkpoint (it wrote run.json) are
    replaced by a fresh run; files of those names that no run wrote are not, --overwrite or not."""
    run = tmp_path / "r"
    (run / "tb").mkdir(parents=True)
    (run / "tb" / "mine.txt").write_text("keep me")
    (run / "metrics.jsonl").write_text("my own notes\n")
    args = ["train", "--data", str(data), "--out", str(run), "--preset", "base", "--set", *SMALL,
            "--max-steps", "2", "--threads", "1", "--no-progress", "--eval-every", "0"]
    for extra in ([], ["--overwrite"]):
        assert cli_main(args + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no aiayn train run wrote" in err
    assert (run / "tb" / "mine.txt").read_text() == "keep me"
    assert (run / "metrics.jsonl").read_text() == "my own notes\n"
    (run / "run.json").write_text("{}")  # as an earlier run killed before its first checkpoint
    assert cli_main(args) == 0
    assert "my own notes" not in (run / "metrics.jsonl").read_text()


def test_overwrite_and_resume_of_a_finished_run(data, tmp_path):
    run = tmp_path / "r"
    train(small_cfg(), data, run, quiet(max_steps=4, eval_every=0))
    first = load_file(str(run / "last" / "model.safetensors"))
    # resuming a finished run changes nothing; a larger --max-steps continues it
    s = train(None, data, run, quiet(max_steps=4, resume=True, eval_every=0))
    assert s["steps"] == 4
    assert all((first[k] == v).all() for k, v in load_file(str(run / "last" / "model.safetensors")).items())
    s = train(None, data, run, quiet(max_steps=6, resume=True, eval_every=0))
    assert s["steps"] == 6 and [st for st, _ in list_checkpoints(run)] == [4, 6]
    # an architecture change on resume is refused; --overwrite starts over
    with pytest.raises(Exception, match="d_model"):
        train(small_cfg("d_model=64"), data, run, quiet(max_steps=8, resume=True))
    s = train(small_cfg(), data, run, quiet(max_steps=2, overwrite=True, eval_every=0))
    assert [st for st, _ in list_checkpoints(run)] == [2]


def test_resume_repoints_last_left_behind_by_a_kill(data, tmp_path):
    # a kill after the final checkpoint's directory but before `last` moved to it: the resumed
    # run has nothing left to train, and `last` must still end at the final weights
    run = tmp_path / "r"
    train(small_cfg(), data, run, quiet(max_steps=4, save_every=2, eval_every=0))
    final = load_file(str(run / "last" / "model.safetensors"))
    os.replace(run / "last", tmp_path / "old-last")
    os.symlink(os.path.join("checkpoints", list_checkpoints(run)[0][1].name), run / "last")
    s = train(None, data, run, quiet(max_steps=4, save_every=2, resume=True, eval_every=0))
    assert s["steps"] == 4
    assert (run / "last").resolve() == list_checkpoints(run)[-1][1].resolve()
    assert all(torch.equal(final[k], v) for k, v in load_file(str(run / "last" / "model.safetensors")).items())


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(data, tmp_path):
    """A real training process is killed with SIGKILL after its first checkpoint; resuming it
    ends with exactly the weights of an uninterrupted run (dropout on, evaluation on)."""
    common = ["--data", str(data), "--preset", "base", "--set", *SMALL, "--max-steps", "150",
              "--save-every", "10", "--eval-every", "25", "--eval-bleu-sentences", "3",
              "--threads", "1", "--no-tensorboard", "--no-progress", "--seed", "3",
              "--save-minutes", "1000"]
    killed = tmp_path / "killed"
    train_until_killed(killed, common)
    done = [s for s, _ in list_checkpoints(killed)]
    assert done and max(done) < 150, "the run finished before it could be killed"

    # the uninterrupted reference, in this process, same settings
    ref = tmp_path / "ref"
    torch_threads = torch.get_num_threads()
    try:
        assert cli_main(["train", "--out", str(ref), *common]) == 0
    finally:
        torch.set_num_threads(torch_threads)

    r = run_cli("train", "--out", str(killed), "--resume", *common)
    assert r.returncode == 0, r.stderr
    assert f"resuming {killed}/checkpoints/step_{max(done):06d} at step {max(done)}" in r.stderr
    a = load_file(str(ref / "last" / "model.safetensors"))
    b = load_file(str(killed / "last" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the metrics file holds each step once
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()
             if '"train"' in line]
    assert steps == sorted(set(steps))


def nan_on_calls(bad: set[int]):
    """label_smoothed_loss whose n-th call (1-based) returns a NaN loss when n is in `bad`."""
    calls = {"n": 0}

    def loss(logits, target, eps, pad_id=0):
        calls["n"] += 1
        out = label_smoothed_loss(logits, target, eps, pad_id)
        if calls["n"] in bad:
            return LossSums(out.smoothed * float("nan"), out.nll, out.n_tokens)
        return out

    return loss


def test_nonfinite_updates_are_skipped(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(seq2seq_module, "label_smoothed_loss", nan_on_calls({3, 4}))
    run = tmp_path / "r"
    s = train(small_cfg(), data, run, quiet(max_steps=6, eval_every=0, save_every=3))
    assert s["steps"] == 6 and s["skipped_updates"] == 2
    assert "warning: skipped update 3: non-finite loss" in capsys.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "skip"] == [3, 3]  # update 3, tried twice
    # the schedule did not advance on skipped updates: 6 applied updates, rates of steps 1..6
    state = torch.load(run / "last" / TRAINER_STATE, weights_only=True)
    assert state["step"] == 6
    assert int(next(iter(state["optimizer"]["state"].values()))["step"]) == 6


def test_a_persistently_nonfinite_loss_stops_the_run(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(seq2seq_module, "label_smoothed_loss", nan_on_calls(set(range(5, 100))))
    run = tmp_path / "r"
    args = ["train", "--data", str(data), "--out", str(run), "--preset", "base", "--set", *SMALL,
            "--max-steps", "50", "--save-every", "2", "--eval-every", "0", "--threads", "1",
            "--no-tensorboard", "--no-progress", "--max-nonfinite", "3"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("warning: skipped update 5") == 3
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith("aiayn train: error: the loss was not finite for 3 updates in a row")
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]  # nothing written after the trouble


def test_nonfinite_weights_are_never_saved(data, tmp_path, monkeypatch):
    from aiayn.training.trainer import Trainer

    orig = Trainer._save

    def poisoned(self):
        if self.step == 4:
            with torch.no_grad():
                next(self.model.parameters())[0, 0] = float("inf")
        return orig(self)

    monkeypatch.setattr(Trainer, "_save", poisoned)
    run = tmp_path / "r"
    with pytest.raises(TrainingDiverged, match="not finite at step 4"):
        train(small_cfg(), data, run, quiet(max_steps=10, eval_every=0, save_every=2))
    assert [s for s, _ in list_checkpoints(run)] == [2]


@pytest.fixture
def fake_clock(monkeypatch):
    """The trainer's clock advances 10 ms each time it is read: time budgets then stop runs after
    the same updates however loaded the machine is."""
    from aiayn.training import trainer as trainer_module

    ticks = itertools.count()
    monkeypatch.setattr(trainer_module, "_clock", lambda: next(ticks) * 0.01)


def test_epoch_limit_and_time_budget(data, tmp_path, fake_clock):
    from aiayn.data.batching import TokenBatchSampler
    from aiayn.data.dataset import ParallelDataset

    ds = ParallelDataset(data, "train")
    per_epoch = len(TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, 100))
    s = train(small_cfg(), data, tmp_path / "e", quiet(max_epochs=1, accum=3, batch_tokens=100))
    # the last update of the epoch takes the remaining micro-batches; no step limit applies
    assert s["stopped_by"] == "max_epochs" and s["steps"] == math.ceil(per_epoch / 3)
    assert s["epochs"] == pytest.approx(1.0)
    assert s["tgt_tokens"] == int(ds.tgt_lengths.sum()) + len(ds)  # every pair once, EOS included
    s = train(small_cfg(), data, tmp_path / "t", quiet(time_budget=0.002))  # 12 ticks
    assert s["stopped_by"] == "time_budget" and 0 < s["steps"] < small_cfg().max_steps
    assert s["checkpoint"] and Path(s["checkpoint"]).is_dir()


def train_records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"train"' in line]


def test_time_budget_counts_the_whole_run(data, tmp_path, fake_clock):
    """A resumed run trains for what is left of its minutes, as --max-steps counts all updates."""
    run = tmp_path / "r"
    s = train(small_cfg(), data, run, quiet(time_budget=0.005, eval_every=0))  # 30 ticks
    assert s["stopped_by"] == "time_budget" and s["steps"] > 0
    again = train(None, data, run, quiet(time_budget=0.005, resume=True, eval_every=0))
    assert again["stopped_by"] == "time_budget" and again["steps"] == s["steps"]
    more = train(None, data, run, quiet(time_budget=0.02, resume=True, eval_every=0))
    assert more["steps"] > s["steps"]


@pytest.mark.slow
def test_a_short_budget_checkpoints_often_enough_to_average(data, tmp_path, fake_clock, capsys):
    """With --save-minutes not given, a budget shorter than n_average + 1 of the paper's 10-minute
    intervals checkpoints every budget / (n_average + 1) minutes, and says so."""
    s = train(small_cfg(), data, tmp_path / "r", quiet(time_budget=0.06, eval_every=0,
                                                       save_minutes=10.0, fit_saves_to_budget=True))
    n_average = small_cfg().n_average
    assert s["stopped_by"] == "time_budget"
    assert len(list_checkpoints(tmp_path / "r")) >= n_average
    assert f"checkpoints every {0.06 / (n_average + 1):.2g} minutes" in capsys.readouterr().err
    kept = train(small_cfg(), data, tmp_path / "k", quiet(time_budget=0.06, eval_every=0,
                                                          save_minutes=10.0))
    assert kept["stopped_by"] == "time_budget" and len(list_checkpoints(tmp_path / "k")) == 1


def test_a_limit_before_the_end_of_warmup_is_said_in_one_line(data, tmp_path, capsys):
    train(small_cfg(), data, tmp_path / "a", quiet(max_steps=25, eval_every=0))  # warmup 30
    err = capsys.readouterr().err
    assert "warning: --max-steps 25 holds about 25 updates, fewer than warmup_steps=30" in err
    assert "--set warmup_steps=N" in err
    train(small_cfg(), data, tmp_path / "b", quiet(max_steps=40, eval_every=0))
    assert "warmup_steps" not in capsys.readouterr().err


@pytest.mark.slow
def test_the_warmup_warning_times_the_updates_after_the_first(data, tmp_path, monkeypatch, capsys):
    """The first updates of a session are slow (kernel selection, compiling): the budget's pace
    is taken from the later ones. Here the first 10 take 5 s each and the rest 0.1 s, so a
    1-minute budget holds about 110 updates, not the 20-odd the first ones' pace predicts."""
    from aiayn.training import trainer as trainer_module

    now = [0.0]
    monkeypatch.setattr(trainer_module, "_clock", lambda: now[0])
    real = step_module.Updater.update

    def slow_start(self, micro, step, *args):
        now[0] += 5.0 if step <= 10 else 0.1
        return real(self, micro, step, *args)

    monkeypatch.setattr(step_module.Updater, "update", slow_start)
    s = train(small_cfg("warmup_steps=100"), data, tmp_path / "a", quiet(time_budget=1.0, eval_every=0))
    assert s["stopped_by"] == "time_budget" and 105 <= s["steps"] <= 111
    assert "warmup_steps" not in capsys.readouterr().err
    train(small_cfg("warmup_steps=200"), data, tmp_path / "b", quiet(time_budget=1.0, eval_every=0))
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "fewer than warmup_steps=200" in x)
    assert "1-minute budget (at 0.1 s an update) holds about 1" in line, line
    updates = int(line.split("holds about ")[1].split()[0])
    assert 100 <= updates <= 112, line


def test_cooldown_over_steps_follows_the_schedule_and_resumes_exactly(data, tmp_path, monkeypatch):
    from aiayn.training.schedule import cooldown_factor, lr_at

    cfg = small_cfg("lr_cooldown=0.5")
    opts = dict(eval_every=0, save_every=5, log_every=1)
    whole = train(cfg, data, tmp_path / "whole", quiet(max_steps=20, **opts))
    assert whole["steps"] == 20
    lrs = {r["step"]: r["lr"] for r in train_records(tmp_path / "whole")}
    assert sorted(lrs) == list(range(1, 21))
    for step, lr in lrs.items():  # progress before update `step` is (step - 1) / 20
        assert lr == pytest.approx(lr_at(cfg, step) * cooldown_factor((step - 1) / 20, 0.5)), step
    assert lrs[10] == pytest.approx(lr_at(cfg, 10)) and lrs[20] == pytest.approx(lr_at(cfg, 20) / 10)
    # a 20-step run that dies after update 10 (checkpoint at 10), then resumes: bit for bit
    real = step_module.Updater.update

    def dies_at_11(self, micro, step, lr_factor=1.0):
        if step == 11:
            raise KeyboardInterrupt
        return real(self, micro, step, lr_factor)

    monkeypatch.setattr(step_module.Updater, "update", dies_at_11)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, data, tmp_path / "split", quiet(max_steps=20, **opts))
    monkeypatch.setattr(step_module.Updater, "update", real)
    assert [st for st, _ in list_checkpoints(tmp_path / "split")] == [5, 10]
    train(None, data, tmp_path / "split", quiet(max_steps=20, resume=True, **opts))
    a = load_file(str(tmp_path / "whole" / "last" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "last" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cooldown_over_minutes_lowers_the_rate_towards_the_end(data, tmp_path, fake_clock):
    from aiayn.training.schedule import lr_at

    cfg = small_cfg("lr_cooldown=0.9")
    run = tmp_path / "t"
    s = train(cfg, data, run, quiet(time_budget=0.01, eval_every=0, log_every=1))  # 60 ticks
    assert s["stopped_by"] == "time_budget" and s["steps"] > 5
    recs = train_records(run)
    ratios = [r["lr"] / lr_at(cfg, r["step"]) for r in recs]
    assert all(0 <= x <= 1 + 1e-9 for x in ratios)
    assert ratios[0] > 0.9 and ratios[-1] < 0.5  # the clock, not the steps, drives it down
    assert all(a >= b - 1e-9 for a, b in zip(ratios, ratios[1:]))
