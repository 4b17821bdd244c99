"""`aiayn info`: a preset's configuration, parameter count and training FLOPs per target token,
and Table 2's training cost of the paper's base and big models counted both ways: the paper's
(training time x GPUs x sustained TFLOPS of one GPU) and the analytic one (FLOPs per target token x
updates x 25,000 target tokens)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from aiayn.commands.common import set_examples


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, "aiayn info --list", "aiayn info --preset big",
                 "aiayn info --preset translation-tiny-v2 --vocab-size 8000 --json")
    p.add_argument("--preset", default="base", help="preset name (default: base); see --list")
    p.add_argument("--config", help="JSON file of config fields applied over the preset")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="config overrides")
    p.add_argument("--vocab-size", type=int, default=37000,
                   help="shared vocabulary size (default 37000, the paper's EN-DE BPE)")
    p.add_argument("--seq-len", type=float, default=25.0,
                   help="mean source and target length for the attention FLOPs (default 25)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--list", action="store_true", help="list the presets and exit")


def main(args: argparse.Namespace) -> int:
    from aiayn.config import Config
    from aiayn.errors import UserError
    from aiayn.memory import allocator_in_use
    from aiayn.model.counting import count_parameters, flops_per_target_token
    from aiayn.presets import load_config

    if args.list:
        print(format_preset_list())
        return 0
    if args.vocab_size < 1:
        raise UserError(f"--vocab-size must be >= 1, got {args.vocab_size}")
    cfg = load_config(args.preset, args.config, args.set)
    if not isinstance(cfg, Config):  # a task's own model: its sizes depend on its data
        if args.json:
            print(json.dumps({"preset": args.preset, "task": cfg.TASK, "config": cfg.to_dict()},
                             indent=2))
            return 0
        print(f"preset {args.preset}  (a {cfg.TASK}; its parameters depend on the vocabularies "
              f"of its corpus: aiayn train prints them)")
        for k, v in cfg.to_dict().items():
            print(f"  {k:<15} {v}")
        return 0
    cfg = replace(cfg, vocab_size=args.vocab_size)
    n = count_parameters(cfg)
    flops = flops_per_target_token(cfg, args.seq_len, args.seq_len)
    info = {"preset": args.preset, "parameters": n, "train_flops_per_target_token": flops,
            "seq_len_assumed": args.seq_len, "config": cfg.to_dict(),
            "table2": table2(args.vocab_size, args.seq_len)}
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"preset {args.preset}  (vocabulary {cfg.vocab_size})")
    for k, v in cfg.to_dict().items():
        print(f"  {k:<15} {v}")
    print(f"parameters      {n:,} ({n / 1e6:.1f}M)")
    print(f"allocator       {allocator_in_use()} (this process; AIAYN_ALLOCATOR, aiayn/memory.py)")
    print(f"training FLOPs  {flops / 1e6:.1f}M per target token "
          f"(6 x weights + attention at length {args.seq_len:g})")
    print(format_table2(info["table2"]))
    return 0


def format_preset_list() -> str:
    """The current presets, one per task and size, a line each, then the paper's
    (aiayn/presets.py)."""
    from aiayn.config import PRESETS
    from aiayn.presets import CURRENT

    lines = ["Presets by task, one per size (aiayn/recipes/; `--set NAME=VALUE` changes a field):"]
    width = max(len(n) for names in CURRENT.values() for n in names)
    for task, names in CURRENT.items():
        lines.append(f"  {task}")
        lines += [f"    {name:<{width}}  {what}" for name, what in names.items()]
    lines.append("The paper's (aiayn/config.py): base and big (§6.1), big-enfr (big's EN-FR "
                 "dropout), parsing (§6.3), and Table 3's rows:")
    rows = [n for n in PRESETS if n not in ("base", "big", "big-enfr", "parsing")]
    lines.append("    " + " ".join(rows))
    lines.append("A retired name fails with its exact successor, a preset above and `--set` "
                 "(docs/reference/cli.md#presets).")
    return "\n".join(lines)


def table2(vocab_size: int, seq_len: float) -> dict[str, dict[str, float]]:
    """Table 2's training cost of the paper's base and big, the paper's way and analytically."""
    from aiayn.config import PRESETS
    from aiayn.model.counting import PAPER_TOKENS_PER_STEP, TABLE2, training_flops

    out = {}
    for name, cost in TABLE2.items():
        cfg = replace(PRESETS[name], vocab_size=vocab_size)
        analytic = training_flops(cfg, cost.steps, PAPER_TOKENS_PER_STEP, seq_len, seq_len)
        out[name] = {"hours": cost.hours, "gpus": cost.gpus, "tflops_per_gpu": cost.tflops,
                     "paper_flops": cost.flops, "table2_flops": cost.reported,
                     "steps": cost.steps, "tokens_per_step": PAPER_TOKENS_PER_STEP,
                     "analytic_flops": analytic, "paper_over_analytic": cost.flops / analytic}
    return out


def format_table2(rows: dict[str, dict[str, float]]) -> str:
    lines = ["Table 2, training cost: the paper's count (hours x GPUs x sustained TFLOPS of a P100) "
             "against the analytic one (FLOPs/token x steps x target tokens/step)"]
    for name, r in rows.items():
        lines.append(
            f"  {name:<5} paper {r['hours']:g} h x {r['gpus']} x {r['tflops_per_gpu']:g} TFLOPS = "
            f"{r['paper_flops']:.2e} (Table 2: {r['table2_flops']:.1e}); analytic "
            f"{r['analytic_flops']:.2e} ({r['steps']:,} steps x {r['tokens_per_step']:,} tokens); "
            f"paper / analytic {r['paper_over_analytic']:.1f}")
    return "\n".join(lines)
