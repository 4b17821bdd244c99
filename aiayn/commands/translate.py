"""`aiayn translate`: translate text with a model directory (beam search, §6.1).

    aiayn translate --model runs/base/model --input test.en --output test.hyp.de
    aiayn translate --model runs/base/model < test.en > test.hyp.de
    aiayn translate --model runs/base/model            # at a terminal: interactive

Reads UTF-8 lines (a file, which may be gzipped, or stdin) and writes exactly one line of
detokenized text per input line, in input order (a blank input line, empty or whitespace only,
gives an empty output line). Input is read and output written as it goes, in groups of up to
`STREAM_LINES` lines (sorted by length for batching within a group), so a file of any length
translates in the same memory; from a pipe a group ends when no more input is ready, and each
group's translations are written and flushed at once: a program that sends a line and waits
gets its translation. `--output` is written atomically, never replaces an existing file
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

With `--format jsonl` each input line gives one JSON object on one line instead, with the
search's confidence: `{"index", "src", "tgt", "score", "logprob", "token_probs"}`, score the
length-normalised score the beam ranked by, logprob the sentence log-probability (the sum of the
per-token log-probabilities, EOS's included) and token_probs the probability of every output
piece, EOS's last (`aiayn.decoding.translate.confidence`); with `--nbest N` also "nbest", the
list of `{"tgt", "score", "logprob", "token_probs"}` best first, and with `--alignment` also
"alignment", the line `--alignment` prints after `|||`.

With `--documents` each input line is a paragraph: it is split into sentences (sentencex, by the
rules of `--sentence-language`), every sentence of a group of lines is translated in one search,
and each output line is its paragraph's translations joined by spaces (a blank line stays blank);
a sentence longer than the model takes is cut into parts between words, never truncated.
Details: aiayn/decoding/documents.py.

With `--glossary FILE` (not in the paper) the translation of a line that contains a glossary's
source term holds its target term: the file has one `source term<TAB>target term` a line (UTF-8;
blank lines and lines starting with `#` skipped), a term matches whole words, case-sensitive, and
the search is lexically constrained (aiayn/decoding/constraints.py); a line with no term is
searched as without it. It is read, and a malformed line refused naming the file and line, before
the model is; a line whose terms take more target pieces than its maximum output length is one
line naming it. It holds in every output but `--alignment`'s (refused). With `--documents` each
sentence gets the terms of its own text.

At a terminal (stdin and stdout), interactive mode shows each translation as it settles: the
words the search is sure its best translation starts with, written as they grow and then
replaced by the full translation (plain text only; with `--nbest`, `--format jsonl`,
`--alignment`, `--documents`, or stdout not a terminal, only the final lines are written).

Search defaults come from the model's config (the paper's: beam 4, alpha 0.6, maximum output
length = source length + 50, both lengths counting EOS). Inputs longer than the model can take
(`--max-src-tokens`, and `max_positions` for learned positions) are truncated, with a warning on
stderr naming the line.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from aiayn.commands.common import (
    STREAM_LINES,
    add_alignment_arguments,
    add_search_arguments,
    check_precision,
    input_groups,
    one_based,
    search_settings,
    set_examples,
    translator_from_args,
)
from aiayn.decoding import DECODE_PRECISIONS
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.decoding.glossary import Glossary
    from aiayn.decoding.translate import Translator


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn translate --model runs/m30k/model --input test.en --output test.hyp.de",
                 "aiayn translate --model runs/m30k/model --input test.en --nbest 4",
                 "aiayn translate --model runs/m30k/model --input test.en --alignment hard",
                 "aiayn translate --model runs/m30k/model --input test.en --glossary terms.tsv",
                 "echo 'A man rides a bike.' | aiayn translate --model runs/m30k/model",
                 "aiayn translate --model runs/m30k/model        # at a terminal: interactive")
    p.add_argument("--model", required=True, nargs="+", metavar="DIR",
                   help="model directory (from train/average); several: their ensemble, the mean "
                        "of their next-token probabilities (not in the paper; "
                        "aiayn/decoding/ensemble.py)")
    p.add_argument("--input", "-i", metavar="FILE", help="UTF-8 text, one sentence a line (default: stdin)")
    p.add_argument("--output", "-o", metavar="FILE", help="where to write (default: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    add_search_arguments(p)
    add_alignment_arguments(p)
    p.add_argument("--format", choices=["text", "jsonl"], default="text",
                   help="text: translations (or n-best rows, or alignments) as lines (default); "
                        "jsonl: one JSON object per input line, with the sentence's score, "
                        "log-probability and per-piece probabilities")
    p.add_argument("--glossary", metavar="FILE",
                   help="fix the translation of terms (not in the paper): UTF-8 lines 'source "
                        "term<TAB>target term'; a line holding a source term (whole words, "
                        "case-sensitive) gets a translation holding its target term, by "
                        "lexically constrained beam search; lines without one translate as "
                        "without it (docs/guides/decoding.md)")
    d = p.add_argument_group("documents")
    d.add_argument("--documents", action="store_true",
                   help="each input line is a paragraph: split it into sentences, translate them "
                        "all, and write each paragraph's translation on its line")
    d.add_argument("--sentence-language", metavar="CODE",
                   help="the ISO 639 code whose rules split --documents into sentences (default: "
                        "the model's source language when its directory records one, else en)")
    o = p.add_argument_group("interaction")
    o.add_argument("--interactive", action="store_true",
                   help="prompt and translate each line as it is typed (the default when stdin "
                        "is a terminal and there is no --input); at a terminal each translation "
                        "is shown as it settles")
    o.add_argument("--progress", action="store_true",
                   help="show progress on stderr: a bar at a terminal (the default there), a "
                        "line every 30 seconds in a log")


def _interactive(translator, nbest: int | None, align: tuple[str, dict] | None = None,
                 fmt: str = "text", documents: str | None = None,
                 glossary: Glossary | None = None) -> int:
    """Prompt on stderr and translate each line read from stdin; a line that cannot be read or
    whose glossary terms cannot fit is one line on stderr and skipped. With plain text out to a
    terminal each translation is shown as it settles (`show_settling`)."""
    import shutil

    print("Type a sentence and press Enter to translate it; Ctrl-D ends.", file=sys.stderr)
    settling = (nbest is None and align is None and fmt == "text" and documents is None
                and sys.stdout.isatty())
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
        try:
            if settling:
                show_settling(sys.stdout, translator, line, glossary, n,
                              shutil.get_terminal_size().columns)
            else:
                _write_results(sys.stdout, translator, [line], nbest, False, first_line=n,
                               align=align, fmt=fmt, documents=documents, glossary=glossary)
        except UserError as e:  # a line whose glossary terms cannot fit
            print(f"error: {e}; skipped", file=sys.stderr)
        sys.stdout.flush()


# At a terminal: back to the line's start and clear it, so a longer text replaces a shorter one
CLEAR_LINE = "\r\x1b[K"


def show_settling(out, translator: Translator, line: str, glossary: Glossary | None = None,
                  first_line: int = 1, width: int = 80) -> None:
    """Write one line's translation to the terminal `out` as it settles (`translate_settling`),
    each text over the last (`CLEAR_LINE`, cut to its last `width - 1` characters so that it
    stays on one row), then the full translation and a newline."""
    shown = ""

    def show(pieces: list[int]) -> None:
        nonlocal shown
        text = translator.detokenize(pieces)
        if text != shown:
            shown = text
            room = max(width - 1, 2)
            out.write(CLEAR_LINE + (text if len(text) <= room else "…" + text[1 - room:]))
            out.flush()

    from aiayn.decoding.translate import translate_settling

    hyps = translate_settling(translator, line, show, glossary, first_line)
    final = translator.detokenize(hyps[0].tokens) if hyps else ""
    out.write((CLEAR_LINE if shown else "") + final + "\n")


def _write_results(out, translator, lines: list[str], nbest: int | None, progress: bool,
                   first_line: int = 1, align: tuple[str, dict] | None = None,
                   fmt: str = "text", documents: str | None = None,
                   glossary: Glossary | None = None) -> None:
    """`documents`: the sentence language of `--documents` (each line a paragraph), else None;
    `glossary`: `--glossary`'s (never with `align`)."""
    from aiayn.decoding.translate import format_nbest

    if documents is not None:
        from aiayn.decoding.documents import translate_paragraphs

        for text in translate_paragraphs(translator, lines, documents, progress, glossary,
                                         first_line):
            out.write(text + "\n")
        return
    if fmt == "jsonl":
        if align:
            mode, kwargs = align
            found = translator.align_hypotheses(lines, progress=progress, first_line=first_line,
                                                **kwargs)
            for i, (line, (a, hyp)) in enumerate(zip(lines, found)):
                out.write(jsonl_record(translator, first_line - 1 + i, line,
                                       [hyp] if hyp is not None else [], None,
                                       a.format(mode)) + "\n")
            return
        found = translator.hypotheses(lines, nbest or 1, progress, first_line,
                                      glossary=glossary)
        for i, (line, hyps) in enumerate(zip(lines, found)):
            out.write(jsonl_record(translator, first_line - 1 + i, line, hyps, nbest) + "\n")
        return
    if align:
        mode, kwargs = align
        for a in translator.align(lines, progress=progress, first_line=first_line, **kwargs):
            out.write(f"{a.translation} ||| {a.format(mode)}\n")
    elif nbest:
        for i, entries in enumerate(translator.translate_nbest(lines, nbest, progress, first_line,
                                                                glossary=glossary)):
            for row in format_nbest(first_line - 1 + i, entries):
                out.write(row + "\n")
    else:
        for text in translator.translate(lines, progress, first_line, glossary=glossary):
            out.write(text + "\n")


def _alignment_options(args: argparse.Namespace, cfg) -> tuple[str, dict] | None:
    """The output mode and `Translator.align`'s keywords (0-based layer and head), or None."""
    if not args.alignment:
        return None
    head = args.alignment_head
    return args.alignment, {
        "unit": args.alignment_unit,
        "layer": one_based(args.alignment_layer, cfg.n_layers, "--alignment-layer", "layer"),
        "head": None if head is None else one_based(head, cfg.n_heads, "--alignment-head", "head")}


def main(args: argparse.Namespace) -> int:
    import contextlib

    from aiayn.locks import exclusive_lock

    with contextlib.ExitStack() as stack:
        if args.output is not None:  # one translate at a time into a file
            stack.enter_context(exclusive_lock(args.output, "aiayn translate",
                                               "wait for it to finish, or choose another --output"))
        return _translate(args)


def _translate(args: argparse.Namespace) -> int:
    from aiayn.files import atomic_write, check_writable

    check_precision(args, DECODE_PRECISIONS, "translate")  # before reading any model
    if args.alignment and args.nbest:
        raise UserError("--alignment prints the best translation's alignment; drop --nbest")
    if args.documents and (args.alignment or args.nbest or args.format != "text"):
        raise UserError("--documents writes one translated paragraph per line; drop --alignment, "
                        "--nbest and --format jsonl")
    if args.sentence_language is not None and not args.documents:
        raise UserError("--sentence-language splits --documents into sentences; add --documents")
    if args.alignment and len(args.model) > 1:
        raise UserError("--alignment reads one model's attention; give one --model")
    if args.glossary is not None and args.alignment:
        raise UserError("--glossary does not combine with --alignment; drop one of them")
    interactive = args.interactive or (args.input is None and sys.stdin.isatty())
    if interactive and args.input is not None:
        raise UserError("--interactive reads the terminal; drop --input")
    if interactive and args.output is not None:
        raise UserError("--interactive writes to the terminal; drop --output")
    from aiayn.data.model_dir import read_config
    from aiayn.decoding.glossary import read_glossary

    # Every check that needs no model weights comes before the slow work.
    glossary = None if args.glossary is None else read_glossary(args.glossary)
    cfg = read_config(args.model[0])
    settings = search_settings(args, cfg)
    align = _alignment_options(args, cfg)
    if args.output is not None:
        check_writable(args.output, args.overwrite)
    groups = None if interactive else input_groups(args.input, STREAM_LINES)

    translator = translator_from_args(args, "translate", settings)
    documents = None
    if args.documents:
        from aiayn.decoding.documents import DEFAULT_LANGUAGE

        meta = getattr(translator.loaded, "meta", None) or {}
        documents = args.sentence_language or meta.get("src_lang") or DEFAULT_LANGUAGE
    if interactive:
        return _interactive(translator, args.nbest, align, args.format, documents, glossary)
    progress = args.progress or sys.stderr.isatty()
    if args.output is None:
        _stream(sys.stdout, translator, groups, args.nbest, progress, align, args.format,
                documents, glossary)
    else:
        with atomic_write(args.output, "w") as f:
            _stream(f, translator, groups, args.nbest, progress, align, args.format, documents,
                    glossary)
    return 0


def jsonl_record(translator, index: int, line: str, hyps: list, nbest: int | None,
                 alignment: str | None = None) -> str:
    """`--format jsonl`'s line for input line `index` (0-based): the best hypothesis's text and
    confidence (`confidence`), the n-best list when `nbest`, the alignment when given."""
    import json

    from aiayn.decoding.translate import confidence

    entries = [{"tgt": translator.detokenize(h.tokens), **confidence(h)} for h in hyps]
    best = entries[0] if entries else {"tgt": "", "score": None, "logprob": None,
                                        "token_probs": []}
    record = {"index": index, "src": line, **best}
    if nbest:
        record["nbest"] = entries
    if alignment is not None:
        record["alignment"] = alignment
    return json.dumps(record, ensure_ascii=False)


def _stream(out, translator, groups, nbest: int | None, progress: bool,
            align: tuple[str, dict] | None, fmt: str = "text", documents: str | None = None,
            glossary: Glossary | None = None) -> None:
    """Translate the input as it comes and write each line's result as soon as it and every line
    before it are done (flushed: a reader at the other end of a pipe sees them at once), through
    one decoding engine for the whole input (`Translator.stream`). Alignments are made a group
    of lines at a time (`Translator.align`), and so are documents (their sentences searched
    together, `aiayn.decoding.documents`). `glossary`: every line's phrases (not with `align`)."""
    from aiayn.decoding.translate import format_nbest
    from aiayn.progress import Progress

    with Progress(None, desc="translating", unit="sent", enabled=progress) as bar:
        if align or documents is not None:
            first = 1
            for lines in groups:
                _write_results(out, translator, lines, nbest, False, first_line=first, align=align,
                               fmt=fmt, documents=documents, glossary=glossary)
                out.flush()
                first += len(lines)
                bar.update(len(lines))
            return
        # the lines read and not yet written (`--format jsonl`), filled by the reading thread
        sources: dict[int, str] = {}

        def kept(groups):
            start = 0
            for lines in groups:
                sources.update(enumerate(lines, start))
                start += len(lines)
                yield lines

        if fmt == "jsonl":
            groups = kept(groups)
        for ready in translator.stream(groups, nbest or 1, glossary=glossary):
            for index, hyps in ready:
                if fmt == "jsonl":
                    out.write(jsonl_record(translator, index, sources.pop(index), hyps, nbest)
                              + "\n")
                elif nbest:
                    entries = [(h.score, translator.detokenize(h.tokens)) for h in hyps]
                    for row in format_nbest(index, entries):
                        out.write(row + "\n")
                else:
                    out.write((translator.detokenize(hyps[0].tokens) if hyps else "") + "\n")
            out.flush()
            bar.update(len(ready))
