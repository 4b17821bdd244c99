"""`aiayn export`: convert a model directory for another inference engine or ecosystem.

- ctranslate2: model.bin, config.json, the vocabularies and our sentencepiece model(s): all a
  user needs to translate with `ctranslate2.Translator` (pass `suppress_sequences=[["<pad>"],
  ["<s>"]]` for outputs identical to aiayn's greedy search). `pip install 'aiayn[export]'`.
- huggingface: a `transformers.MarianMTModel` directory (a pre-norm model: a
  `PegasusForConditionalGeneration`) with its tokenizer, for `from_pretrained`, `generate` and
  the Hub; greedy output equal to aiayn's token for token (aiayn/export/huggingface.py says what
  differs). `pip install 'aiayn[huggingface]'`.
- onnx: encoder.onnx and decoder.onnx (with the keys and values of past positions as inputs),
  config.json and the sentencepiece model(s), for onnxruntime (aiayn/export/onnx.py;
  `OnnxGreedy` there decodes with them). `pip install 'aiayn[onnx]'`.
"""

from __future__ import annotations

import argparse

from aiayn.commands.common import retire, retire_positionals, set_examples
from aiayn.errors import UserError

# --precision: the stored weight type, in CTranslate2's names. No `auto`: what is stored is
# chosen once, for the machines the model will run on, not for this one.
CT2_TYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8"}
FORMATS = ("ctranslate2", "huggingface", "onnx")


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn export --format ctranslate2 --model runs/m30k/model --out runs/m30k/ct2",
                 "aiayn export --format ctranslate2 --model runs/m30k/model --out runs/m30k/ct2-int8 "
                 "--precision int8",
                 "aiayn export --format huggingface --model runs/m30k/model --out runs/m30k/hf",
                 "aiayn export --format onnx --model runs/m30k/model --out runs/m30k/onnx",
                 about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--format", required=True, choices=FORMATS, help="what to export to")
    p.add_argument("--model", required=True, metavar="DIR",
                   help="an aiayn model directory (from train/average)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    p.add_argument("--precision", choices=tuple(CT2_TYPES), default="fp32",
                   help="ctranslate2: the stored weight type: fp32 (default, as trained), bf16, "
                        "fp16, int8 (CTranslate2's float32, bfloat16, float16, int8); the other "
                        "formats store fp32")
    p.add_argument("--max-positions", type=int, metavar="N",
                   help="rows of the position table: the longest source or output the exported "
                        "model takes (default: 2048 for ctranslate2, 1024 for huggingface and "
                        "onnx; learned positions keep their own)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a model of the same format an earlier export wrote to --out")
    retire(p, "--quantization", new="--precision {fp32,bf16,fp16,int8}")
    retire_positionals(p, "--model DIR --out DIR")


def main(args: argparse.Namespace) -> int:
    if args.format != "ctranslate2" and args.precision != "fp32":
        raise UserError(f"--precision {args.precision}: the {args.format} export stores fp32 "
                        f"weights (quantize in its own runtime)")
    # Each exporter loads torch and its optional library (transformers, onnx, ctranslate2), and
    # only its own: imported in its branch, so that --help answers at once.
    if args.format == "huggingface":
        from aiayn.data.model_dir import read_config
        from aiayn.export.huggingface import export_huggingface, model_class

        out = export_huggingface(args.model, args.out, args.overwrite, args.max_positions)
        print(f"exported {args.model} to Hugging Face ({model_class(read_config(args.model))}) "
              f"in {out}")
        return 0
    if args.format == "onnx":
        from aiayn.export.onnx import export_onnx

        out = export_onnx(args.model, args.out, args.overwrite, args.max_positions)
        print(f"exported {args.model} to ONNX in {out} (encoder.onnx, decoder.onnx)")
        return 0
    from aiayn.export.ctranslate2 import export_ctranslate2

    out = export_ctranslate2(args.model, args.out, quantization=CT2_TYPES[args.precision],
                             overwrite=args.overwrite, max_positions=args.max_positions)
    print(f"exported {args.model} to CTranslate2 in {out} ({args.precision} weights)")
    return 0
