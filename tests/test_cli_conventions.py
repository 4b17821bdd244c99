"""One CLI dialect: every subcommand's parser follows the conventions of aiayn/commands/common.py,
so that they hold for commands added later; retired spellings fail in one line naming the new
one; evaluate never guesses a language; progress in a log is lines, not a redrawn bar; and an
--overwrite (or a rerun) never replaces a file its command did not write."""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from aiayn.cli import COMMANDS, GROUPS, build_parser, named_command
from aiayn.cli import main as cli_main
from aiayn.commands import prepare as prepare_command
from aiayn.commands import train as train_command
from aiayn.commands.args import options_from_args
from aiayn.commands.common import DEVICE_HELP, PRECISIONS, RetiredOption, RetiredPositionals
from aiayn.data.corpus import ParallelSource
from aiayn.data.prepare import PrepareOptions, prepare_dataset
from aiayn.errors import UserError
from aiayn.presets import load_config
from aiayn.progress import Progress
from aiayn.recipes.download import download_files
from aiayn.recipes.table3_study import StudySettings, open_study
from aiayn.training.options import TrainOptions

# The commands that compute with a model: each takes --precision and --device.
COMPUTING = {"train", "translate", "parse", "serve", "attention", "evaluate", "demo", "study"}
RETIRED_NAMES = {"--minutes", "--updates", "--quantization", "--bf16"}


def subparsers(parser: argparse.ArgumentParser, prefix: str = "aiayn"):
    """(command line, parser) of every subcommand, nested ones (`aiayn plot positions`) too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix} {name}", sub
                yield from subparsers(sub, f"{prefix} {name}")


PARSERS = dict(subparsers(build_parser()))


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Shown options by each of their spellings (retired ones left out)."""
    return {s: a for a in p._actions for s in a.option_strings
            if not isinstance(a, (RetiredOption, RetiredPositionals))}


def leaf_parsers():
    """Parsers that run a command (not `aiayn plot`, whose subcommands do)."""
    return {n: p for n, p in PARSERS.items()
            if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)}


def test_every_command_is_listed_once_in_the_grouped_help():
    listed = [c for names in GROUPS.values() for c in names]
    assert sorted(listed) == sorted(COMMANDS)
    text = build_parser().format_help()
    positions = [text.index(f"\n  {group}\n") for group in GROUPS]
    assert positions == sorted(positions)  # in the order pipeline, inspect, serve, data, ...
    assert list(GROUPS)[:2] == ["pipeline", "inspect"] and "paper experiments" in GROUPS


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_ends_with_a_runnable_example(name):
    lines = [line.strip() for line in PARSERS[name].format_help().splitlines() if line.strip()]
    assert lines[-1].startswith("aiayn "), (name, lines[-1])
    assert "Examples:" in lines


def test_train_help_first_example_uses_a_current_preset():
    text = PARSERS["aiayn train"].format_help()
    first = text.split("Examples:\n", 1)[1].splitlines()[0].split()
    assert first[:2] == ["aiayn", "train"]
    load_config(first[first.index("--preset") + 1])  # exists (a retired name raises)


def test_precision_one_vocabulary_one_default():
    seen = set()
    for name, p in PARSERS.items():
        a = options(p).get("--precision")
        if a is None:
            continue
        seen.add(name.split()[1])
        if name == "aiayn export":  # the stored weight type: no auto, default as trained
            assert set(a.choices) < set(PRECISIONS) and "auto" not in a.choices
            assert a.default == "fp32"
        else:
            assert tuple(a.choices) == PRECISIONS and a.default == "auto", name
    assert COMPUTING <= seen


def test_device_one_default_and_help():
    seen = set()
    for name, p in PARSERS.items():
        a = options(p).get("--device")
        if a is not None:
            seen.add(name.split()[1])
            assert a.default is None and a.help == DEVICE_HELP and a.choices is None, name
    assert COMPUTING <= seen


def test_retired_names_are_hidden_and_outputs_durations_follow_the_convention():
    for name, p in PARSERS.items():
        shown = options(p)
        assert not RETIRED_NAMES & set(shown), name
        for flag, a in shown.items():
            if flag == "--out":  # a directory the command writes
                assert a.metavar and a.metavar.endswith("DIR"), (name, a.metavar)
            if flag == "--output":  # a file
                assert a.metavar == "FILE", name
            if flag == "--time-budget" or a.metavar == "MINUTES":
                assert flag == "--time-budget" and a.metavar == "MINUTES", name
            if flag == "--max-steps":
                assert a.metavar == "N", name
        for a in p._actions:  # no positional output: outputs are named
            if not a.option_strings and not isinstance(a, RetiredPositionals):
                assert not (a.metavar or "").upper().startswith("OUT"), (name, a.metavar)


def test_no_option_a_command_would_ignore():
    parse, translate = options(PARSERS["aiayn parse"]), options(PARSERS["aiayn translate"])
    assert not [f for f in parse if f.startswith("--alignment") or f in ("--nbest", "--glossary")]
    assert {"--alignment", "--alignment-layer", "--alignment-head", "--alignment-unit",
            "--nbest", "--glossary"} <= set(translate)


@pytest.mark.parametrize("argv, new", [
    (["demo", "--minutes", "5"], "--time-budget MINUTES"),
    (["study", "table3", "--out", "{tmp}/s", "--updates", "5"], "--max-steps N"),
    (["translate", "--model", "{tmp}/m", "--bf16"], "--precision bf16"),
    (["parse", "--model", "{tmp}/m", "--bf16"], "--precision bf16"),
    (["export", "--format", "ctranslate2", "--quantization", "int8", "--model", "{tmp}/m", "--out",
      "{tmp}/o"], "--precision {fp32,bf16,fp16,int8}"),
    (["export", "--format", "ctranslate2", "{tmp}/m", "{tmp}/o"], "--model DIR --out DIR"),
    (["plot", "positions", "--out", "{tmp}/pe.png"], "--output FILE"),
])
def test_retired_spellings_fail_in_one_line_naming_the_new_one(argv, new, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and new in err and captured.out == ""
    prog = "aiayn " + " ".join(argv[:2] if argv[0] == "plot" else argv[:1])
    assert err.startswith(f"{prog}: error: ")
    assert list(tmp_path.iterdir()) == []  # nothing done


def test_train_chart_is_retired_with_its_successor(capsys):
    assert cli_main(["train-chart", "--corpus", "c", "--out", "m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--preset parsing-chart-small" in err


@pytest.mark.parametrize("argv, says", [
    (["train", "--data", "{tmp}/d", "--out", "{tmp}/r", "--precision", "int8"],
     "aiayn train runs in auto, fp32, bf16, fp16"),
    (["translate", "--model", "{tmp}/m", "--precision", "fp16"],
     "aiayn translate runs in auto, fp32, bf16, int8"),
    (["translate", "--model", "{tmp}/m", "--glossary", "{tmp}/r", "--alignment", "hard"],
     "--glossary does not combine with --alignment"),
    (["translate", "--model", "{tmp}/m", "--glossary", "{tmp}/r"],
     "line 1: expected 'source term<TAB>target term'"),  # read before the (missing) model
    (["parse", "--model", "{tmp}/m", "--precision", "fp16"], "aiayn parse runs in"),
    (["demo", "--out", "{tmp}/g", "--precision", "int8"], "aiayn demo runs in"),
    (["demo", "--out", "{tmp}/g", "--keep", "0"], "--keep must be >= 1, got 0"),
    (["evaluate", "--ref", "{tmp}/r", "--hyp", "{tmp}/r", "--lang", "de", "--precision", "bf16"],
     "--precision: these run --model's perplexity"),
    (["evaluate", "--ref", "{tmp}/r", "--src", "{tmp}/r", "--model", "{tmp}/m", "--lang", "de"],
     "--lang: these set how --hyp is scored"),
])
def test_a_value_or_option_a_command_cannot_use_is_one_line(argv, says, tmp_path, capsys):
    (tmp_path / "r").write_text("a\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_parse_refuses_translate_only_options(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["parse", "--model", "m", "--nbest", "2"])
    assert e.value.code == 2 and "--nbest" in capsys.readouterr().err


# --- evaluate --lang --------------------------------------------------------------------------

def test_evaluate_without_a_known_language_asks_for_lang(tmp_path, capsys):
    (tmp_path / "ref.txt").write_text("Le chat.\n", encoding="utf-8")
    argv = ["evaluate", "--hyp", str(tmp_path / "ref.txt"), "--ref", str(tmp_path / "ref.txt")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass it, e.g. --lang de" in err
    assert cli_main(argv + ["--lang", "fr", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lang"] == "fr"


def test_evaluate_takes_the_language_of_the_dataset_the_reference_lies_in(tmp_path, capsys):
    src = ["a cat sits", "a dog runs", "the cat", "the dog", "cats and dogs"] * 4
    tgt = ["un chat est assis", "un chien court", "le chat", "le chien", "chats et chiens"] * 4
    for side, lines in (("en", src), ("fr", tgt)):
        (tmp_path / f"c.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = ParallelSource(tmp_path / "c.en", tmp_path / "c.fr")
    data = tmp_path / "data"
    chars = set("".join(src + tgt))  # a character vocabulary: the smallest that trains
    prepare_dataset(data, {"train": corpus, "test": corpus},
                    PrepareOptions("en", "fr", vocab_size=len(chars) + 4, model_type="char"),
                    workers=0, progress=False)
    ref = data / "test.tgt.txt"
    assert cli_main(["evaluate", "--hyp", str(ref), "--ref", str(ref), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lang"] == "fr" and "no compound splitting" in out["tokenized_bleu"]["style"]
    assert cli_main(["evaluate", "--hyp", str(ref), "--ref", str(data / "test.src.txt"),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lang"] == "en"


# --- progress ---------------------------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_plain_lines():
    log = io.StringIO()
    with Progress(40, desc="train", unit="step", file=log, interval=0) as bar:
        for _ in range(4):
            bar.update(10)
            bar.set_postfix({"loss": "3.142"})
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) == 4  # one per update (interval 0); the end was shown already
    assert lines[0].startswith("train: 10/40 step (25%), ") and "elapsed" in lines[0]
    assert lines[-1].startswith("train: 40/40 step (100%)") and lines[-1].endswith("loss=3.142")
    log = io.StringIO()
    with Progress(40, desc="x", file=log, interval=0) as bar:
        bar.update(10)
        bar.interval = 3600  # the next updates come sooner than a line is due
        bar.update(30)
    assert [line.split(" (")[0] for line in log.getvalue().splitlines()] == ["x: 10/40 it",
                                                                         "x: 40/40 it"]


def test_progress_in_a_log_is_quiet_for_short_work_and_when_disabled():
    log = io.StringIO()
    with Progress(3, desc="x", file=log) as bar:  # under the 30-second interval: no line
        bar.update(3)
    with Progress(3, desc="x", file=log, interval=0, enabled=False) as bar:
        bar.update(3)
    assert log.getvalue() == ""


def test_progress_at_a_terminal_is_a_bar():
    term = Terminal()
    with Progress(4, desc="parsing", unit="sent", file=term) as bar:
        bar.update(4)
    assert "\r" in term.getvalue() and "4/4" in term.getvalue()


# --- --overwrite and reruns replace only their own files --------------------------------------

def test_demo_refuses_a_directory_it_did_not_write(tmp_path, capsys):
    mine = tmp_path / "mine"
    (mine / "corpus").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    assert cli_main(["demo", "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "notes.txt" in err
    (mine / "notes.txt").unlink()
    (mine / "corpus" / "train.src").write_text("mine too")
    (mine / "corpus" / "words.txt").write_text("and mine")
    assert cli_main(["demo", "--out", str(mine)]) == 2
    assert "corpus/words.txt" in capsys.readouterr().err
    assert (mine / "corpus" / "train.src").read_text() == "mine too"


def test_treebank_never_replaces_files_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "train.words").write_text("my own words\n")
    argv = ["treebank", "--treebank", str(tmp_path / "none.zip"), "--out", str(out)]
    for extra in ([], ["--overwrite"]):  # no corpus.json: not treebank's, even with --overwrite
        assert cli_main(argv + extra) == 2
        assert "not written by aiayn treebank" in capsys.readouterr().err
    # a corpus's own files may be replaced with --overwrite; a file it did not list may not
    (out / "train.words").unlink()
    (out / "corpus.json").write_text(json.dumps({"splits": "train=1-9", "signatures": 0}))
    (out / "train.words").write_text("from the corpus\n")
    (out / "train.src").write_text("my own sources\n")
    assert cli_main(argv + ["--splits", "train=1-9", "--signatures", "2", "--overwrite"]) == 2
    assert "train.src is not a file of the corpus" in capsys.readouterr().err
    assert (out / "train.src").read_text() == "my own sources\n"


def test_download_never_replaces_a_file_it_did_not_write(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    text = b"a line\n"
    with gzip.open(mirror / "train.en.gz", "wb") as f:
        f.write(text)
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.en.gz").write_bytes(b"my own file")
    with pytest.raises(UserError, match="exists and is not train.en.gz as published"):
        download_files({"train.en.gz": hashlib.sha256(text).hexdigest()}, mirror.as_uri(), out,
                       progress=False)
    assert (out / "train.en.gz").read_bytes() == b"my own file"


def test_study_refuses_a_directory_that_holds_no_study(tmp_path):
    class Data:
        manifest = {"fingerprint": "f"}

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match="holds no study"):
        open_study(out, StudySettings(), Data())
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    open_study(tmp_path / "new", StudySettings(), Data())  # a new directory is fine
    assert (tmp_path / "new" / "study.json").is_file()


# --- commands are thin: options by field name, imports by what they cost --------------------

# The options of a command that fill no field of its name, and the fields no option sets.
DERIVED = {
    "train": (TrainOptions, train_command.train_options, ["--data", "d", "--out", "r"],
              {"fit_saves_to_budget", "set_fields", "tensorboard", "progress"}),
    "prepare": (PrepareOptions, prepare_command.prepare_options,
                ["--src-lang", "de", "--tgt-lang", "en", "--train", "x", "--out", "y"],
                {"byte_fallback", "character_coverage"}),
}


@pytest.mark.parametrize("command", sorted(DERIVED))
def test_every_options_field_comes_from_the_option_of_its_name_or_is_listed(command):
    cls, build, argv, derived = DERIVED[command]
    parser = PARSERS[f"aiayn {command}"]
    args = parser.parse_args(argv)
    by_name = {f.name for f in fields(cls)} & {a.dest for a in parser._actions}
    assert {f.name for f in fields(cls)} - by_name == derived  # a new field needs an option
    for name in by_name:  # each reaches its field, whatever its value
        marked = argparse.Namespace(**{**vars(args), name: object()})
        assert getattr(build(marked), name) is getattr(marked, name), name


def test_train_options_are_the_defaults_unless_given():
    parser = PARSERS["aiayn train"]
    options = train_command.train_options(parser.parse_args(["--data", "d", "--out", "r"]))
    assert options == TrainOptions(fit_saves_to_budget=True)  # saves fit to a time budget
    options = train_command.train_options(parser.parse_args(
        ["--data", "d", "--out", "r", "--save-minutes", "5", "--eval-bleu-sentences", "0",
         "--no-tensorboard", "--no-progress", "--max-steps", "9"]))
    assert options == TrainOptions(save_minutes=5.0, eval_bleu_sentences=0, tensorboard=False,
                                   progress=False, max_steps=9)


def test_options_from_args_refuses_a_field_no_option_sets():
    @dataclass
    class Options:
        steps: int = 3
        seed: int | None = 1
        quiet: bool = False

    args = argparse.Namespace(steps=5, seed=None, loud=True)
    assert options_from_args(Options, args, quiet=not args.loud) == Options(steps=5, seed=1)
    assert options_from_args(Options, args, defaults=["quiet"]) == Options(steps=5, seed=1)
    with pytest.raises(TypeError, match="no option sets quiet"):
        options_from_args(Options, args)
    with pytest.raises(TypeError, match="no field loud"):
        options_from_args(Options, args, loud=True)


def test_the_command_line_names_the_one_module_to_import():
    assert named_command(["--help"]) is None and named_command([]) is None
    assert named_command(["train", "--data", "d"]) == "train"
    assert named_command(["--bogus", "plot", "positions"]) == "plot"


# Libraries that take 0.05 s or more to import (docs/experiments/performance.md): a command
# imports them in the function that needs them, never while its parser is built.
HEAVY = ("numpy", "torch", "matplotlib", "sacrebleu", "sacremoses", "transformers", "onnx",
         "ctranslate2", "tensorboard", "fastapi")


def test_help_imports_only_the_named_command_and_nothing_heavy():
    code = """
import json, sys
from aiayn.cli import build_parser
def commands():
    return sorted(m for m in sys.modules if m.startswith("aiayn.commands."))
build_parser([])
top = commands()
build_parser(["evalb"])
one = commands()
build_parser()
print(json.dumps([top, one, [m for m in %r if m in sys.modules]]))
""" % (HEAVY,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    top, one, heavy = json.loads(out)
    assert top == ["aiayn.commands.common"]  # aiayn --help imports no command
    assert one == ["aiayn.commands.common", "aiayn.commands.evalb"]
    assert heavy == []  # every command's --help answers without them
