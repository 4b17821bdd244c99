"""fbgemm's int8 product against oneDNN's, on a model's own shapes (aiayn/decoding/int8.py, "Two
kernels, one arithmetic"): which kernel each int8 product of `aiayn translate --precision int8`
should take on the CPU at hand.

    .venv/bin/python tools/int8_kernels.py --model runs/m30k/model \\
        --src runs/m30k/data/test.src.txt --out runs/int8-kernels.json

1. Every distinct product of the converted model ((K, N), whether it reads a ReLU's output):
   both kernels on the same random activations of `--rows` rows, alternating call by call,
   the median of `--reps` calls each, in microseconds.
2. With `--src`: a beam search of that file (`Translator.search`, the model's settings, each
   `--early-stop` rule) in which the pre-softmax projection runs both kernels on every call, in
   alternating order, and hands on fbgemm's result, so the search and its outputs are the
   fbgemm model's; the seconds each kernel spent there, summed over the search's calls. That is
   the projection's share of a real search, with its real row counts, free of the host's drift
   between runs (which end-to-end timings of this machine kind show at 20% and more).

Run under `aiayn translate`'s memory settings (`aiayn.memory.tune_memory`, the C library's
malloc). The kernels' integer sums are equal (tests/test_decoding_int8.py), so the choice is speed only.
Prints a table per part; `--out` writes both as JSON (refuses to overwrite) with the commit, whether
the tree was clean and the machine, each search with the sha256 of its outputs (token ids, as JSON).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiayn.memory import tune_memory  # noqa: E402

tune_memory()  # `aiayn translate`'s malloc and huge-page settings, before torch allocates
import torch  # noqa: E402
from torch import nn  # noqa: E402

from aiayn.decoding import EARLY_STOP_RULES  # noqa: E402
from aiayn.decoding.int8 import (  # noqa: E402
    KERNELS,
    Int8Linear,
    Int8Projection,
    cpu_flags,
    onednn_int8_supported,
    projection_kernel,
    quantize_rows,
)


def product_shapes(model: nn.Module) -> list[dict]:
    """The distinct int8 products of a converted model: in_features, out_features,
    nonnegative, and how many layers have that shape (the projection on its own line)."""
    seen: dict[tuple, dict] = {}
    for name, m in model.named_modules():
        if isinstance(m, Int8Linear):
            proj = name.endswith("out_proj.int8")
            key = (m.in_features, m.out_features, m.nonnegative, proj)
            row = seen.setdefault(key, {"in": key[0], "out": key[1], "nonnegative": key[2],
                                        "projection": proj, "layers": 0})
            row["layers"] += 1
    return list(seen.values())


def time_kernels(k: int, n: int, nonnegative: bool, levels: int, rows: int, reps: int
                 ) -> dict[str, float]:
    """Median microseconds a call of each kernel on (rows, k) x (k, n), calls alternating."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, k, generator=g)
    if nonnegative:
        x = x.relu()
    q = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-3
    layers = {kern: Int8Linear(q, scale, None, levels, nonnegative, kern) for kern in KERNELS}
    times: dict[str, list[float]] = {kern: [] for kern in KERNELS}
    for kern in KERNELS:  # warm-up: each kernel builds its code for this shape once
        layers[kern](x)
    for i in range(reps):
        for kern in KERNELS if i % 2 else KERNELS[::-1]:
            start = time.perf_counter()
            layers[kern](x)
            times[kern].append(time.perf_counter() - start)
    return {kern: 1e6 * statistics.median(t) for kern, t in times.items()}


class _BothKernels(nn.Module):
    """Stands in for the projection's int8 product: runs both kernels on each call, alternating
    which goes first, adds up their seconds, returns fbgemm's result."""

    def __init__(self, layers: dict[str, Int8Linear]):
        super().__init__()
        self.layers = layers
        self.seconds = dict.fromkeys(layers, 0.0)
        self.calls = self.rows = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.rows += x.numel() // x.size(-1)
        order = list(self.layers) if self.calls % 2 else list(self.layers)[::-1]
        out = {}
        for kern in order:
            start = time.perf_counter()
            out[kern] = self.layers[kern](x)
            self.seconds[kern] += time.perf_counter() - start
        return out["fbgemm"]


def search_split(translator, sources: list[list[int]]) -> dict:
    """One search of `sources` with the projection's product timed per kernel (module doc)."""
    proj: Int8Projection = translator.model.out_proj
    plain = proj.int8
    q, scale = quantize_rows(proj.weight)
    both = _BothKernels({kern: Int8Linear(q, scale, None, plain.levels, kernel=kern)
                         for kern in KERNELS})
    proj.int8 = both
    try:
        start = time.perf_counter()
        hyps = translator.search(sources)
        seconds = time.perf_counter() - start
    finally:
        proj.int8 = plain
    return {"calls": both.calls, "rows": both.rows, "search_seconds_with_both": seconds,
            "projection_seconds": both.seconds, "outputs": [h[0].tokens for h in hyps]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a trained model directory")
    p.add_argument("--src", help="also time the projection inside a beam search of this file")
    p.add_argument("--rows", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--early-stop", nargs="+", default=list(EARLY_STOP_RULES),
                   choices=EARLY_STOP_RULES)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, help="write the results as JSON here (refuses to overwrite)")
    a = p.parse_args()
    if a.out is not None and a.out.exists():
        raise SystemExit(f"{a.out} exists; choose another --out")
    if not onednn_int8_supported():
        raise SystemExit("this torch has no oneDNN int8 matmul; nothing to compare")
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator
    from aiayn.errors import UserError

    torch.set_num_threads(a.threads)
    try:
        loaded = load_model(a.model)
        lines = Path(a.src).read_text(encoding="utf-8").splitlines() if a.src else []
    except UserError as e:
        raise SystemExit(str(e)) from None
    except OSError as e:
        raise SystemExit(f"{e.filename}: {e.strerror}") from None
    translator = Translator(loaded, precision="int8")
    levels = translator.model.out_proj.int8.levels
    flags = cpu_flags()
    sys.path.insert(0, str(REPO / "benchmarks"))  # provenance: the commit and the CPU
    from provenance import stamp

    result = {**stamp(), "model": a.model, "threads": a.threads, "levels": levels,
              "projection_kernel": projection_kernel(flags),
              "vnni": "avx512_vnni" in flags, "amx_int8": "amx_int8" in flags,
              "products": [], "searches": []}
    print(f"{levels} activation levels; translate's projection kernel here: "
          f"{result['projection_kernel']}")
    print(f"{'K x N':>14} {'relu in':>7} {'layers':>6} {'rows':>5} {'fbgemm us':>10} "
          f"{'onednn us':>10} {'onednn/fbgemm':>13}")
    for shape in product_shapes(translator.model):
        for rows in a.rows:
            us = time_kernels(shape["in"], shape["out"], shape["nonnegative"], levels, rows,
                              a.reps)
            result["products"].append({**shape, "rows": rows, "us": us})
            label = f"{shape['in']} x {shape['out']}" + (" (proj)" if shape["projection"] else "")
            print(f"{label:>14} {str(shape['nonnegative']):>7} {shape['layers']:>6} {rows:>5} "
                  f"{us['fbgemm']:>10.1f} {us['onednn']:>10.1f} {us['onednn'] / us['fbgemm']:>13.2f}",
                  flush=True)
    if lines:
        sources = translator.prepare(lines)
        for rule in a.early_stop:
            translator = translator.with_settings(early_stop=rule)
            translator.search(sources[:100])  # warm-up
            split = search_split(translator, sources)
            outputs = json.dumps(split.pop("outputs")).encode()  # to compare, not to read
            split["outputs_sha256"] = hashlib.sha256(outputs).hexdigest()
            s = split["projection_seconds"]
            result["searches"].append({"early_stop": rule, **split})
            print(f"search, {rule}: {split['calls']} projection calls, {split['rows']:,} rows; "
                  f"fbgemm {s['fbgemm']:.3f} s, onednn {s['onednn']:.3f} s "
                  f"({s['onednn'] / s['fbgemm']:.2f}x)", flush=True)
    if a.out is not None:
        from aiayn.files import atomic_write

        with atomic_write(a.out) as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
