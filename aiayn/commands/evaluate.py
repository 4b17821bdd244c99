"""`aiayn evaluate`: score a translation file against a reference, three ways, side by side.

- sacreBLEU on detokenized text (13a tokenization), with its signature: today's reporting standard;
- chrF, with its signature;
- tokenized BLEU: the paper's convention (Moses-tokenized, mixed case, German hyphenated
  compounds split as tensor2tensor does), or with `--lowercase` the Multi30k convention
  (lowercased, punctuation-normalised, Moses-tokenized, no compound splitting);
- with `--model M --src S`: the per-token perplexity of the references under the model
  (teacher-forced, per target subword including EOS, as the paper's Table 3 reports it).

The target language (Moses tokenization; German compounds are split for de only) is --lang, or
else --model's (its meta.json), or else that of the dataset the --ref file lies in (aiayn prepare
writes test.tgt.txt beside manifest.json); otherwise the command asks for --lang rather than
apply one language's rules to another.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from aiayn.commands.common import (
    add_device_argument,
    add_precision_argument,
    check_train_precision,
    refuse_unused,
    set_examples,
    torch_device,
)
from aiayn.errors import UserError
from aiayn.evaluation.bleu import BleuResult
from aiayn.evaluation.sacre import chrf, sacre_bleu
from aiayn.evaluation.tokenized import tokenized_bleu


def add_arguments(parser: argparse.ArgumentParser) -> None:
    set_examples(parser, "aiayn evaluate --hyp test.hyp.de --ref data/m30k/test.tgt.txt",
                 "aiayn evaluate --hyp test.hyp.de --ref test.de --lang de --lowercase --json",
                 "aiayn evaluate --ref data/m30k/test.tgt.txt --src data/m30k/test.src.txt "
                 "--model runs/m30k/model",
                 about=__doc__.split("\n", 1)[1])
    parser.add_argument("--hyp", metavar="H",
                        help="hypotheses, detokenized UTF-8 text, one sentence a line ('-' = stdin)")
    parser.add_argument("--ref", required=True, metavar="R",
                        help="references, detokenized UTF-8 text, one sentence a line")
    parser.add_argument("--lang",
                        help="target language, for Moses tokenization; compounds are split for "
                             "'de' only (default: --model's, or that of the dataset --ref lies "
                             "in; else required)")
    parser.add_argument("--lowercase", action="store_true",
                        help="case-insensitive scores; tokenized BLEU then follows the Multi30k "
                             "convention (lowercased, punctuation-normalised, no compound split)")
    parser.add_argument("--model", metavar="M", help="a model directory: also report the references' "
                        "per-token perplexity under it (needs --src)")
    parser.add_argument("--src", metavar="S", help="the source sentences of the references, for --model")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    h = parser.add_argument_group("hardware (with --model)")
    add_device_argument(h)
    add_precision_argument(h)  # teacher-forced, as training's dev figures: autocast


def target_language(args: argparse.Namespace) -> str:
    """--lang, else the model's target language, else that of the prepared dataset --ref lies in
    (test.src.txt is its source side); a UserError asking for --lang when none of them says."""
    # these load numpy and torch: imported here so that --help and a mistyped option answer at once
    from aiayn.data.dataset import read_manifest
    from aiayn.data.model_dir import read_meta

    if args.lang:
        return args.lang
    if args.model is not None:
        lang = read_meta(args.model).get("tgt_lang")
        if lang:
            return lang
    if args.ref != "-" and (Path(args.ref).parent / "manifest.json").is_file():
        manifest = read_manifest(Path(args.ref).parent)
        side = "src_lang" if Path(args.ref).name.endswith(".src.txt") else "tgt_lang"
        if manifest.get(side):
            return manifest[side]
    raise UserError("--lang: the target language is not known (no --model with one, and --ref is "
                    "not in a prepared dataset); pass it, e.g. --lang de")


def _read_lines(path: str) -> list[str]:
    """Lines of a text file (or '-' for stdin), errors as one line naming file and line."""
    from aiayn.data.corpus import decode_utf8, read_lines, split_lines  # loads numpy: see cli.py

    if path == "-":
        return split_lines(decode_utf8(sys.stdin.buffer.read(), "<stdin>"))
    return read_lines(path)


# A line of `aiayn translate --nbest`: index<TAB>score<TAB>text (aiayn/decoding/translate.py,
# `format_nbest`: the score with six decimals)
_NBEST_LINE = re.compile(r"(0|[1-9][0-9]*)\t-?[0-9]+\.[0-9]{6}\t")


def is_nbest(lines: list[str]) -> bool:
    """Whether `lines` are an n-best list as `aiayn translate --nbest` writes it: every line
    index<TAB>score<TAB>text, the indices starting at 0 and never falling. A translation file
    almost never looks so: its lines would all have to begin with those two columns."""
    last = 0
    for line in lines:
        m = _NBEST_LINE.match(line)
        if m is None or int(m.group(1)) < last:
            return False
        last = int(m.group(1))
    return bool(lines) and lines[0].startswith("0\t")


def _style(lang: str, lowercase: bool) -> tuple[str, dict]:
    """(description, tokenized_bleu keyword arguments) of the tokenized BLEU the flags select."""
    if lowercase:
        return ("Multi30k style: lowercased, punctuation-normalised, Moses-tokenized, "
                "no compound splitting",
                dict(lowercase=True, normalize_punct=True, split_compounds=False))
    split = lang == "de"
    return (f"paper style: Moses-tokenized, mixed case, "
            f"{'German compounds split (##AT##)' if split else 'no compound splitting'}",
            dict(lowercase=False, normalize_punct=False, split_compounds=split))


def score(hyps: list[str], refs: list[str], lang: str, lowercase: bool = False) -> dict:
    """All three scores as one JSON-ready dict (what `--json` prints, less the file names)."""
    description, kwargs = _style(lang, lowercase)
    tok = tokenized_bleu(hyps, refs, lang=lang, **kwargs)
    ch = chrf(hyps, refs, lowercase=lowercase)
    return {
        "lines": len(hyps),
        "sacrebleu": dataclasses.asdict(sacre_bleu(hyps, refs, lowercase=lowercase)),
        "chrf": dataclasses.asdict(ch),
        "tokenized_bleu": {**dataclasses.asdict(tok), "style": description},
    }


def format_table(result: dict) -> str:
    """The scores as a small aligned table, then the signatures that make them reproducible."""
    sb = BleuResult(**result["sacrebleu"])
    tb = BleuResult(**{k: v for k, v in result["tokenized_bleu"].items() if k != "style"})
    ch = result["chrf"]
    rows = [
        ("sacreBLEU", sb.score, sb.summary()),
        (ch["name"], ch["score"], ""),
        ("tokenized BLEU", tb.score, tb.summary()),
    ]
    width = max(len(r[0]) for r in rows)
    out = [f"{'metric':<{width}}  {'score':>6}  details"]
    out += [f"{name:<{width}}  {value:6.2f}  {details}".rstrip() for name, value, details in rows]
    out.append(f"tokenized BLEU is {result['tokenized_bleu']['style']}")
    out.append("signatures:")
    for name, sig in [("sacreBLEU", sb.signature), (ch["name"], ch["signature"]),
                      ("tokenized BLEU", tb.signature)]:
        out.append(f"  {name:<{width}}  {sig}")
    return "\n".join(out)


def main(args: argparse.Namespace) -> int:
    if args.hyp is None and args.model is None:
        raise UserError("give --hyp (translations to score) and/or --model with --src (perplexity)")
    if (args.model is None) != (args.src is None):
        raise UserError("--model and --src go together: perplexity of --ref given --src under --model")
    if args.model is None:
        refuse_unused(args, ["device", "precision"], "these run --model's perplexity; give --model "
                                                      "and --src, or drop them")
    else:
        check_train_precision(args, "evaluate")
    if args.hyp is None:
        refuse_unused(args, ["lang", "lowercase"], "these set how --hyp is scored; give --hyp")
    lang = target_language(args) if args.hyp is not None else None
    refs = _read_lines(args.ref)
    out: dict = {"ref": args.ref}
    if args.hyp is not None:
        hyps = _read_lines(args.hyp)
        hyp_name = "<stdin>" if args.hyp == "-" else args.hyp
        if is_nbest(hyps):
            raise UserError(f"{hyp_name} is an n-best list (index<TAB>score<TAB>text lines, from "
                            f"aiayn translate --nbest), not one translation a line: pass the 1-best "
                            f"(aiayn translate without --nbest), or rescore it with aiayn score "
                            f"--nbest")
        if len(hyps) != len(refs):
            raise UserError(f"{hyp_name} has {len(hyps)} lines but {args.ref} has {len(refs)}; "
                            f"hypotheses and references must be line-aligned")
        out.update({"hyp": hyp_name, "lines": len(hyps), "lang": lang},
                   **score(hyps, refs, lang=lang, lowercase=args.lowercase))
    if args.model is not None:
        srcs = _read_lines(args.src)
        if len(srcs) != len(refs):
            raise UserError(f"{args.src} has {len(srcs)} lines but {args.ref} has {len(refs)}; "
                            f"sources and references must be line-aligned")
        out["perplexity"] = model_perplexity(args.model, srcs, refs, device=args.device,
                                             precision=args.precision)
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if args.hyp is not None:
        print(f"{out['hyp']} against {args.ref}, {out['lines']} lines, target language {lang}")
        print(format_table(out))
    if args.model is not None:
        p = out["perplexity"]
        print(f"perplexity of {args.ref} under {args.model}: {p['ppl']:.3f} per target token "
              f"(NLL {p['nll_per_token']:.4f}, {p['n_tokens']:,} tokens incl. EOS)")
    return 0


def model_perplexity(model_dir: str, srcs: list[str], refs: list[str],
                     batch_tokens: int = 4000, device: str | None = "cpu",
                     precision: str = "fp32") -> dict:
    """Teacher-forced per-token perplexity of `refs` given `srcs` under a model directory, on
    `device` (None: the GPU when there is one), under `precision`'s autocast (as training's dev
    figures; auto: `aiayn.precision.auto_precision`)."""
    # these load torch (a second here): imported here so that --help and a mistyped option answer at once
    from aiayn.data.model_dir import load_model
    from aiayn.evaluation.perplexity import perplexity, score_ids
    from aiayn.training.precision import Precision

    where = torch_device(device)
    autocast = Precision(precision, where).autocast
    loaded = load_model(model_dir, where)
    pairs = list(zip(loaded.src_tokenizer.encode_batch(srcs), loaded.tgt_tokenizer.encode_batch(refs)))
    return perplexity([score_ids(loaded.model, pairs, batch_tokens, autocast)])
