"""`aiayn train`: train a model (§5): the Transformer on a dataset made by `aiayn prepare`, or
the chart parser on a treebank corpus made by `aiayn treebank` (`--preset parsing-chart-small`).

Data parallel on K GPUs or processes: torchrun --nproc_per_node=K -m aiayn train ... (DDP).
"""

from __future__ import annotations

import argparse
import json
import sys

from aiayn.checks import read_json
from aiayn.commands.args import options_from_args
from aiayn.commands.common import (
    add_device_argument,
    add_no_progress_argument,
    add_precision_argument,
    check_train_precision,
    set_examples,
    torch_device,
)
from aiayn.errors import UserError
from aiayn.presets import load_config
from aiayn.training.options import TrainOptions


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(
        p, "aiayn train --data data/m30k --out runs/m30k --preset translation-tiny-v2 --time-budget 60",
        "aiayn train --data data/m30k --out runs/m30k --resume          # continue after a crash",
        "aiayn train --data corpus --out runs/chart --preset parsing-chart-small --time-budget 30",
        "aiayn train --data data/wmt --out runs/base --preset base --max-steps 100000",
        "aiayn train --data data/news --out runs/news --init-from runs/m30k/model --time-budget 10",
        about=__doc__.split("\n\n", 1)[1])
    p.add_argument("--data", required=True, metavar="DATA_DIR",
                   help="a dataset made by aiayn prepare, or (for the chart parser) a treebank "
                        "corpus made by aiayn treebank")
    p.add_argument("--out", required=True, metavar="RUN_DIR",
                   help="run directory: checkpoints/, best/, last, metrics.jsonl, tb/")
    g = p.add_argument_group("model and recipe")
    g.add_argument("--preset", help="preset name (default: base; on --resume: the checkpoint's config)")
    g.add_argument("--config", metavar="F.json", help="JSON file of config fields applied over the preset")
    g.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="config overrides, e.g. --set p_drop=0.3 warmup_steps=8000")
    g.add_argument("--init-from", metavar="MODEL_DIR",
                   help="start from this model's weights (fine-tuning): same architecture and "
                        "vocabulary (prepare the data with --vocab-from MODEL_DIR), a fresh "
                        "optimizer and learning-rate schedule; the config is the model's unless "
                        "--preset or --config is given. Fine-tuning defaults, each unless given: "
                        "warmup_steps at most 200 (and a tenth of --max-steps), lr_scale such that "
                        "the peak rate is half the model's own, with --max-steps a checkpoint "
                        "every max-steps / (n_average + 1) updates; --set warmup_steps=N "
                        "lr_scale=X, --save-every or --save-minutes override them")
    g = p.add_argument_group("how long")
    g.add_argument("--max-steps", type=int, metavar="N", help="updates to train (sets max_steps)")
    g.add_argument("--max-epochs", type=int, metavar="N", help="passes over the training data")
    g.add_argument("--time-budget", type=float, metavar="MINUTES",
                   help="stop after this many minutes of training in the whole run (a resumed run "
                        "trains for what is left)")
    g = p.add_argument_group("batches and numerics")
    g.add_argument("--accum", type=int, metavar="N",
                   help="micro-batches per update per process (default: from max_tokens and "
                        "--batch-tokens; on --resume the run's)")
    g.add_argument("--batch-tokens", type=int, metavar="T",
                   help="tokens per side in one micro-batch (memory); default max_tokens / (accum x processes)")
    add_precision_argument(g)  # bf16 and fp16 autocast; weights, Adam, softmax, loss stay fp32
    g.add_argument("--compile", action="store_true",
                   help="torch.compile each encoder and decoder layer: on a GPU 1.2x faster "
                        "after about a minute of compiling; on a CPU measured slower")
    add_device_argument(g)
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch")
    g.add_argument("--seed", type=int,
                   help="seed of weights, dropout and batch order (default 1; on --resume the run's)")
    g = p.add_argument_group("evaluation, checkpoints, logs")
    g.add_argument("--eval-every", type=int, default=1000, metavar="K",
                   help="dev loss/perplexity/BLEU every K updates (0: only at the end; default 1000)")
    g.add_argument("--eval-bleu-sentences", type=int, metavar="N",
                   help="translation: greedy-decode the first N dev sentences for BLEU (0: none, "
                        "-1: all; default 200); the chart parser parses every dev sentence for "
                        "its bracket F1")
    g.add_argument("--dev-split", help="dataset split to evaluate on (default: valid)")
    g.add_argument("--save-every", type=int, metavar="M",
                   help="checkpoint every M updates (with --init-from and --max-steps N, and no "
                        "--save-minutes: default N / (n_average + 1))")
    g.add_argument("--save-minutes", type=float, metavar="T",
                   help="checkpoint every T minutes (default 10, as the paper; with a time budget "
                        "shorter than n_average + 1 such intervals, the budget / (n_average + 1))")
    g.add_argument("--keep", type=int, metavar="K", help="newest checkpoints kept (default: n_average)")
    g.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in RUN_DIR")
    g.add_argument("--overwrite", action="store_true", help="delete RUN_DIR's checkpoints and start over")
    g.add_argument("--log-every", type=int, default=10, metavar="N", help="updates between log records")
    g.add_argument("--no-tensorboard", action="store_true", help="do not write RUN_DIR/tb")
    add_no_progress_argument(g)
    g.add_argument("--peak-tflops", type=float, metavar="X", help="peak TFLOP/s per device, for MFU")
    g.add_argument("--max-nonfinite", type=int, default=5, metavar="N",
                   help="stop after N consecutive non-finite updates (default 5)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def train_options(args: argparse.Namespace) -> TrainOptions:
    """`TrainOptions` from the parsed arguments: each field from the option of its name (one not
    given: the field's default), these four derived from options of other names."""
    return options_from_args(TrainOptions, args, fit_saves_to_budget=args.save_minutes is None,
                             set_fields=given_fields(args), tensorboard=not args.no_tensorboard,
                             progress=not args.no_progress)


def given_fields(args: argparse.Namespace) -> tuple[str, ...]:
    """The config fields the user gave: the names in --set NAME=VALUE and the keys of --config's
    JSON object (a file that is not one is refused later, by `load_config`, in one line)."""
    names = [item.split("=", 1)[0].strip() for item in args.set if "=" in item]
    if args.config:
        data = read_json(args.config)
        if isinstance(data, dict):
            names += [k for k in data if k != "task"]
    return tuple(sorted(set(names)))


def main(args: argparse.Namespace) -> int:
    # these load torch (a second here): imported here so that --help and a mistyped option answer at once
    from aiayn.tasks import read_model_config, task_for_data
    from aiayn.training.seq2seq import Seq2SeqTask
    from aiayn.training.trainer import train

    check_train_precision(args, "train")
    if args.device is not None:
        torch_device(args.device)  # one line for a device this machine lacks, before any work
    task = task_for_data(args.data, args.dev_split)
    if args.eval_bleu_sentences is not None and not isinstance(task, Seq2SeqTask):
        raise UserError("--eval-bleu-sentences is for translation; the chart parser's evaluation "
                        "parses every dev sentence for its bracket F1")
    cfg = None  # on --resume without model options: the checkpoint's config
    if args.init_from is not None and args.preset is None and args.config is None:
        cfg = read_model_config(args.init_from).with_overrides(args.set)  # the model's own config
    elif not (args.resume and args.preset is None and args.config is None and not args.set):
        cfg = load_config(args.preset, args.config, args.set)
    summary = train(cfg, task, args.out, train_options(args))
    if args.json and summary:
        json.dump(summary, sys.stdout, indent=2, default=str)
        print()
    return 0
