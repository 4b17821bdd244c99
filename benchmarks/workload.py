"""The workload every system is measured on: model sizes, training batches, model FLOPs and the
machine's matmul peak. Shared by train_systems.py, decode_systems.py and bench_peers.py so
that every system sees identical configurations and identical batches.

Pure torch + numpy + aiayn (config, special ids, FLOP counting): importable from either venv.

    python benchmarks/workload.py --describe          # the batches and FLOPs per token
    python benchmarks/workload.py --peak --json       # matmul peak on this machine (2 threads)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# torch-free at import (decode_systems.py measures CTranslate2's memory without torch loaded)
from aiayn.config import BASE, BIG, Config  # noqa: E402

VOCAB = 8000  # shared source/target vocabulary, tied embeddings
FIRST_ID = 4  # ids below are the specials PAD=0, UNK=1, BOS=2, EOS=3 (aiayn/special.py)
MAX_TOKENS = 4000  # per side and batch, padding counted: ~4000 target tokens per update
# TINY: d_model 256, 3+3 layers, 4 heads, d_ff 1024 (the size of the multi30k preset); BASE: the
# paper's base model. Both with dropout 0.1 and one shared, tied 8,000-id vocabulary. BIG: the
# paper's big model (P_drop 0.3), for GPUs (train_systems.py --device cuda).
CONFIGS = {"tiny": replace(BASE, n_layers=3, d_model=256, d_ff=1024, n_heads=4, vocab_size=VOCAB),
           "base": replace(BASE, vocab_size=VOCAB),
           "big": replace(BIG, vocab_size=VOCAB)}


def model_config(name: str) -> Config:
    """TINY, BASE or BIG at vocabulary 8000."""
    return CONFIGS[name]


def training_batches(n_pairs: int = 3000, seed: int = 1234, max_tokens: int = MAX_TOKENS,
                     lo: int = 10, hi: int = 40, vocab: int = VOCAB) -> list:
    """Deterministic batches: random ids in [4, vocab), source lengths uniform in [lo, hi], target
    length the source's +-2 (clipped to [lo, hi]) as translation pairs roughly are, batched by
    aiayn's own sampler and collate (similar lengths together, B * (longest + 1) <= max_tokens on
    both sides: ~3% padding), in a seeded random order so that every timing window mixes lengths."""
    from aiayn.data.batching import TokenBatchSampler, collate

    rng = np.random.default_rng(seed)
    src_len = rng.integers(lo, hi + 1, n_pairs)
    tgt_len = np.clip(src_len + rng.integers(-2, 3, n_pairs), lo, hi)
    pairs = [(rng.integers(FIRST_ID, vocab, s), rng.integers(FIRST_ID, vocab, t))
             for s, t in zip(src_len, tgt_len)]
    sampler = TokenBatchSampler(src_len, tgt_len, max_tokens, shuffle=False)
    batches = [collate(pairs, idx) for idx in sampler.epoch_batches()]
    perm = np.random.default_rng(seed + 1).permutation(len(batches))
    return [batches[i] for i in perm]


def mean_lengths(batches: list) -> tuple[float, float]:
    """Mean source and target length per sentence, EOS included (what the model processes)."""
    n = sum(b.src.shape[0] for b in batches)
    return sum(b.n_src_tokens for b in batches) / n, sum(b.n_tgt_tokens for b in batches) / n


def flops_per_token(cfg: Config, batches: list) -> float:
    """Model FLOPs per target token of one training step (forward + backward: 3x forward), for
    this workload's mean lengths. Padding is not counted: it is wasted work, not model FLOPs."""
    from aiayn.model.counting import flops_per_target_token

    s, t = mean_lengths(batches)
    return flops_per_target_token(cfg, s, t, training=True)


# --- the machine's matmul peak ------------------------------------------------------------------

# (M, K, N) products of the two models at ~4000 tokens a batch: QKV/W^O, the FFN's two layers and
# the output projection. The best of these is the practical peak a model could reach.
PEAK_SHAPES = ((4000, 256, 1024), (4000, 1024, 256), (4000, 256, 8000),
               (4000, 512, 512), (4000, 512, 2048), (4000, 2048, 512), (4000, 512, 8000))


def _gflops(m: int, k: int, n: int, dtype, seconds: float) -> float:
    import torch

    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    out = torch.empty(m, n, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up: oneDNN/MKL pick and cache their kernels here
    reps, start = 0, time.perf_counter()
    while True:
        torch.mm(a, b, out=out)
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * m * k * n * reps / elapsed / 1e9


def matmul_peak(threads: int = 2, seconds: float = 0.5, emulated: bool = False) -> dict:
    """Best torch.mm GFLOP/s over PEAK_SHAPES, for fp32 and bf16, on `threads` threads; each shape
    runs for `seconds`. The MFU denominators of the table (fp32 rows against fp32, bf16 rows
    against bf16). bf16 only where the CPU has it natively, or with `emulated`: emulated, one
    product of these shapes takes minutes on an AVX2 EPYC (0.3 GFLOP/s measured), and no row
    would be measured in bf16."""
    import torch

    from aiayn.precision import cpu_has_native_bf16

    torch.set_num_threads(threads)
    res: dict = {"threads": threads, "shapes": {}}
    dtypes = [("fp32", torch.float32)]
    if emulated or cpu_has_native_bf16():
        dtypes.append(("bf16", torch.bfloat16))
    res["native_bf16"] = cpu_has_native_bf16()
    for name, dtype in dtypes:
        per = {f"{m}x{k}x{n}": _gflops(m, k, n, dtype, seconds) for m, k, n in PEAK_SHAPES}
        res["shapes"][name] = {s: round(v, 1) for s, v in per.items()}
        res[f"{name}_gflops"] = round(max(per.values()), 1)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peak", action="store_true", help="measure the matmul peak")
    p.add_argument("--describe", action="store_true", help="describe the batches and FLOPs")
    p.add_argument("--emulated-bf16", action="store_true",
                   help="with --peak: measure bf16 also where the CPU only emulates it")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=float, default=0.5, help="time per matmul shape (default 0.5)")
    p.add_argument("--json", action="store_true", help="one JSON line on stdout")
    a = p.parse_args()
    out: dict = {}
    if a.describe or not a.peak:
        bs = training_batches()
        s, t = mean_lengths(bs)
        pad_t = 1 - sum(b.n_tgt_tokens for b in bs) / sum(b.tgt_out.numel() for b in bs)
        pad_s = 1 - sum(b.n_src_tokens for b in bs) / sum(b.src.numel() for b in bs)
        out["batches"] = {"count": len(bs), "mean_tgt_tokens": sum(b.n_tgt_tokens for b in bs) / len(bs),
                          "mean_src_len": s, "mean_tgt_len": t, "pad_src": pad_s, "pad_tgt": pad_t}
        out["flops_per_tok"] = {c: flops_per_token(model_config(c), bs) for c in CONFIGS}
    if a.peak:
        out["peak"] = matmul_peak(a.threads, a.seconds, a.emulated_bf16)
    print(json.dumps(out) if a.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
