"""How far a test set's sacreBLEU moves when nothing but luck changes: the model's weight
matrices perturbed by random noise the size of int8's rounding, seed after seed, each perturbed
model translating the same files (fp32, beam search as the model's config says), its sacreBLEU
against the unperturbed model's.

    .venv/bin/python benchmarks/bleu_noise.py --model runs/m30k/model \\
        --pairs runs/m30k/data/test.src.txt runs/m30k/data/test.tgt.txt \\
        --pairs runs/m30k/data/valid.src.txt runs/m30k/data/valid.tgt.txt \\
        --seeds 6 --early-stop exact current --out runs/bleu-noise.json

The noise: every 2-D weight (linear layers, the embedding matrix) gets N(0, sd^2) per element,
sd = --scale * max|row| / 127 / sqrt(12), the standard deviation of rounding a row to int8's 127
steps (`aiayn.decoding.int8.quantize_rows`). Unlike int8 it changes no activation, so at scale 1 it
moves the model's log-probabilities less than int8 does (benchmarks/precision_fidelity.py
measures both). The spread of the deltas is the resolution at which sacreBLEU on these files can
tell two arithmetics apart: a precision's sacreBLEU "within 0.1 of fp32" means little where
noise alone moves it by as much.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def perturb(model, scale: float, seed: int):
    """`model` with N(0, sd^2) added in place to every 2-D parameter, sd per row as the module
    doc says; returns the model."""
    import torch

    from aiayn.decoding.int8 import WEIGHT_LEVELS

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in model.parameters():
            if w.dim() == 2:
                sd = w.abs().amax(dim=1, keepdim=True) * (scale / WEIGHT_LEVELS / 12 ** 0.5)  # (N, 1)
                w.add_(torch.randn(w.shape, generator=g) * sd)
    return model


def spread(deltas: list[float]) -> dict:
    """Mean, sample standard deviation and largest |delta| of a list of sacreBLEU deltas."""
    return {"mean": statistics.fmean(deltas),
            "sd": statistics.stdev(deltas) if len(deltas) > 1 else 0.0,
            "max_abs": max(abs(d) for d in deltas)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--pairs", nargs=2, action="append", required=True, metavar=("SRC", "REF"))
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--early-stop", nargs="+", default=["exact"], choices=["exact", "current"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the deltas as JSON here (refuses to overwrite)")
    a = p.parse_args()
    if a.out is not None and a.out.exists():
        raise SystemExit(f"{a.out} exists; choose another --out")
    import torch

    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator
    from aiayn.evaluation.sacre import sacre_bleu

    torch.set_num_threads(a.threads)
    data = []
    for s, r in a.pairs:
        missing = [f for f in (s, r) if not Path(f).is_file()]
        if missing:
            raise SystemExit(f"{missing[0]}: no such file")
        src, ref = (Path(f).read_text(encoding="utf-8").splitlines() for f in (s, r))
        if len(src) != len(ref):
            raise SystemExit(f"{s} has {len(src)} lines but {r} has {len(ref)}")
        data.append((src, ref, Path(s).name))

    def scores(loaded) -> dict[str, float]:
        out = {}
        for rule in a.early_stop:
            tr = Translator(loaded, precision="fp32", early_stop=rule)
            for src, ref, name in data:
                out[f"{rule} {name}"] = sacre_bleu(tr.translate(src), ref).score
        return out

    from aiayn.errors import UserError

    try:
        base = scores(load_model(a.model))
    except UserError as e:
        raise SystemExit(str(e)) from None
    deltas: dict[str, list[float]] = {k: [] for k in base}
    for seed in range(1, a.seeds + 1):
        loaded = load_model(a.model)
        perturb(loaded.model, a.scale, seed)
        got = scores(loaded)
        for k, v in got.items():
            deltas[k].append(v - base[k])
        print(f"seed {seed}: " + "  ".join(f"{k} {v - base[k]:+.2f}" for k, v in got.items()),
              flush=True)
    summary = {k: {"fp32": base[k], "deltas": d, **spread(d)} for k, d in deltas.items()}
    for k, s in summary.items():
        print(f"{k:32s} fp32 {s['fp32']:.2f}  delta mean {s['mean']:+.2f}  sd {s['sd']:.2f}  "
              f"max |delta| {s['max_abs']:.2f}")
    if a.out is not None:
        from aiayn.files import atomic_write

        with atomic_write(a.out) as f:
            json.dump({"model": a.model, "scale": a.scale, "seeds": a.seeds, "rows": summary},
                      f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
