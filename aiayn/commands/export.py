"""`aiayn export`: convert a model directory for another inference engine.

The CTranslate2 directory holds model.bin, config.json, the vocabularies and our sentencepiece
model(s), so it is all a user needs to translate with `ctranslate2.Translator` (pass
`suppress_sequences=[["<pad>"], ["<s>"]]` for outputs identical to aiayn's greedy search).
Needs `pip install 'aiayn[export]'`.
"""

from __future__ import annotations

import argparse

from aiayn.commands.common import retire, retire_positionals, set_examples

# --precision: the stored weight type, in CTranslate2's names. No `auto`: what is stored is
# chosen once, for the machines the model will run on, not for this one.
CT2_TYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn export --format ctranslate2 --model runs/m30k/model --out runs/m30k/ct2",
                 "aiayn export --format ctranslate2 --model runs/m30k/model --out runs/m30k/ct2-int8 "
                 "--precision int8",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--format", required=True, choices=["ctranslate2"], help="what to export to")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="an aiayn model directory (from train/average)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    p.add_argument("--precision", choices=tuple(CT2_TYPES), default="fp32",
                   help="the stored weight type: fp32 (default, as trained), bf16, fp16, int8 "
                        "(CTranslate2's float32, bfloat16, float16, int8)")
    p.add_argument("--max-positions", type=int, metavar="N",
                   help="rows of the sinusoidal position table: the longest source or output the "
                        "exported model takes (default 2048; learned positions keep their own)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a CTranslate2 model an earlier export wrote to --out")
    retire(p, "--quantization", new="--precision {fp32,bf16,fp16,int8}")
    retire_positionals(p, "--model DIR --out DIR")


def main(args: argparse.Namespace) -> int:
    from aiayn.model.export_ct2 import export_ctranslate2

    out = export_ctranslate2(args.model, args.out, quantization=CT2_TYPES[args.precision],
                             overwrite=args.overwrite, max_positions=args.max_positions)
    print(f"exported {args.model} to CTranslate2 in {out} ({args.precision} weights)")
    return 0
