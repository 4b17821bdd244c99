"""`aiayn attention`: draw what the model attends to, for one sentence and its translation.

    aiayn attention --model runs/base/model --src "A man rides a bike." --out att/
    aiayn attention --model M --src "..." --tgt "..." --layer 2 --head 3 --out att/

Translates the source with the model's own search (beam search by default; --greedy), or reads
the given --tgt, and writes into --out, for the chosen layer (1-based; default the last):

    encoder.layerL[.headH].{png,svg}          encoder self-attention heatmaps
    decoder.layerL[.headH].{png,svg}          decoder self-attention (causal)
    cross.layerL[.headH].{png,svg}            encoder-decoder attention (what alignments use)
    {encoder,decoder,cross}-lines.layerL[.headH].{png,svg}
                                              the paper's appendix style (Figures 3-5)
    attention.html                            every layer and head, to browse offline

One head with --head H (1-based), every head of the layer without. Tick labels are the subword
pieces. Existing files are replaced only with --overwrite.
"""

from __future__ import annotations

import argparse

from aiayn.commands.common import (
    add_device_argument,
    add_precision_argument,
    one_based,
    search_settings,
    set_examples,
    translator_from_args,
)
from aiayn.errors import UserError


def add_arguments(p: argparse.ArgumentParser) -> None:
    set_examples(p, 'aiayn attention --model runs/m30k/model --src "A man rides a bike." --out att/',
                 'aiayn attention --model runs/m30k/model --src "A man rides a bike." '
                 '--tgt "Ein Mann fährt Rad." --layer 2 --head 3 --out att/',
                 about=__doc__.split("\n\n", 2)[2])
    p.add_argument("--model", required=True, metavar="DIR", help="model directory")
    p.add_argument("--src", required=True, metavar="TEXT", help="the source sentence")
    p.add_argument("--tgt", metavar="TEXT",
                   help="a target to read teacher-forced instead of the model's own translation")
    p.add_argument("--out", required=True, metavar="DIR", help="where to write the pictures")
    p.add_argument("--layer", type=int, default=-1,
                   help="layer to draw, 1-based; negative counts from the top (default -1: the "
                        "last)")
    p.add_argument("--head", type=int, help="one head, 1-based (default: every head of the layer)")
    p.add_argument("--formats", default="png,svg",
                   help="comma-separated image formats: png, svg, pdf (default png,svg)")
    p.add_argument("--no-html", action="store_true", help="skip attention.html")
    p.add_argument("--overwrite", action="store_true", help="replace existing files")
    s = p.add_argument_group("search (when no --tgt is given)")
    s.add_argument("--beam", type=int, metavar="K", help="beam size (config default 4)")
    s.add_argument("--greedy", action="store_true", help="greedy search instead of beam search")
    h = p.add_argument_group("hardware")
    add_device_argument(h)
    add_precision_argument(h)  # as translate's: the weights the maps are drawn from


def output_names(layer: int, head: int | None, formats: list[str]) -> dict[str, list[str]]:
    """File names per picture (before the directory), `layer`/`head` 0-based."""
    tag = f"layer{layer + 1}" + ("" if head is None else f".head{head + 1}")
    names = {}
    for kind in ("encoder", "decoder", "cross"):
        names[kind] = [f"{kind}.{tag}.{f}" for f in formats]
        names[f"{kind}-lines"] = [f"{kind}-lines.{tag}.{f}" for f in formats]
    return names


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from aiayn.data.model_dir import read_config
    from aiayn.files import atomic_write, check_writable
    from aiayn.viz.figures import FORMATS, heatmap_figure, lines_figure, save_all
    from aiayn.viz.maps import KIND_AXES, KIND_TITLES, KINDS, collect_attention
    from aiayn.viz.page import attention_page

    formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise UserError(f"--formats: {', '.join(bad) or 'none given'}; "
                        f"choose from {', '.join(FORMATS)}")
    cfg = read_config(args.model)
    layer = one_based(args.layer, cfg.n_layers, "--layer", "layer")
    head = None if args.head is None else one_based(args.head, cfg.n_heads, "--head", "head")
    out = Path(args.out)
    names = output_names(layer, head, formats)
    todo = [out / n for files in names.values() for n in files]
    if not args.no_html:
        todo.append(out / "attention.html")
    for path in todo:  # refuse before any slow work
        check_writable(path, args.overwrite)
    search = search_settings(args, cfg)

    translator = translator_from_args(args, "attention", search)
    maps = collect_attention(translator, args.src, args.tgt)
    print(f"source: {maps.source}\ntarget: {maps.target}")

    heads = list(range(maps.n_heads)) if head is None else [head]
    head_names = [f"head {h + 1}" for h in heads]
    where = f"layer {layer + 1} of {maps.n_layers}"
    for kind in KINDS:
        weights, rows, cols = maps.view(kind)
        w = weights[layer][heads]  # (H, Q, K)
        row_axis, col_axis = KIND_AXES[kind]
        title = f"{KIND_TITLES[kind]}, {where}" + (f", head {head + 1}" if head is not None else "")
        drawn = [(heatmap_figure(w, rows, cols, title, head_names, row_axis, col_axis), kind),
                 (lines_figure(w, rows, cols, title, head_names, row_axis, col_axis),
                  f"{kind}-lines")]
        for fig, key in drawn:
            for path in save_all(fig, [out / name for name in names[key]]):
                print(path)
    if not args.no_html:
        with atomic_write(out / "attention.html") as f:
            f.write(attention_page(maps, f"Attention: {args.model}"))
        print(out / "attention.html")
    return 0
