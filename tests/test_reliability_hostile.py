"""What a hostile or careless file cannot make aiayn do: a model directory's config.json that does
not describe its weights (a width, depth or vocabulary of 10**6 and more) is refused in one line
before any model is built, whichever command reads it; and `--overwrite` replaces only what aiayn
wrote, never a directory or run that holds a user's own file."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiayn.config import MAX_SEQUENCE
from aiayn.data.model_dir import read_config, save_model
from aiayn.errors import UserError
from aiayn.model.build import build_model
from aiayn.model.rnn import RNNSearch
from aiayn.model.transformer import Transformer
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.chart.data import Vocabulary
from aiayn.parsing.chart.files import write_model_dir
from aiayn.parsing.chart.model import SPECIALS, SpanParser
from aiayn.parsing.chart.trees import NONE
from aiayn.training.checkpoint import list_checkpoints

from helpers import SMALL, tiny_dataset


@pytest.fixture
def no_model_built(monkeypatch):
    """Fail the test where a model is built for real: only on the meta device, which allocates
    nothing, may one be made before the config is found to describe the weights."""
    for cls in (Transformer, RNNSearch, SpanParser):
        def guarded(self, *args, __init=cls.__init__, **kw):
            if torch.get_default_device().type != "meta":
                pytest.fail(f"a {type(self).__name__} was built from a config not yet checked")
            __init(self, *args, **kw)
        monkeypatch.setattr(cls, "__init__", guarded)


@pytest.fixture
def model(model_dir, tmp_path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


def edit_config(model: Path, **changes) -> Path:
    path = model / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return path


def one_line_error(err: str, command: str, path: Path) -> str:
    """`err`, after checking it is one line naming `path`, without a traceback."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"aiayn {command}: error: {path}: "), err
    return err


# --- config.json against the weights --------------------------------------------------------

# model_dir (conftest.py): 1 layer, d_model 32, d_ff 64, 4 heads, a vocabulary of 48 pieces
HOSTILE = [
    (dict(d_model=10**6), "d_model=1000000 but model.safetensors holds 32-wide embeddings"),
    (dict(n_layers=10**6), "n_layers=1000000 but model.safetensors holds 1 encoder layer"),
    (dict(vocab_size=10**9), "vocab_size=1000000000 but model.safetensors holds embeddings of 48 "
                             "tokens"),
    (dict(max_positions=10**12), f"invalid config: max_positions=1000000000000 is beyond any "
                                 f"realistic model (at most {MAX_SEQUENCE})"),
    (dict(max_len_b=10**9), "invalid config: max_len_b=1000000000 is beyond any realistic model"),
    (dict(max_len_a=1e9), "invalid config: max_len_a=1000000000.0 is beyond any realistic model"),
    (dict(beam_size=10**6), "invalid config: beam_size=1000000 is beyond any realistic model"),
    # mismatches of ordinary sizes
    (dict(d_model=64), "d_model=64 but model.safetensors holds 32-wide embeddings"),
    (dict(n_layers=2), "n_layers=2 but model.safetensors holds 1 encoder layer"),
    (dict(vocab_size=50), "vocab_size=50 but model.safetensors holds embeddings of 48 tokens"),
    (dict(d_ff=128), "d_ff=128 but model.safetensors holds 64 feed-forward units"),
    (dict(d_k=4), "n_heads x d_k = 4 x 4 but model.safetensors holds 32 query units"),
    (dict(d_v=16), "n_heads x (d_k + d_v) = 4 x 24 but model.safetensors holds 64 key and value "
                   "units"),
    (dict(tie_embeddings=False), "the config does not describe model.safetensors (it lacks "
                                 "['tgt_embed.weight'], holds besides [])"),
    (dict(attn_bias=True), "the config does not describe model.safetensors (it lacks "
                           "['decoder.0.cross_attn.kv_proj.bias'"),
]


@pytest.mark.parametrize("changes, message", HOSTILE, ids=lambda v: str(v)[:30])
def test_translate_refuses_a_config_that_does_not_describe_its_weights(
        model, tmp_path, aiayn, no_model_built, changes, message):
    path = edit_config(model, **changes)
    src = tmp_path / "in.txt"
    src.write_text("the cat\n")
    code, out, err = aiayn("translate", "--model", model, "--input", src)
    assert code == 2 and out == ""
    assert one_line_error(err, "translate", path).startswith(
        f"aiayn translate: error: {path}: {message}")


COMMANDS = [
    ["translate", "--input", "{src}"], ["score", "--src", "{src}", "--ref", "{src}"],
    ["evaluate", "--ref", "{src}", "--src", "{src}", "--hyp", "{src}", "--lang", "de"],
    ["attention", "--src", "the cat", "--out", "{tmp}/att"], ["parse", "--input", "{src}"],
    ["serve", "--port", "0"], ["average", "--out", "{tmp}/avg", "--inputs", "{model}"],
    ["export", "--format", "ctranslate2", "--out", "{tmp}/ct2"],
    ["export", "--format", "onnx", "--out", "{tmp}/onnx"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:3]))
def test_every_command_reads_a_model_through_the_checked_config(model, tmp_path, aiayn,
                                                                no_model_built, command):
    path = edit_config(model, n_layers=10**6)
    src = tmp_path / "in.txt"
    src.write_text("the cat\n")
    args = [a.format(src=src, tmp=tmp_path, model=model) for a in command]
    if "--inputs" not in args:
        args += ["--model", str(model)]
    code, _, err = aiayn(*args)
    assert code == 2
    assert one_line_error(err, command[0], path).endswith(
        ": n_layers=1000000 but model.safetensors holds 1 encoder layer\n")
    assert not (tmp_path / "avg").exists() and not (tmp_path / "ct2").exists()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, model_dir) -> tuple[Path, Path]:
    """(a tiny dataset, a run of 2 updates on it): for train --init-from and train --overwrite."""
    from aiayn.cli import main

    root = tmp_path_factory.mktemp("run")
    data = tiny_dataset(root, n_train=40, n_valid=4)
    run = root / "r"
    assert main(["train", "--data", str(data), "--out", str(run), "--preset", "base", "--set",
                 *SMALL, "--max-steps", "2", "--save-every", "1", "--threads", "1",
                 "--no-progress", "--eval-every", "0"]) == 0
    return data, run


def test_train_init_from_refuses_a_hostile_config(trained_run, tmp_path, aiayn, no_model_built):
    data, run = trained_run
    model = Path(shutil.copytree(run / "last", tmp_path / "m"))
    for changes, message in [(dict(d_model=10**6), "d_model=1000000 but model.safetensors holds "
                                                   "32-wide embeddings"),
                             (dict(n_layers=10**6), "n_layers=1000000 but model.safetensors "
                                                    "holds 1 encoder layer")]:
        shutil.copyfile(run / "last" / "config.json", model / "config.json")
        path = edit_config(model, **changes)
        for preset in ([], ["--preset", "base", "--set", *SMALL]):  # the model's config, or one given
            code, _, err = aiayn("train", "--data", data, "--out", tmp_path / "r", "--init-from",
                                 model, *preset, "--max-steps", "1", "--threads", "1")
            assert code == 2
            assert one_line_error(err, "train", path).endswith(f": {message}\n")
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.fixture(scope="module")
def variants(tmp_path_factory, model_dir) -> dict[str, Path]:
    """Model directories of learned positions, of the RNN baseline and of a chart parser, built
    before the guard of `no_model_built` is in place."""
    root = tmp_path_factory.mktemp("variants")
    tok = {"spm.model": model_dir / "spm.model"}
    cfg = read_config(model_dir)
    torch.manual_seed(0)
    made = {}
    for name, c in (("learned", replace(cfg, positions="learned", max_positions=64)),
                    ("rnn", replace(cfg, arch="rnn", rnn_emb=8, rnn_hidden=8, rnn_attn=8))):
        made[name] = save_model(root / name, build_model(c), c, tok)
    chart = ChartConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2, d_span=16, d_char=0)
    vocab = Vocabulary(list(SPECIALS) + list("abcd"), [NONE, "S", "NP"], [])
    made["chart"] = root / "chart"
    made["chart"].mkdir()
    write_model_dir(made["chart"], SpanParser(chart, len(vocab.words), 3).state_dict(), chart, vocab, {})
    return made


def test_learned_positions_and_the_rnn_are_checked_too(variants, tmp_path, no_model_built):
    learned = Path(shutil.copytree(variants["learned"], tmp_path / "learned"))
    rnn = Path(shutil.copytree(variants["rnn"], tmp_path / "rnn"))
    assert read_config(learned).max_positions == 64 and read_config(rnn).rnn_hidden == 8
    edit_config(learned, max_positions=128)
    with pytest.raises(UserError, match="max_positions=128 but model.safetensors holds 64 learned "
                                        "positions$"):
        read_config(learned)
    for changes, message in [(dict(rnn_hidden=10**6), "rnn_hidden=1000000 but model.safetensors "
                                                      "holds 8 GRU units$"),
                             (dict(rnn_attn=16), "rnn_attn=16 but model.safetensors holds 8 "
                                                 "alignment units$"),
                             (dict(rnn_emb=10**6), "rnn_emb=1000000 but model.safetensors holds "
                                                   "8-wide embeddings$")]:
        shutil.copyfile(variants["rnn"] / "config.json", rnn / "config.json")
        edit_config(rnn, **changes)
        with pytest.raises(UserError, match=message):
            read_config(rnn)


def test_a_chart_parser_is_checked_before_it_is_built(variants, tmp_path, aiayn, no_model_built):
    chart = Path(shutil.copytree(variants["chart"], tmp_path / "chart"))
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    for changes, message in [(dict(n_layers=10**6), "n_layers=1000000 but model.safetensors holds "
                                                    "1 encoder layer"),
                             (dict(d_model=10**6), "the config does not describe model.safetensors: "
                                                   "weight ")]:
        shutil.copyfile(variants["chart"] / "config.json", chart / "config.json")
        path = edit_config(chart, **changes)
        code, _, err = aiayn("parse", "--model", chart, "--input", src)
        assert code == 2
        assert message in one_line_error(err, "parse", path)


def test_export_refuses_an_absurd_position_table(model, tmp_path, aiayn, no_model_built):
    pytest.importorskip("ctranslate2")  # the `export` extra (scripts/test.sh)
    for n in (1, MAX_SEQUENCE + 1):
        code, _, err = aiayn("export", "--format", "ctranslate2", "--model", model, "--out",
                             tmp_path / "ct2", "--max-positions", n)
        assert code == 2 and err.count("\n") == 1
        assert f"--max-positions must be between 2 and {MAX_SEQUENCE}, got {n}" in err


# --- --overwrite replaces only what aiayn wrote ------------------------------------------------

def users_directory(tmp_path: Path, marker: str) -> Path:
    """The probe's directory: an empty file named as an export's marker, and a thesis."""
    u = tmp_path / "u"
    u.mkdir()
    (u / marker).touch()
    (u / "thesis.tex").write_text("p\n")
    return u


def assert_refused_and_kept(code: int, err: str, u: Path, names: set[str]) -> None:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{u} holds thesis.tex" in err and "choose another --out, or remove thesis.tex" in err
    assert {p.name for p in u.iterdir()} == names and (u / "thesis.tex").read_text() == "p\n"


@pytest.mark.parametrize("fmt, marker, package", [
    ("ctranslate2", "model.bin", "ctranslate2"), ("onnx", "decoder.onnx", "onnx"),
    ("huggingface", "tokenizer_config.json", "transformers")])
def test_export_overwrite_never_deletes_a_users_file(model_dir, tmp_path, aiayn, fmt, marker, package):
    pytest.importorskip(package)  # an extra scripts/test.sh installs
    u = users_directory(tmp_path, marker)
    code, _, err = aiayn("export", "--format", fmt, "--model", model_dir, "--out", u, "--overwrite")
    assert_refused_and_kept(code, err, u, {marker, "thesis.tex"})


def test_export_overwrite_replaces_its_own_export_only(model_dir, tmp_path, aiayn):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    args = ["export", "--format", "ctranslate2", "--model", model_dir, "--out", out]
    assert aiayn(*args)[0] == 0
    written = {p.name for p in out.iterdir()}
    assert aiayn(*args, "--overwrite")[0] == 0  # its own earlier export: replaced
    assert {p.name for p in out.iterdir()} == written
    (out / "thesis.tex").write_text("p\n")  # the user adds a file: now refused, nothing deleted
    assert_refused_and_kept(*aiayn(*args, "--overwrite")[::2], out, written | {"thesis.tex"})
    (out / "thesis.tex").unlink()
    (out / "drafts").mkdir()  # a directory is no export's file either
    code, _, err = aiayn(*args, "--overwrite")
    assert code == 2 and f"{out} holds drafts" in err and (out / "drafts").is_dir()


def test_average_overwrite_never_deletes_a_users_file(model_dir, tmp_path, aiayn):
    out = tmp_path / "avg"
    args = ["average", "--inputs", model_dir, "--out", out, "--overwrite"]
    assert aiayn(*args)[0] == 0 and aiayn(*args)[0] == 0  # over its own output: replaced
    (out / "thesis.tex").write_text("p\n")
    names = {p.name for p in out.iterdir()}
    assert_refused_and_kept(*aiayn(*args)[::2], out, names)


@pytest.mark.parametrize("where", ["checkpoints", "checkpoints/step", "best", "tb"])
def test_train_overwrite_never_deletes_a_users_file(trained_run, tmp_path, aiayn, where):
    data, pristine = trained_run
    run = Path(shutil.copytree(pristine, tmp_path / "r", symlinks=True))
    steps = [d for _, d in list_checkpoints(run)]
    inside = {"checkpoints": run / "checkpoints", "checkpoints/step": steps[-1], "best": run / "best",
              "tb": run / "tb"}[where]
    inside.mkdir(exist_ok=True)
    (inside / "thesis.tex").write_text("p\n")
    code, _, err = aiayn("train", "--data", data, "--out", run, "--preset", "base", "--set", *SMALL,
                         "--max-steps", "2", "--threads", "1", "--no-progress", "--eval-every", "0",
                         "--overwrite")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{inside / 'thesis.tex'} is not something aiayn train wrote" in err
    assert "choose another --out" in err
    assert (inside / "thesis.tex").read_text() == "p\n"
    assert [d for _, d in list_checkpoints(run)] == steps  # nothing deleted
