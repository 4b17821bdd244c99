"""`aiayn translate`: translate text with a model directory (beam search, §6.1).

    aiayn translate --model runs/base/model --input test.en --output test.hyp.de
    aiayn translate --model runs/base/model < test.en > test.hyp.de
    aiayn translate --model runs/base/model            # at a terminal: interactive

Reads UTF-8 lines (a file, which may be gzipped, or stdin) and writes exactly one line of
detokenized text per input line, in input order (a blank input line, empty or whitespace only,
gives an empty output line). `--output` is written atomically, never replaces an existing file
without `--overwrite`, and is locked while it is written (a second translate into it is refused).
With `--nbest N` each input line gives up to N lines, best first:

    index<TAB>score<TAB>text

where index is the 0-based input line number and score the search score (log-probability divided
by the GNMT length penalty; higher is better); a blank input line gives one line with score 0.

With `--alignment hard` each line is `translation ||| 0-0 1-2 ...`: Pharaoh-format word
alignments (source word i - target word j, 0-based) from the encoder-decoder attention the search
used, by default of the last decoder layer, averaged over its heads (fairseq's and Marian's
choice); `--alignment soft` prints, per target word, its weights over the source words
(comma-separated; groups separated by spaces). Details: aiayn/decoding/alignment.py.

Search defaults come from the model's config (the paper's: beam 4, alpha 0.6, maximum output
length = source length + 50, both lengths counting EOS). Inputs longer than the model can take
(`--max-src-tokens`, and `max_positions` for learned positions) are truncated, with a warning on
stderr naming the line.
"""

from __future__ import annotations

import argparse
import sys

from aiayn.decoding import DECODE_PRECISIONS, EARLY_STOP_RULES
from aiayn.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, nargs="+", metavar="DIR",
                   help="model directory (from train/average); several: their ensemble, the mean "
                        "of their next-token probabilities (not in the paper; "
                        "aiayn/decoding/ensemble.py)")
    p.add_argument("--input", "-i", metavar="FILE", help="UTF-8 text, one sentence a line (default: stdin)")
    p.add_argument("--output", "-o", metavar="FILE", help="where to write (default: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    add_search_arguments(p)
    o = p.add_argument_group("interaction")
    o.add_argument("--interactive", action="store_true",
                   help="prompt and translate each line as it is typed (the default when stdin "
                        "is a terminal and there is no --input)")
    o.add_argument("--progress", action="store_true",
                   help="show a progress bar on stderr (default: when stderr is a terminal)")


def add_early_stop_argument(group) -> None:
    """`--early-stop`, shared by translate, parse and serve."""
    group.add_argument("--early-stop", choices=EARLY_STOP_RULES, default="exact",
                       help="not in the paper: when a sentence's beam search ends. exact (default): "
                            "when no live beam can still win; current: when none would win by "
                            "ending at the next step (sooner with alpha > 0, as fairseq and "
                            "CTranslate2 stop; may miss a longer winner)")


def add_precision_argument(group) -> None:
    """`--precision`, shared by translate, parse and serve (read it with `decode_precision`)."""
    group.add_argument("--precision", choices=DECODE_PRECISIONS, default=None,
                       help="decoding arithmetic: fp32 (default, as trained: the paper's), bf16 "
                            "(weights cast once; scores stay float32), int8 (int8 weights, "
                            "activations quantized per row at run time, as CTranslate2's int8; x86 "
                            "CPUs with AVX2, Transformer models), auto (the fastest measured on "
                            "this kind of machine: bf16 on a GPU or a CPU with native bf16, else "
                            "fp32)")


def add_search_arguments(p: argparse.ArgumentParser) -> None:
    """Search, batching and hardware options, shared by `aiayn translate` and `aiayn parse`."""
    s = p.add_argument_group("search (defaults: the model config's, the paper's)")
    s.add_argument("--beam", type=int, metavar="K", help="beam size (config default 4)")
    s.add_argument("--alpha", type=float, help="length penalty exponent (config default 0.6)")
    s.add_argument("--max-len-a", type=float, metavar="A",
                   help="maximum output length = A * source length + B (config default A=1)")
    s.add_argument("--max-len-b", type=int, metavar="B", help="(config default B=50)")
    s.add_argument("--min-len", type=int, default=0, metavar="N",
                   help="not in the paper: no EOS before output length N, EOS counted (default 0: off)")
    add_early_stop_argument(s)
    s.add_argument("--greedy", action="store_true", help="greedy search instead of beam search")
    s.add_argument("--nbest", type=int, metavar="N",
                   help="write the N best hypotheses per line as index<TAB>score<TAB>text")
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
    b = p.add_argument_group("batching and hardware")
    g = b.add_mutually_exclusive_group()
    g.add_argument("--batch-tokens", type=int, default=4000, metavar="T",
                   help="sentences x longest source per batch (default 4000)")
    g.add_argument("--batch-size", type=int, metavar="N", help="sentences per batch instead")
    b.add_argument("--max-src-tokens", type=int, default=1024, metavar="N",
                   help="truncate longer sources, with a warning (default 1024, EOS included)")
    b.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, ...")
    add_precision_argument(b)
    b.add_argument("--bf16", action="store_true", help="the same as --precision bf16")


def torch_device(name: str):
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"unknown device {name!r}; use cpu or cuda[:N]") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine")
    return device


def decode_precision(args: argparse.Namespace, device) -> str:
    """The `--precision` (or `--bf16`) of `add_search_arguments`, checked for `device`; a
    UserError for a contradiction or int8 where it cannot run."""
    from aiayn.decoding.precision import resolve

    bf16 = getattr(args, "bf16", False)  # serve has no --bf16
    if bf16 and args.precision not in (None, "bf16"):
        raise UserError(f"--bf16 means --precision bf16; drop one of --bf16 and --precision "
                        f"{args.precision}")
    try:
        return resolve("bf16" if bf16 else (args.precision or "fp32"), device)
    except ValueError as e:
        raise UserError(f"--precision: {e}") from None


def read_input(path: str | None) -> list[str]:
    from aiayn.data.corpus import decode_utf8, read_lines, split_lines

    if path is None or path == "-":
        return split_lines(decode_utf8(sys.stdin.buffer.read(), "<stdin>"))
    return read_lines(path)


def search_options(args: argparse.Namespace) -> dict:
    """Translator keyword arguments from `add_search_arguments`' options."""
    if args.max_src_tokens < 2:
        raise UserError(f"--max-src-tokens must be >= 2 (one piece and EOS), got {args.max_src_tokens}")
    return dict(greedy=args.greedy, beam_size=args.beam, alpha=args.alpha,
                max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=args.min_len,
                nbest=args.nbest or 1, early_stop=args.early_stop,
                # --batch-size replaces the token budget rather than adding to it
                batch_tokens=sys.maxsize if args.batch_size else args.batch_tokens,
                batch_size=args.batch_size)


def _interactive(translator, nbest: int | None, align: tuple[str, dict] | None = None) -> int:
    print("Type a sentence and press Enter to translate it; Ctrl-D ends.", file=sys.stderr)
    n = 0
    while True:
        sys.stderr.write("> ")
        sys.stderr.flush()
        raw = sys.stdin.buffer.readline()
        if not raw:
            sys.stderr.write("\n")
            return 0
        n += 1
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            print(f"error: line {n}: invalid UTF-8, skipped", file=sys.stderr)
            continue
        _write_results(sys.stdout, translator, [line], nbest, False, first_line=n, align=align)
        sys.stdout.flush()


def _write_results(out, translator, lines: list[str], nbest: int | None, progress: bool,
                   first_line: int = 1, align: tuple[str, dict] | None = None) -> None:
    from aiayn.decoding.translate import format_nbest

    if align:
        mode, kwargs = align
        for a in translator.align(lines, progress=progress, first_line=first_line, **kwargs):
            out.write(f"{a.translation} ||| {a.format(mode)}\n")
    elif nbest:
        for i, entries in enumerate(translator.translate_nbest(lines, nbest, progress, first_line)):
            for row in format_nbest(first_line - 1 + i, entries):
                out.write(row + "\n")
    else:
        for text in translator.translate(lines, progress, first_line):
            out.write(text + "\n")


def _alignment_options(args: argparse.Namespace, cfg) -> tuple[str, dict] | None:
    """The output mode and `Translator.align`'s keywords (0-based layer and head), or None."""
    if not args.alignment:
        return None
    from aiayn.commands.attention import one_based

    head = args.alignment_head
    return args.alignment, {
        "unit": args.alignment_unit,
        "layer": one_based(args.alignment_layer, cfg.n_layers, "--alignment-layer", "layer"),
        "head": None if head is None else one_based(head, cfg.n_heads, "--alignment-head", "head")}


def main(args: argparse.Namespace) -> int:
    import contextlib

    from aiayn.io import exclusive_lock

    with contextlib.ExitStack() as stack:
        if args.output is not None:  # one translate at a time into a file
            stack.enter_context(exclusive_lock(args.output, "aiayn translate",
                                               "wait for it to finish, or choose another --output"))
        return _translate(args)


def _translate(args: argparse.Namespace) -> int:
    from aiayn.io import atomic_write, check_writable

    options = search_options(args)
    if args.alignment and args.nbest:
        raise UserError("--alignment prints the best translation's alignment; drop --nbest")
    if args.alignment and len(args.model) > 1:
        raise UserError("--alignment reads one model's attention; give one --model")
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    if interactive and args.input is not None:
        raise UserError("--interactive reads the terminal; drop --input")
    if interactive and args.output is not None:
        raise UserError("--interactive writes to the terminal; drop --output")
    from aiayn.decoding.ensemble import load_models
    from aiayn.decoding.translate import SearchOptions, Translator
    from aiayn.model.io import read_config

    # Every check that needs no model weights comes before the slow work.
    try:
        SearchOptions(**options).validate(read_config(args.model[0]))
    except ValueError as e:
        raise UserError(str(e)) from None
    align = _alignment_options(args, read_config(args.model[0]))
    if args.output is not None:
        check_writable(args.output, args.overwrite)
    device = torch_device(args.device)
    precision = decode_precision(args, device)
    lines = None if interactive else read_input(args.input)

    loaded = load_models(args.model, device)
    try:
        translator = Translator(loaded, precision=precision, max_src_tokens=args.max_src_tokens,
                                warn=lambda m: print(f"aiayn translate: warning: {m}", file=sys.stderr),
                                **options)
    except ValueError as e:
        raise UserError(str(e)) from None
    if interactive:
        return _interactive(translator, args.nbest, align)
    progress = args.progress or sys.stderr.isatty()
    if args.output is None:
        _write_results(sys.stdout, translator, lines, args.nbest, progress, align=align)
        sys.stdout.flush()
    else:
        with atomic_write(args.output, "w") as f:
            _write_results(f, translator, lines, args.nbest, progress, align=align)
    return 0
