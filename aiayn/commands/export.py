"""`aiayn export`: convert a model directory for another inference engine.

    aiayn export --format ctranslate2 runs/base/model runs/base/ct2
    aiayn export --format ctranslate2 --quantization int8 runs/base/model runs/base/ct2-int8

The CTranslate2 directory holds model.bin, config.json, the vocabularies and our sentencepiece
model(s), so it is all a user needs to translate with `ctranslate2.Translator` (pass
`suppress_sequences=[["<pad>"], ["<s>"]]` for outputs identical to aiayn's greedy search).
Needs `pip install 'aiayn[export]'`.
"""

from __future__ import annotations

import argparse

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
                 "bfloat16", "float32")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n", 2)[2]
    p.add_argument("model", metavar="MODEL_DIR", help="an aiayn model directory (from train/average)")
    p.add_argument("out", metavar="OUT_DIR", help="directory to write")
    p.add_argument("--format", required=True, choices=["ctranslate2"], help="what to export to")
    p.add_argument("--quantization", choices=QUANTIZATIONS,
                   help="weight type of the exported model (default: float32, as trained)")
    p.add_argument("--max-positions", type=int, metavar="N",
                   help="rows of the sinusoidal position table: the longest source or output the "
                        "exported model takes (default 2048; learned positions keep their own)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")


def main(args: argparse.Namespace) -> int:
    from aiayn.model.export_ct2 import export_ctranslate2

    out = export_ctranslate2(args.model, args.out, quantization=args.quantization,
                             overwrite=args.overwrite, max_positions=args.max_positions)
    print(f"exported {args.model} to CTranslate2 in {out}"
          + (f" ({args.quantization} weights)" if args.quantization else ""))
    return 0
