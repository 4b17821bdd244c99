"""`aiayn score`: how probable a model finds given translations, one line per pair (what fairseq's
--score-reference, OpenNMT's -tgt and marian-scorer print).

For each source and reference line: the reference's log-probability given the source, summed
over its target tokens (natural log, EOS counted, teacher-forced: the model reads the reference,
not its own output), the number of those tokens, and the per-token mean. These are the figures
of `aiayn evaluate --model`'s perplexity, sentence by sentence (one computation,
aiayn/evaluation/perplexity.py): exp(-sum of logprob / sum of tokens) over a file is that
perplexity. `--nbest FILE` rescores `aiayn translate --nbest`'s output (index<TAB>score<TAB>text
lines) against `--src`: each hypothesis gets the same three figures, after its own columns.

Output, one line per input line (`--format jsonl`, the default):
    {"line": 0, "logprob": -4.21, "tokens": 7, "mean": -0.60}
or with `--format tsv`: logprob<TAB>tokens<TAB>mean (n-best: index<TAB>score<TAB>text<TAB>
logprob<TAB>tokens<TAB>mean). The input is read and scored a chunk of lines at a time, so a file
of any length is scored in bounded memory.

Refused in one line naming the file and line: an n-best line that is not index<TAB>score<TAB>text
with a numeric score (whatever --format), and a source or a text to score longer than the
model's positions, tokens with EOS against its config's max_positions (1024 by default): the
table of learned positions, and for sinusoidal ones the bound the model is configured for
rather than lengths it never saw in training. Nothing is scored beyond it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from typing import IO, Iterator

from aiayn.checks import reading
from aiayn.commands.common import (
    add_device_argument,
    add_precision_argument,
    check_train_precision,
    set_examples,
    torch_device,
)
from aiayn.errors import UserError
from aiayn.files import atomic_write, check_writable
from aiayn.locks import exclusive_lock

CHUNK = 10_000  # lines read, sorted by length and scored at a time


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn score --model runs/m30k/model --src test.en --ref test.de",
                 "aiayn score --model M --src test.en --ref test.de --format tsv --output scores.tsv",
                 "aiayn translate --model M --input test.en --nbest 4 --output nbest.txt && "
                 "aiayn score --model M --src test.en --nbest nbest.txt",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", required=True, metavar="DIR", help="model directory (from train/average)")
    p.add_argument("--src", required=True, metavar="FILE", help="source sentences, one a line")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--ref", metavar="FILE", help="translations to score, line-aligned with --src")
    what.add_argument("--nbest", metavar="FILE",
                      help="aiayn translate --nbest output to rescore: index<TAB>score<TAB>text, "
                           "index the 0-based line of --src")
    p.add_argument("--format", choices=["jsonl", "tsv"], default="jsonl",
                   help="jsonl (default): one JSON object a line; tsv: tab-separated columns")
    p.add_argument("--output", "-o", metavar="FILE", help="where to write (default: stdout)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    p.add_argument("--batch-tokens", type=int, default=4000, metavar="T",
                   help="tokens per side in one batch (default 4000)")
    add_device_argument(p)
    add_precision_argument(p)


def _lines(path: str) -> Iterator[str]:
    """The lines of a UTF-8 file, streamed (no newline); a bad byte is one line naming it."""
    with reading(path), open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{n}: not UTF-8 text (byte {e.start})") from None


# (0-based source line, source, text to score, the input line's own columns, where the text is:
# FILE:LINE)
Row = tuple[int, str, str, list[str], str]


def _nbest_columns(row: str, where: str) -> list[str]:
    """An n-best line's three columns, index<TAB>score<TAB>text, checked: the index a line
    number, the score a finite number (what `aiayn translate --nbest` writes)."""
    cols = row.split("\t")
    if len(cols) != 3 or not cols[0].isdigit():
        raise UserError(f"{where}: expected index<TAB>score<TAB>text (aiayn translate --nbest's "
                        f"lines)")
    try:
        score = float(cols[1])
    except ValueError:
        score = math.nan
    if not math.isfinite(score):
        raise UserError(f"{where}: the score column, {cols[1][:40]!r}, is not a number (expected "
                        f"index<TAB>score<TAB>text, aiayn translate --nbest's lines)")
    return cols


def _chunks(args: argparse.Namespace) -> Iterator[list[Row]]:
    """The rows to score (`Row`), CHUNK at a time."""
    chunk: list[Row] = []
    if args.ref is not None:
        n_src = 0
        srcs = _lines(args.src)
        for k, ref in enumerate(_lines(args.ref)):
            src = next(srcs, None)
            if src is None:
                raise UserError(f"{args.src} has {k} lines but {args.ref} has more; sources and "
                                f"references must be line-aligned")
            n_src = k + 1
            chunk.append((k, src, ref, [], f"{args.ref}:{k + 1}"))
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
        if next(srcs, None) is not None:
            raise UserError(f"{args.src} has more lines than {args.ref} ({n_src}); sources and "
                            f"references must be line-aligned")
    else:
        sources = list(_lines(args.src))  # n-best lines point anywhere into it
        for n, row in enumerate(_lines(args.nbest), 1):
            cols = _nbest_columns(row, f"{args.nbest}:{n}")
            i = int(cols[0])
            if i >= len(sources):
                raise UserError(f"{args.nbest}:{n}: index {i}, but {args.src} has {len(sources)} lines")
            chunk.append((i, sources[i], cols[2], cols, f"{args.nbest}:{n}"))
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _check_lengths(rows: list[Row], pairs: list[tuple[list[int], list[int]]], src_path: str,
                   limit: int) -> None:
    """Refuse, in one line naming the file and line, a source or a text to score with more
    positions than the model has (pieces + EOS on the source side, BOS + pieces on the target's)."""
    for (i, _, _, _, where), (s, t) in zip(rows, pairs):
        for what, ids in ((f"{src_path}:{i + 1}", s), (where, t)):
            if len(ids) + 1 > limit:
                raise UserError(f"{what}: {len(ids) + 1} tokens with EOS, more than the {limit} "
                                f"positions this model takes (its config's max_positions)")


def _write(out: IO[str], rows: list[Row], scores, fmt: str) -> None:
    for (i, _, _, cols, _), nll, n in zip(rows, scores.nll, scores.tokens):
        logprob = -nll
        if fmt == "tsv":
            out.write("\t".join([*cols, f"{logprob:.6f}", str(n), f"{logprob / n:.6f}"]) + "\n")
        else:
            item = {"line": i, "logprob": round(logprob, 6), "tokens": n, "mean": round(logprob / n, 6)}
            if cols:
                item.update(search_score=float(cols[1]), text=cols[2])
            out.write(json.dumps(item, ensure_ascii=False) + "\n")


def main(args: argparse.Namespace) -> int:
    # these load torch (a second here): imported here so that --help and a mistyped option answer at once
    from aiayn.data.model_dir import load_model
    from aiayn.evaluation.perplexity import score_ids
    from aiayn.training.precision import Precision

    check_train_precision(args, "score")
    if args.batch_tokens < 1:
        raise UserError(f"--batch-tokens must be >= 1, got {args.batch_tokens}")
    device = torch_device(args.device)
    autocast = Precision(args.precision, device).autocast
    with contextlib.ExitStack() as stack:
        if args.output is not None:
            stack.enter_context(exclusive_lock(args.output, "aiayn score",
                                               "wait for it to finish, or choose another --output"))
            check_writable(args.output, args.overwrite)
        loaded = load_model(args.model, device)
        src_tok, tgt_tok = loaded.src_tokenizer, loaded.tgt_tokenizer
        out = (stack.enter_context(atomic_write(args.output)) if args.output is not None
               else sys.stdout)
        for rows in _chunks(args):
            pairs = list(zip(src_tok.encode_batch([r[1] for r in rows]),
                             tgt_tok.encode_batch([r[2] for r in rows])))
            _check_lengths(rows, pairs, args.src, loaded.cfg.max_positions)
            _write(out, rows, score_ids(loaded.model, pairs, args.batch_tokens, autocast), args.format)
            out.flush()
    return 0
