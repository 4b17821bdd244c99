"""The `aiayn` command line: one subcommand per step of the recipe.

Each subcommand lives in `aiayn/commands/<name>.py` with `add_arguments(parser)` and
`main(args) -> int`. A `UserError`, or an I/O failure (a full disk, a read-only directory), becomes
one line on stderr and exit status 2, no traceback. Only the module of the command named on the
command line is imported (`aiayn --help` imports none). The import rule: a command module imports
at its top all it uses except what loads numpy, torch or another library measured to take 0.05 s
or more to import (matplotlib, sacrebleu, sacremoses, fastapi, an exporter's), which it imports in
the function that needs it, so that `aiayn COMMAND --help` and a mistyped option answer at once
(docs/experiments/performance.md; tests/test_cli_conventions.py checks it).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from typing import Collection

from aiayn.commands.common import RetiredSpelling
from aiayn.errors import UserError
from aiayn.files import io_failure
from aiayn.memory import restart_with_allocator, tune_memory

# name -> (module under aiayn.commands, one-line help); `aiayn --help` lists them from here.
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("prepare", "learn a shared BPE vocabulary and binarize a parallel corpus"),
    "train": ("train", "train a model on a prepared dataset"),
    "average": ("average", "average the parameters of the last N checkpoints"),
    "translate": ("translate", "translate text with a trained model"),
    "parse": ("parse", "parse sentences into bracketed trees with a trained model"),
    "evaluate": ("evaluate", "score translations: sacreBLEU, chrF, tokenized BLEU, perplexity"),
    "evalb": ("evalb", "score parse trees against gold trees as EVALB (COLLINS.prm) does"),
    "score": ("score", "the log-probability a model gives each translation (or n-best list)"),
    "export": ("export", "convert a model for CTranslate2, Hugging Face Transformers or ONNX"),
    "info": ("info", "print a preset's config, parameter count and FLOPs per token"),
    "attention": ("attention", "draw a model's attention for a sentence (heatmaps, lines, HTML)"),
    "plot": ("plot", "plot positional encodings, the learning-rate schedule, training curves"),
    "serve": ("serve", "translate over HTTP: an API with continuous batching and a web page"),
    "download": ("download", "fetch a public data set with checksums"),
    "treebank": ("treebank", "clean, split and linearize a Penn Treebank for parsing (§6.3)"),
    "study": ("study", "rerun the paper's Table 3 at CPU scale (resumable); measure Table 1"),
    "demo": ("demo", "train and evaluate grapheme-to-phoneme on CMUdict (offline)"),
}

# How `aiayn --help` lists them (argparse lists subcommands in one flat group).
GROUPS: dict[str, tuple[str, ...]] = {
    "pipeline": ("prepare", "train", "average", "translate", "parse", "evaluate", "evalb", "score",
                 "export"),
    "inspect": ("info", "attention", "plot"),
    "serve": ("serve",),
    "data": ("download", "treebank"),
    "paper experiments": ("study", "demo"),
}

EXAMPLES = (
    "aiayn download multi30k --out data/multi30k",
    "aiayn prepare --src-lang en --tgt-lang de --train data/multi30k/train --valid "
    "data/multi30k/val --test data/multi30k/test_2016_flickr --out data/m30k",
    "aiayn train --data data/m30k --out runs/m30k --preset translation-tiny-v2 --time-budget 60",
    "aiayn train --help",
)

ENVIRONMENT = ("environment: AIAYN_ALLOCATOR=system keeps the C library's malloc (by default a "
               "command but translate restarts itself once with mimalloc preloaded where the "
               "cmeel-mimalloc wheel is installed; AIAYN_ALLOCATOR=mimalloc asks for it there "
               "too); AIAYN_TUNE_MEMORY=0 keeps glibc's and PyTorch's default "
               "memory settings (aiayn/memory.py; by default freed memory stays in the process "
               "and large tensors use huge pages, for faster CPU training)")


def command_list() -> str:
    """The commands by group, one line each, as `aiayn --help` shows them."""
    width = max(map(len, COMMANDS))
    lines = ["commands (aiayn COMMAND --help shows a command's options and examples):"]
    for group, names in GROUPS.items():
        lines.append(f"  {group}")
        lines += [f"    {name:<{width}}  {COMMANDS[name][1]}" for name in names]
    return "\n".join(lines)


# Commands that were retired, with what to type instead.
RETIRED_COMMANDS = {
    "train-chart": ("the chart parser trains through `aiayn train`: aiayn train --data CORPUS --out "
                    "RUN --preset parsing-chart-small --time-budget MINUTES, then aiayn average "
                    "--run RUN --out MODEL (docs/guides/parsing.md)"),
}


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of `aiayn`, with the options of `commands` (None: every command's, as the tests
    walk them): only their modules are imported; the other commands stay valid choices, with
    empty parsers."""
    parser = argparse.ArgumentParser(
        prog="aiayn", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"{__doc__.splitlines()[0]}\n\n{command_list()}",
        epilog=textwrap.fill(ENVIRONMENT, 94) + "\n\nExamples:\n"
               + "\n".join(f"  {e}" for e in EXAMPLES))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                help="the command to run (listed above)")
    for name, (mod, help_) in COMMANDS.items():
        # no help=: argparse would list the commands again, ungrouped
        p = sub.add_parser(name, description=help_)
        if commands is None or name in commands:
            module = importlib.import_module(f"aiayn.commands.{mod}")
            module.add_arguments(p)
            p.set_defaults(_module=module, _parser=p)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The command an `aiayn` command line names: its first word that is not an option (the
    top-level parser takes no option with a value)."""
    return next((a for a in argv if not a.startswith("-")), None)


# import names whose pip package is named otherwise
_PIP_NAMES = {"yaml": "pyyaml", "google": "protobuf", "PIL": "pillow", "sklearn": "scikit-learn"}


def missing_package(e: ModuleNotFoundError) -> str | None:
    """The line for one of aiayn's dependencies missing (aiayn run from source); None for a
    missing module of aiayn itself (a bug)."""
    top = (e.name or "").split(".")[0]
    if not top or top == "aiayn":
        return None
    return (f"the Python package {top!r} is not installed; install aiayn with its dependencies "
            f"(pip install -e .) or that package (pip install {_PIP_NAMES.get(top, top)})")


def main(argv: list[str] | None = None) -> int:
    """The command line; `argv` None means this process's own arguments, and only then may the
    process restart itself with mimalloc preloaded (aiayn/memory.py), before torch is loaded."""
    if argv is None:
        try:  # the same PID goes on, so torchrun keeps track of its workers
            restart_with_allocator([sys.executable, "-m", "aiayn", *sys.argv[1:]],
                                   command=sys.argv[1] if len(sys.argv) > 1 else None)
        except ValueError as e:
            print(f"aiayn: error: {e}", file=sys.stderr)
            return 2
    tune_memory()  # before anything imports torch (aiayn/memory.py)
    args_list = sys.argv[1:] if argv is None else argv
    if args_list and args_list[0] in RETIRED_COMMANDS:
        print(f"aiayn {args_list[0]}: error: this command was retired; "
              f"{RETIRED_COMMANDS[args_list[0]]}", file=sys.stderr)
        return 2
    command = named_command(args_list)
    try:
        parser = build_parser([command] if command else [])  # imports that command's module only
        args = parser.parse_args(argv)
    except RetiredSpelling as e:  # an old option spelling: one line naming the new one
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # a dependency the command's module imports at its top
        line = missing_package(e)
        if line is None:
            raise
        print(f"aiayn {command}: error: {line}", file=sys.stderr)
        return 2
    try:
        return int(args._module.main(args) or 0)
    except UserError as e:
        print(f"aiayn {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aiayn {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except ModuleNotFoundError as e:  # one of aiayn's dependencies missing (aiayn run from source)
        line = missing_package(e)
        if line is None:
            raise
        print(f"aiayn {args.command}: error: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # a disk that filled up, a directory that is not writable: one line
        line = io_failure(e)
        if line is None:
            raise
        print(f"aiayn {args.command}: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
