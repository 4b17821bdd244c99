"""What the commands share: one spelling, one set of values and one default for each idea
(precision, device, outputs, durations), the search options and the one way a command builds
its `Translator` (`translator_from_args`), retired spellings, help examples.

The conventions (checked over every subcommand by tests/test_cli_conventions.py):
- `--out DIR` names a directory a command writes, `--output FILE` a file, `--model DIR` a model
  it reads;
- `--precision {auto,fp32,bf16,fp16,int8}`, default auto (aiayn/precision.py), in every command
  that computes; a value the command cannot run is refused in one line naming those it can;
- `--device`, default the GPU when there is one, else the CPU;
- durations are `--time-budget MINUTES`, step counts `--max-steps N`;
- an option a command no longer spells so fails with one line naming the new spelling
  (`retire`), and one a command would ignore is not offered, or refused in one line;
- every command's help ends with runnable examples (`set_examples`).

Imports nothing heavy: every command's `add_arguments` runs when the parser is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from aiayn.decoding import DECODE_PRECISIONS, EARLY_STOP_RULES, MAX_BEAM_SIZE, ROOM_TOKENS
from aiayn.errors import UserError
from aiayn.training import PRECISIONS as TRAIN_PRECISIONS

if TYPE_CHECKING:
    from aiayn.config import Config
    from aiayn.decoding.search import SearchOptions, SearchSettings
    from aiayn.decoding.translate import Translator

# The one vocabulary of `--precision`; each command runs a subset (TRAIN_PRECISIONS for training
# and teacher-forced scoring, DECODE_PRECISIONS for search) and refuses the rest in one line.
PRECISIONS = ("auto", "fp32", "bf16", "fp16", "int8")
PRECISION_HELP = ("arithmetic: auto (default: bf16 on a GPU or on a CPU with native bf16, "
                  "AVX512-BF16 or AMX; else fp32), fp32 (the paper's), bf16, fp16 (GPU, "
                  "training), int8 (x86 CPU, decoding)")
DEVICE_HELP = "cpu, cuda or cuda:N (default: the GPU when there is one, else the CPU)"


# --- retired spellings ------------------------------------------------------------------------

class RetiredSpelling(UserError):
    """An option spelling a command no longer takes; `prog` is the command (`aiayn plot
    positions`), so the message can name it as argparse would."""

    def __init__(self, prog: str, message: str):
        self.prog = prog
        super().__init__(message)


class RetiredOption(argparse.Action):
    """A hidden option that fails, as soon as it is read, with one line naming its successor.
    Hidden so that help shows one spelling per idea; kept so that an old command line gets the
    new spelling instead of argparse's `unrecognized arguments` (or worse, an abbreviation of
    another option: `--out` would otherwise be taken as `--output`)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        kwargs.update(nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        raise RetiredSpelling(parser.prog, f"{option_string} is now {self.new}")


class RetiredPositionals(argparse.Action):
    """Positional arguments a command no longer takes (hidden; fails when any is given)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        self.new = new
        kwargs.update(nargs="*", help=argparse.SUPPRESS, default=[])
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if values:
            raise RetiredSpelling(parser.prog, f"{' '.join(values)}: positional arguments are now "
                                               f"{self.new}")


def retire(p: argparse.ArgumentParser, *spellings: str, new: str) -> None:
    """`spellings` (options) fail with "OLD is now NEW"."""
    p.add_argument(*spellings, action=RetiredOption, new=new, dest=f"_retired_{spellings[0]}")


def retire_positionals(p: argparse.ArgumentParser, new: str) -> None:
    p.add_argument("_retired_positionals", action=RetiredPositionals, new=new)


# --- which options were given -----------------------------------------------------------------

def given(args: argparse.Namespace, dests: Iterable[str] | None = None) -> list[str]:
    """The options of `args`' command (of `dests`, or all) that the user set to something other
    than their defaults, by their first spelling: what a command that would ignore them refuses.
    Built on the parser `aiayn.cli` stores in `args._parser`."""
    wanted = None if dests is None else set(dests)
    return [a.option_strings[0] for a in args._parser._actions
            if a.option_strings and a.default is not argparse.SUPPRESS
            and (wanted is None or a.dest in wanted)
            and getattr(args, a.dest, a.default) != a.default]


def refuse_unused(args: argparse.Namespace, dests: Iterable[str], why: str) -> None:
    """One error line naming each of `dests` the user set, and `why` it does not apply."""
    flags = given(args, dests)
    if flags:
        raise UserError(f"{', '.join(flags)}: {why}")


# --- help -------------------------------------------------------------------------------------

def set_examples(p: argparse.ArgumentParser, *examples: str, about: str | None = None) -> None:
    """End `p`'s help with `examples` (command lines that run as written, given the files they
    name); `about`, a paragraph or more, goes after the description, formatted as written."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    if about:
        p.description = f"{p.description or ''}\n\n{about.strip()}".strip()
    p.epilog = "Examples:\n" + "\n".join(f"  {e}" for e in examples)


# --- progress ---------------------------------------------------------------------------------

def add_no_progress_argument(group) -> None:
    """`--no-progress`, for commands whose long work shows progress by default."""
    group.add_argument("--no-progress", action="store_true",
                       help="no progress (by default: a bar at a terminal, a line every 30 "
                            "seconds in a log)")


# --- precision and device ---------------------------------------------------------------------

def add_precision_argument(group) -> None:
    """`--precision`: the same choices and default in every command (read it with
    `check_precision`, then `decode_precision` or the trainer's `Precision`)."""
    group.add_argument("--precision", choices=PRECISIONS, default="auto", help=PRECISION_HELP)


def check_precision(args: argparse.Namespace, usable: Sequence[str], command: str) -> str:
    """`args.precision` if `command` can run it, else one error line naming what it can."""
    if args.precision not in usable:
        raise UserError(f"--precision {args.precision}: aiayn {command} runs in "
                        f"{', '.join(usable)}")
    return args.precision


def add_device_argument(group) -> None:
    group.add_argument("--device", default=None, help=DEVICE_HELP)


def torch_device(name: str | None):
    """`--device` as a torch device: None is the GPU when there is one, else the CPU."""
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {name}: unknown device; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device {name}: use cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None \
            and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA "
                        f"device(s)")
    return device


def decode_precision(args: argparse.Namespace, device, command: str) -> str:
    """The decoding precision `--precision` asks for, checked for `command` and `device`
    ("auto" chosen for it); one error line where it cannot run."""
    from aiayn.decoding.precision import resolve

    check_precision(args, DECODE_PRECISIONS, command)
    try:
        return resolve(args.precision, device)
    except ValueError as e:
        raise UserError(f"--precision {args.precision}: {e}") from None


def check_train_precision(args: argparse.Namespace, command: str) -> str:
    """`--precision` for commands that train (or score teacher-forced) under autocast."""
    return check_precision(args, TRAIN_PRECISIONS, command)


# --- input ------------------------------------------------------------------------------------

# Lines translated or parsed together (batched by length within the group) when input is
# plentiful: large enough that batches are as full as a whole file's, small enough to keep memory
# flat whatever the input's length.
STREAM_LINES = 2000


def input_groups(path: str | None, most: int) -> Iterator[list[str]]:
    """The lines of `path` (which may be gzipped), or of stdin for None or '-', as they come, in
    groups of at most `most` lines; from stdin a group ends early when no more input is ready (a
    pipe fed a line at a time gets each line's answer before the next line). A missing file is
    refused here, before any slow work; bad bytes when the reading reaches them."""
    from aiayn.checks import reading
    from aiayn.data.corpus import iter_line_blocks, iter_ready_groups

    if path is None or path == "-":
        return iter_ready_groups(sys.stdin.fileno(), "<stdin>", most)
    with reading(Path(path), "a text file"):
        open(path, "rb").close()

    def regrouped() -> Iterator[list[str]]:
        group: list[str] = []
        for block in iter_line_blocks(path):
            group += block
            while len(group) >= most:
                yield group[:most]
                group = group[most:]
        if group:
            yield group

    return regrouped()


def read_input(path: str | None) -> list[str]:
    """The lines of `path` (which may be gzipped), or of stdin for None or '-'."""
    from aiayn.data.corpus import decode_utf8, read_lines, split_lines

    if path is None or path == "-":
        return split_lines(decode_utf8(sys.stdin.buffer.read(), "<stdin>"))
    return read_lines(path)


def one_based(value: int, n: int, option: str, noun: str) -> int:
    """A 1-based command-line index (negative: from the end) as a 0-based one; UserError if out
    of range."""
    if value == 0 or not -n <= value <= n:
        raise UserError(f"{option} {value}: the model has {n} {noun}s "
                        f"(1..{n}, or -1..-{n} counting from the top)")
    return value - 1 if value > 0 else n + value


# --- search -----------------------------------------------------------------------------------

def add_early_stop_argument(group) -> None:
    """`--early-stop`, shared by translate, parse and serve."""
    group.add_argument("--early-stop", choices=EARLY_STOP_RULES, default="exact",
                       help="not in the paper: when a sentence's beam search ends. exact (default): "
                            "when no live beam can still win; current: when none would win by "
                            "ending at the next step (sooner with alpha > 0, as fairseq and "
                            "CTranslate2 stop; may miss a longer winner)")


def add_search_arguments(p: argparse.ArgumentParser, nbest: bool = True) -> None:
    """Search (§6.1), batching and hardware options, shared by `aiayn translate` and `aiayn
    parse` (which writes one tree per sentence: no `--nbest`)."""
    s = p.add_argument_group("search (defaults: the model config's, the paper's)")
    s.add_argument("--beam", type=int, metavar="K",
                   help=f"beam size, 1 to {MAX_BEAM_SIZE} (config default 4)")
    s.add_argument("--alpha", type=float, help="length penalty exponent (config default 0.6)")
    s.add_argument("--max-len-a", type=float, metavar="A",
                   help="maximum output length = A * source length + B (config default A=1)")
    s.add_argument("--max-len-b", type=int, metavar="B", help="(config default B=50)")
    s.add_argument("--min-len", type=int, default=0, metavar="N",
                   help="not in the paper: no EOS before output length N, EOS counted (default 0: off)")
    add_early_stop_argument(s)
    s.add_argument("--greedy", action="store_true", help="greedy search instead of beam search")
    if nbest:
        s.add_argument("--nbest", type=int, metavar="N",
                       help="write the N best hypotheses per line as index<TAB>score<TAB>text")
    b = p.add_argument_group("batching and hardware")
    g = b.add_mutually_exclusive_group()
    g.add_argument("--batch-tokens", type=int, default=ROOM_TOKENS, metavar="T",
                   help="room of the search: the sentences decoded at once x their longest "
                        "source, padded to a multiple of 16; waiting sentences join as others "
                        f"finish (default {ROOM_TOKENS})")
    g.add_argument("--batch-size", type=int, metavar="N",
                   help="at most N sentences decoded at once instead")
    b.add_argument("--max-src-tokens", type=int, default=1024, metavar="N",
                   help="truncate longer sources, with a warning (default 1024, EOS included)")
    add_device_argument(b)
    add_precision_argument(b)
    retire(p, "--bf16", new="--precision bf16")


def add_alignment_arguments(p: argparse.ArgumentParser) -> None:
    """Word alignments from encoder-decoder attention (`aiayn translate --alignment`)."""
    a = p.add_argument_group("word alignment (from encoder-decoder attention)")
    a.add_argument("--alignment", choices=["hard", "soft"],
                   help="append ' ||| ' and the alignment to each line: hard = Pharaoh i-j pairs, "
                        "soft = per target word its weights over the source words")
    a.add_argument("--alignment-layer", type=int, default=-1, metavar="L",
                   help="decoder layer, 1-based, negative from the top (default -1: the last)")
    a.add_argument("--alignment-head", type=int, metavar="H",
                   help="one head, 1-based (default: the mean of all heads)")
    a.add_argument("--alignment-unit", choices=["word", "piece"], default="word",
                   help="align words (pieces merged back, default) or subword pieces")


def search_options(args: argparse.Namespace) -> "SearchOptions":
    """The search asked for by `add_search_arguments`' options, or by those of them a command
    has (`aiayn attention`: --beam, --greedy; `aiayn serve`: --early-stop, --batch-tokens); an
    option a command lacks is left to the model's config or the default. `--max-src-tokens`,
    where a command has it, is checked here too."""
    from aiayn.decoding.search import SearchOptions

    limit = getattr(args, "max_src_tokens", None)
    if limit is not None and limit < 2:
        raise UserError(f"--max-src-tokens must be >= 2 (one piece and EOS), got {limit}")
    d = SearchOptions()
    batch_size = getattr(args, "batch_size", None)
    return SearchOptions(
        greedy=getattr(args, "greedy", False), beam_size=getattr(args, "beam", None),
        alpha=getattr(args, "alpha", None), max_len_a=getattr(args, "max_len_a", None),
        max_len_b=getattr(args, "max_len_b", None), min_len=getattr(args, "min_len", 0),
        # --nbest 0 goes to the settings' check (one line), not quietly to 1
        nbest=1 if getattr(args, "nbest", None) is None else args.nbest,
        early_stop=getattr(args, "early_stop", d.early_stop),
        # --batch-size replaces the token budget rather than adding to it
        batch_tokens=sys.maxsize if batch_size else getattr(args, "batch_tokens", d.batch_tokens),
        batch_size=batch_size)


def search_settings(args: argparse.Namespace, cfg: "Config") -> "SearchSettings":
    """The search of a command's arguments (`search_options`), decided against the first
    --model's config `cfg` (`aiayn.data.model_dir.read_config`): what a command does before it
    reads any weights, so that an impossible setting (or source limit) is one error line."""
    try:
        return search_options(args).resolve(cfg)
    except ValueError as e:
        raise UserError(str(e)) from None


def translator_from_args(args: argparse.Namespace, command: str,
                         settings: "SearchSettings") -> "Translator":
    """The `Translator` of `aiayn COMMAND`'s arguments, the same way for translate, parse,
    serve and attention: the --model directories (several: their ensemble), loaded on
    `--device` and converted to `--precision` (both checked for the command), with the search
    `settings` (`search_settings`, decided before) and `--max-src-tokens`; a truncated line is
    a warning on stderr, `aiayn COMMAND: warning: ...`. Reads the weights: every check that
    needs none comes before."""
    from aiayn.decoding.ensemble import load_models
    from aiayn.decoding.translate import DEFAULT_MAX_SRC_TOKENS, Translator

    device = torch_device(args.device)
    precision = decode_precision(args, device, command)
    # one directory (`aiayn attention`), or several: an ensemble
    loaded = load_models([args.model] if isinstance(args.model, str) else args.model, device)
    try:
        return Translator(loaded, precision=precision, settings=settings,
                          max_src_tokens=getattr(args, "max_src_tokens", DEFAULT_MAX_SRC_TOKENS),
                          warn=lambda m: print(f"aiayn {command}: warning: {m}", file=sys.stderr))
    except ValueError as e:  # e.g. int8 for a model without an int8 path
        raise UserError(str(e)) from None
