"""`aiayn evaluate`: score a translation file against a reference, three ways, side by side.

- sacreBLEU on detokenized text (13a tokenization), with its signature: today's reporting standard;
- chrF, with its signature;
- tokenized BLEU: the paper's convention (Moses-tokenized, mixed case, German hyphenated
  compounds split as tensor2tensor does), or with `--lowercase` the Multi30k convention
  (lowercased, punctuation-normalised, Moses-tokenized, no compound splitting).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from aiayn.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hyp", required=True, metavar="H",
                        help="hypotheses, detokenized UTF-8 text, one sentence a line ('-' = stdin)")
    parser.add_argument("--ref", required=True, metavar="R",
                        help="references, detokenized UTF-8 text, one sentence a line")
    parser.add_argument("--lang", default="de",
                        help="target language, for Moses tokenization; compounds are split for "
                             "'de' only (default: de)")
    parser.add_argument("--lowercase", action="store_true",
                        help="case-insensitive scores; tokenized BLEU then follows the Multi30k "
                             "convention (lowercased, punctuation-normalised, no compound split)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _read_lines(path: str) -> list[str]:
    """Lines of a text file (or '-' for stdin), errors as one line naming file and line."""
    from aiayn.data.corpus import decode_utf8, read_lines, split_lines

    if path == "-":
        return split_lines(decode_utf8(sys.stdin.buffer.read(), "<stdin>"))
    return read_lines(path)


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


def score(hyps: list[str], refs: list[str], lang: str = "de", lowercase: bool = False) -> dict:
    """All three scores as one JSON-ready dict (what `--json` prints, less the file names)."""
    from aiayn.evaluation.sacre import chrf, sacre_bleu
    from aiayn.evaluation.tokenized import tokenized_bleu

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
    from aiayn.evaluation.bleu import BleuResult

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
    hyps = _read_lines(args.hyp)
    refs = _read_lines(args.ref)
    hyp_name = "<stdin>" if args.hyp == "-" else args.hyp
    if len(hyps) != len(refs):
        raise UserError(f"{hyp_name} has {len(hyps)} lines but {args.ref} has {len(refs)}; "
                        f"hypotheses and references must be line-aligned")
    result = score(hyps, refs, lang=args.lang, lowercase=args.lowercase)
    if args.json:
        print(json.dumps({"hyp": hyp_name, "ref": args.ref, **result}, ensure_ascii=False))
    else:
        print(f"{hyp_name} against {args.ref}, {len(hyps)} lines")
        print(format_table(result))
    return 0
