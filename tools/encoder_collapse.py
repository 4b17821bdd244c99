"""Does a trained model read its source? Measures an encoder that has collapsed to one vector.

    python tools/encoder_collapse.py --model runs/parsing/e2/model \
        --src runs/parsing/corpus/valid.words --ref runs/parsing/corpus/valid.tree [--lines 50] [--json]

Prints, per encoder layer, the mean cosine similarity between the outputs at different positions
of one sentence (1.00: every position the same vector, so the decoder cannot tell the words
apart), and the norms of what the two sub-layers add to the residual stream; with --ref, the
entropy of the encoder-decoder attention as a share of a uniform distribution's (1.00: every
source position weighted alike, teacher forced on the reference). docs/experiments/parsing.md
uses it to show why the parsing models ignored their sentences; `aiayn evaluate` with rotated
sources measures the same thing from the outside (docs/experiments/parsing.md has the command).

Written here rather than taken from a library: it reads the sub-layers of aiayn's own modules.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from aiayn.data.batching import Batch, collate
from aiayn.decoding.common import source_batch
from aiayn.errors import UserError
from aiayn.special import PAD_ID


@dataclass
class LayerStats:
    """One encoder layer over the sentences measured (layer 0: the embeddings plus positions).
    similarity: mean pairwise cosine between distinct real positions of a sentence;
    attn_norm, ffn_norm: mean L2 norm of what self-attention and the FFN add, per position;
    residual_norm: mean L2 norm of the layer's input."""

    layer: int
    similarity: float
    attn_norm: float
    ffn_norm: float
    residual_norm: float


def position_similarity(x: Tensor, mask: Tensor) -> float:
    """x (B, S, d), mask (B, S) True at real tokens -> mean cosine between distinct real
    positions of each sentence, averaged over sentences with at least two."""
    xn = torch.nn.functional.normalize(x.float(), dim=-1)
    cos = xn @ xn.transpose(1, 2)  # (B, S, S)
    pair = mask[:, :, None] & mask[:, None, :]
    pair &= ~torch.eye(x.size(1), dtype=torch.bool, device=x.device)[None]
    n = pair.sum((1, 2))  # (B,)
    keep = n > 0
    per = (cos * pair).sum((1, 2))[keep] / n[keep]
    return float(per.mean()) if keep.any() else float("nan")


@torch.no_grad()
def encoder_stats(model: torch.nn.Module, src: Tensor, src_mask: Tensor) -> list[LayerStats]:
    """Per-layer collapse statistics of a Transformer encoder (eval mode, no dropout)."""
    mask = model._encoder_mask(src_mask)
    x = model._embed(src, model.src_embed, model.src_pos)  # (B, S, d_model)
    real = src_mask[..., None].float()

    def mean_norm(t: Tensor) -> float:
        return float((t.norm(dim=-1, keepdim=True) * real).sum() / real.sum())

    stats = [LayerStats(0, position_similarity(x, src_mask), 0.0, 0.0, mean_norm(x))]
    for i, layer in enumerate(model.encoder, 1):
        q, k, v = layer.self_attn.project_qkv(layer.res_attn.inp(x))
        a, _ = layer.self_attn.attend(q, k, v, mask)
        mid = layer.res_attn.out(x, a)
        f = layer.ffn(layer.res_ffn.inp(mid))
        out = layer.res_ffn.out(mid, f)
        stats.append(LayerStats(i, position_similarity(out, src_mask), mean_norm(a), mean_norm(f),
                                mean_norm(x)))
        x = out
    return stats


@torch.no_grad()
def cross_entropy_share(model: torch.nn.Module, batch: Batch) -> list[float]:
    """Per decoder layer: the entropy of the encoder-decoder attention (teacher forced on the
    batch's targets) over the log of the number of real source positions, averaged over heads,
    target positions and sentences. 1.0 is uniform attention."""
    _, w = model(batch.src, batch.tgt_in, batch.src_mask, return_attention=True)
    real_t = batch.tgt_out != PAD_ID  # (B, T)
    log_s = batch.src_mask.sum(1).float().log()  # (B,)
    shares = []
    for wc in w["cross"]:  # (B, h, T, S)
        ent = -(wc * (wc + 1e-12).log()).sum(-1).mean(1)  # (B, T)
        shares.append(float((ent / log_s[:, None])[real_t].mean()))
    return shares


def main(argv: list[str] | None = None) -> int:
    from aiayn.data.model_dir import load_model

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--ref", help="their references (targets), one per line")
    p.add_argument("--lines", type=int, default=50, help="how many lines to read (default 50)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead")
    args = p.parse_args(argv)
    try:
        loaded = load_model(args.model)
        if not hasattr(loaded.model, "encoder") or not hasattr(loaded.model, "_encoder_mask"):
            raise UserError(f"{args.model}: not a Transformer model")
        with open(args.src, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(args.lines), f)]
        ids = [loaded.src_tokenizer.encode(line) for line in lines]
        if not any(ids):
            raise UserError(f"{args.src}: no source pieces in the first {args.lines} lines")
        src, src_mask = source_batch(ids)
        model = loaded.model.eval()
        stats = encoder_stats(model, src, src_mask)
        if not args.json:
            print("layer  position similarity  |attn|   |ffn|  |residual in|")
        for s in [] if args.json else stats:
            print(f"{s.layer:5d}  {s.similarity:19.3f}  {s.attn_norm:6.1f}  {s.ffn_norm:6.1f}  "
                  f"{s.residual_norm:12.1f}")
        shares = None
        if args.ref:
            with open(args.ref, encoding="utf-8") as f:
                refs = [line.rstrip("\n") for _, line in zip(range(len(lines)), f)]
            if len(refs) != len(lines):
                raise UserError(f"{args.ref}: {len(refs)} lines, {args.src}: {len(lines)}")
            pairs = [(i, loaded.tgt_tokenizer.encode(r)) for i, r in zip(ids, refs)]
            shares = cross_entropy_share(model, collate(pairs, range(len(pairs))))
            if not args.json:
                print("encoder-decoder attention entropy / uniform, per decoder layer: "
                      + " ".join(f"{s:.2f}" for s in shares))
        if args.json:
            print(json.dumps({"layers": [asdict(s) for s in stats], "cross_entropy_share": shares}))
    except (UserError, OSError, UnicodeDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
