"""Using a trained model further: new data encoded with its vocabulary (`aiayn prepare
--vocab-from`), fine-tuning from its weights (`aiayn train --init-from`), refusals of a
vocabulary or architecture that does not fit, and `aiayn score` (per-sentence teacher-forced
log-probabilities, the same computation as `aiayn evaluate --model`'s perplexity)."""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import replace

import pytest
import torch

from aiayn.cli import main as cli_main
from aiayn.config import Config
from aiayn.data.model_dir import load_model
from aiayn.special import BOS_ID, EOS_ID
from aiayn.training import distributed
from aiayn.training.seq2seq import Seq2SeqTask
from aiayn.training.trainer import Trainer, TrainOptions

from helpers import LETTERS, SMALL, tiny_dataset

COMMON = ["--set", *SMALL, "max_tokens=600", "--threads", "1", "--no-progress", "--no-tensorboard",
          "--eval-bleu-sentences", "0", "--save-minutes", "1000"]


# The shifted domain's letters: a -> t, b -> s, ... (the base task's are a -> k, b -> l, ...).
SHIFTED = str.maketrans(LETTERS, "tsrqponmlk")


def shifted_pair(rng: random.Random) -> tuple[str, str]:
    """The shifted domain: the words reversed as in the base task, each letter written as
    another target letter; the same characters, so the base model's vocabulary fits."""
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
             for _ in range(rng.randint(2, 6))]
    return " ".join(words), " ".join(reversed(words)).translate(SHIFTED)


def write_split(root, name, pairs):
    (root / f"{name}.xx").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    (root / f"{name}.yy").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
    return root / name


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A model trained 400 updates on the base task, averaged into a model directory."""
    root = tmp_path_factory.mktemp("base")
    data = tiny_dataset(root / "corpus")
    assert cli_main(["train", "--data", str(data), "--out", str(root / "run"), "--preset", "base",
                     "--max-steps", "400", "--save-every", "100", "--eval-every", "0", *COMMON]) == 0
    assert cli_main(["average", "--run", str(root / "run"), "--last", "2", "--out", str(root / "model")]) == 0
    return root / "model", data


@pytest.fixture(scope="module")
def shifted(base, tmp_path_factory):
    """The shifted domain's corpus, prepared with the base model's vocabulary."""
    model, _ = base
    root = tmp_path_factory.mktemp("shifted")
    rng = random.Random(5)
    for name, n in (("train", 400), ("valid", 40)):
        write_split(root, name, [shifted_pair(rng) for _ in range(n)])
    assert cli_main(["prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train", str(root / "train"),
                     "--valid", str(root / "valid"), "--out", str(root / "data"),
                     "--vocab-from", str(model), "--no-progress"]) == 0
    return root


@pytest.mark.slow
def test_prepare_vocab_from_encodes_with_the_models_vocabulary(base, shifted, capsys):
    model, _ = base
    data = shifted / "data"
    assert (data / "spm.model").read_bytes() == (model / "spm.model").read_bytes()
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["options"]["vocab_from"] == str(model) and manifest["shared_vocab"]
    # the vocabulary options do not apply: refused, not ignored
    capsys.readouterr()
    assert cli_main(["prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train", str(shifted / "train"),
                     "--out", str(shifted / "other"), "--vocab-from", str(model), "--vocab-size", "30"]) == 2
    err = capsys.readouterr().err
    assert "--vocab-size" in err and "--vocab-from" in err and err.count("\n") == 1
    assert cli_main(["prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train", str(shifted / "train"),
                     "--out", str(shifted / "other"), "--vocab-from", str(shifted)]) == 2
    assert "no sentencepiece model" in capsys.readouterr().err


def test_init_from_starts_from_the_models_weights_with_a_fresh_schedule(base, shifted, tmp_path):
    model, _ = base
    options = TrainOptions(init_from=str(model), max_steps=5, threads=1, progress=False,
                           tensorboard=False, eval_every=0, save_minutes=None)
    env = distributed.setup("cpu")
    trainer = Trainer(None, Seq2SeqTask(shifted / "data"), tmp_path / "run", options, env)
    want = load_model(model).model.state_dict()
    got = trainer.model.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert trainer.step == 0 and not trainer.optimizer.state  # a fresh optimizer and schedule
    # no preset given: the model's own config (--max-steps applied), with the fine-tuning
    # defaults' schedule (tests/test_finetune_defaults.py)
    saved = Config.from_dict(json.loads((model / "config.json").read_text()))
    assert set(trainer.finetune) == {"warmup_steps", "lr_scale"}
    assert trainer.cfg == replace(saved, max_steps=5, **trainer.finetune) and saved.max_tokens == 600


@pytest.mark.slow
def test_fine_tuning_a_shifted_domain_lowers_its_loss_and_translates(base, shifted, tmp_path, capsys):
    model, _ = base
    data, run = shifted / "data", tmp_path / "run"
    ref = str(data / "valid.tgt.txt")
    args = ["--ref", ref, "--src", str(data / "valid.src.txt"), "--precision", "fp32", "--json"]
    assert cli_main(["evaluate", "--model", str(model), *args]) == 0
    before = json.loads(capsys.readouterr().out)["perplexity"]["ppl"]
    assert cli_main(["train", "--data", str(data), "--out", str(run), "--init-from", str(model),
                     "--max-steps", "150", "--save-every", "75", "--eval-every", "0",
                     "--threads", "1", "--no-progress", "--no-tensorboard", "--eval-bleu-sentences",
                     "0", "--save-minutes", "1000", "--set", "warmup_steps=40"]) == 0
    err = capsys.readouterr().err
    assert f"starting from the weights of {model}" in err
    assert cli_main(["average", "--run", str(run), "--last", "1", "--out", str(tmp_path / "ft")]) == 0
    capsys.readouterr()
    meta = json.loads((tmp_path / "ft" / "meta.json").read_text())
    assert meta["init_from"] == str(model)
    assert cli_main(["evaluate", "--model", str(tmp_path / "ft"), *args]) == 0
    after = json.loads(capsys.readouterr().out)["perplexity"]["ppl"]
    assert after < 0.93 * before, (before, after)  # the shifted domain learned further
    out = tmp_path / "hyp"
    assert cli_main(["translate", "--model", str(tmp_path / "ft"), "--input",
                     str(data / "valid.src.txt"), "--output", str(out), "--precision", "fp32"]) == 0
    hyps = out.read_text().splitlines()  # a model this small still ends many outputs at once
    assert len(hyps) == 40 and sum(bool(h) for h in hyps) >= 5


def test_a_vocabulary_or_architecture_that_does_not_fit_is_one_line(base, tmp_path, capsys):
    model, _ = base
    own = tiny_dataset(tmp_path / "own", seed=3, vocab_size=23)  # its own, smaller vocabulary
    args = ["--max-steps", "2", "--eval-every", "0", *COMMON]
    capsys.readouterr()
    assert cli_main(["train", "--data", str(own), "--out", str(tmp_path / "a"), "--init-from",
                     str(model), *args]) == 2
    err = capsys.readouterr().err
    assert "another vocabulary" in err and "--vocab-from" in err and err.count("\n") == 1
    # --resume with a dataset prepared with another vocabulary (of any size) is refused too
    _, data = base
    run = tmp_path / "run"
    assert cli_main(["train", "--data", str(data), "--out", str(run), "--preset", "base", *args]) == 0
    same_size = tiny_dataset(tmp_path / "same", seed=4)  # the same size, learned from other text
    assert (same_size / "spm.model").read_bytes() != (data / "spm.model").read_bytes()
    capsys.readouterr()
    assert cli_main(["train", "--data", str(same_size), "--out", str(run), "--resume",
                     "--max-steps", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "another vocabulary" in err and err.count("\n") == 1
    # another architecture: the field is named
    shifted_data = tiny_dataset(tmp_path / "arch", seed=6, vocab_from=str(model))
    assert cli_main(["train", "--data", str(shifted_data), "--out", str(tmp_path / "b"), "--init-from",
                     str(model), "--preset", "base", "--max-steps", "2", "--no-progress",
                     "--set", "d_model=64", "d_ff=64", "n_layers=1", "n_heads=4"]) == 2
    err = capsys.readouterr().err
    assert "d_model: 32 -> 64" in err and err.count("\n") == 1
    # a model directory whose tokenizer is not the one its weights were trained with
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    shutil.copyfile(own / "spm.model", broken / "spm.model")
    assert cli_main(["translate", "--model", str(broken), "--input", str(data / "valid.src.txt")]) == 2
    err = capsys.readouterr().err
    assert "not the vocabulary its weights were trained with" in err and err.count("\n") == 1


def _by_hand(model, src_ids, tgt_ids) -> float:
    """log p(reference | source), summed over its tokens and EOS, one sentence, one forward."""
    src = torch.tensor([src_ids + [EOS_ID]])
    tgt_in = torch.tensor([[BOS_ID] + tgt_ids])
    tgt_out = torch.tensor([tgt_ids + [EOS_ID]])
    with torch.no_grad():
        lp = torch.log_softmax(model(src, tgt_in).double(), dim=-1)
    return float(lp.gather(2, tgt_out[..., None]).sum())


def test_score_gives_each_pair_its_log_probability(base, tmp_path, capsys):
    model, data = base
    src, ref = data / "valid.src.txt", data / "valid.tgt.txt"
    capsys.readouterr()
    assert cli_main(["score", "--model", str(model), "--src", str(src), "--ref", str(ref),
                     "--precision", "fp32", "--batch-tokens", "60"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["line"] for r in rows] == list(range(40))
    loaded = load_model(model)
    tok = loaded.src_tokenizer
    sources, refs = src.read_text().splitlines(), ref.read_text().splitlines()
    for r in rows[:5]:  # against one sentence by hand
        s, t = tok.encode(sources[r["line"]]), tok.encode(refs[r["line"]])
        assert r["tokens"] == len(t) + 1
        assert r["logprob"] == pytest.approx(_by_hand(loaded.model, s, t), abs=1e-4)
        assert r["mean"] == pytest.approx(r["logprob"] / r["tokens"], abs=1e-6)
    # the same computation as evaluate --model's perplexity, summed
    assert cli_main(["evaluate", "--model", str(model), "--src", str(src), "--ref", str(ref),
                     "--precision", "fp32", "--json"]) == 0
    ppl = json.loads(capsys.readouterr().out)["perplexity"]
    total = sum(r["logprob"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    assert tokens == ppl["n_tokens"] and math.exp(-total / tokens) == pytest.approx(ppl["ppl"], rel=1e-6)
    # TSV, into a file
    out = tmp_path / "scores.tsv"
    assert cli_main(["score", "--model", str(model), "--src", str(src), "--ref", str(ref),
                     "--precision", "fp32", "--format", "tsv", "--output", str(out)]) == 0
    tsv = [line.split("\t") for line in out.read_text().splitlines()]
    assert [float(c[0]) for c in tsv] == pytest.approx([r["logprob"] for r in rows], abs=1e-5)
    assert [int(c[1]) for c in tsv] == [r["tokens"] for r in rows]


def test_score_rescores_an_nbest_list_and_agrees_with_the_search(base, tmp_path, capsys):
    """Each n-best hypothesis gets its teacher-forced log-probability, which equals the beam
    search's own sum of log-probabilities: its score times the GNMT length penalty (§6.1)."""
    model, data = base
    src = data / "valid.src.txt"
    first = tmp_path / "src"
    first.write_text("\n".join(src.read_text().splitlines()[:6]) + "\n")
    nbest = tmp_path / "nbest"
    assert cli_main(["translate", "--model", str(model), "--input", str(first), "--nbest", "3",
                     "--output", str(nbest), "--precision", "fp32"]) == 0
    capsys.readouterr()
    assert cli_main(["score", "--model", str(model), "--src", str(first), "--nbest", str(nbest),
                     "--precision", "fp32"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    entries = [line.split("\t") for line in nbest.read_text().splitlines()]
    assert len(rows) == len(entries) >= 6
    alpha = load_model(model).cfg.alpha
    for r, (index, score, text) in zip(rows, entries):
        assert r["line"] == int(index) and r["text"] == text and r["search_score"] == float(score)
        penalty = ((5 + r["tokens"]) / 6) ** alpha
        assert r["logprob"] == pytest.approx(float(score) * penalty, abs=2e-3)
    # mismatched files are one line each
    bad = tmp_path / "bad"
    bad.write_text("0\tnot a number line\n")
    assert cli_main(["score", "--model", str(model), "--src", str(first), "--nbest", str(bad)]) == 2
    assert "index<TAB>score<TAB>text" in capsys.readouterr().err
    short = tmp_path / "short"
    short.write_text("one line\n")
    assert cli_main(["score", "--model", str(model), "--src", str(short), "--ref", str(first)]) == 2
    err = capsys.readouterr().err
    assert "line-aligned" in err and err.count("\n") == 1
