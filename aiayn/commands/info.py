"""`aiayn info`: a preset's configuration, parameter count and training FLOPs per target token."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    from aiayn.config import PRESETS, load_config
    from aiayn.recipes import RECIPE_MODULES, recipe_presets
    from aiayn.errors import UserError
    from aiayn.memory import allocator_in_use
    from aiayn.model.counting import count_parameters, flops_per_target_token

    if args.list:
        print("the paper's (aiayn/config.py): " + " ".join(PRESETS))
        print(f"the recipes' (aiayn/recipes/{{{','.join(RECIPE_MODULES)}}}.py): "
              + " ".join(recipe_presets()))
        return 0
    if args.vocab_size < 1:
        raise UserError(f"--vocab-size must be >= 1, got {args.vocab_size}")
    cfg = load_config(args.preset, args.config, args.set)
    cfg = replace(cfg, vocab_size=args.vocab_size)
    n = count_parameters(cfg)
    flops = flops_per_target_token(cfg, args.seq_len, args.seq_len)
    info = {"preset": args.preset, "parameters": n, "train_flops_per_target_token": flops,
            "seq_len_assumed": args.seq_len, "config": cfg.to_dict()}
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
    return 0
