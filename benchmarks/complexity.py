"""Table 1 measured on this machine: per-layer time, FLOPs and activation memory against the
sequence length n at a fixed width d, for self-attention, restricted self-attention (two r, the
banded kernel of aiayn.model.banded, and the dense masked computation it replaced), a recurrent
layer (torch's GRU), a convolution (kernel 3) and a separable convolution; sequential operations
and maximum path lengths from each kind's connectivity (complexity_paths.py); log-log slopes
beside Table 1's orders; where the curves cross. Writes docs/experiments/complexity.md and .png
and the raw figures to benchmarks/results/complexity.json.

    .venv/bin/python benchmarks/complexity.py          # ~5 minutes
    .venv/bin/python benchmarks/complexity.py --report-only    # redraw from the saved JSON

Each layer runs on one sequence (batch 1 by default), fp32, every core torch uses, with the memory
settings of the `aiayn` command (mimalloc, aiayn/memory.py: without them glibc maps and faults in
every tensor over 32 MiB afresh on each run, which bends the curves at n = 4096). Forward time
is with autograd recording, as in training; backward is timed on its own after it. A point's time
is the minimum over repeats (at least 3 and 0.3 s of runs at small n, fewer where one run takes
longer). FLOPs are counted by torch's FlopCounterMode on the meta device (no arithmetic runs),
attention through its unfused "math" form; "saved MB" is what autograd keeps for the backward
pass (parameters excluded), the activation memory of training. "self-attention (core)" rows time
the attention operation alone, softmax(Q K^T / sqrt(d_k)) V, given Q, K and V: Table 1's
O(n^2 d) counts only that; the layer adds the Q, K, V and output projections, O(n d^2).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
if __name__ == "__main__":  # the memory settings every `aiayn` command runs with, before torch loads
    from aiayn.memory import restart_with_allocator, tune_memory

    restart_with_allocator([sys.executable, *sys.argv])
    tune_memory()

import complexity_paths as paths  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from aiayn.config import BASE  # noqa: E402
from aiayn.files import atomic_write  # noqa: E402
from aiayn.model.attention import MultiHeadAttention  # noqa: E402
from aiayn.model.banded import Band, banded_attention  # noqa: E402

from provenance import commit, cpu_name  # noqa: E402


class Attention(nn.Module):
    """Self-attention as aiayn's encoder runs it (`MultiHeadAttention`: fused Q/K/V projection,
    the attention, W^O), or only its core (`core`: x itself is split into heads as Q = K = V).
    `window` r: restricted; `dense_masked`: restricted by masking the dense n x n scores."""

    def __init__(self, d: int, heads: int, window: int | None = None, core: bool = False,
                 dense_masked: bool = False):
        super().__init__()
        self.mha = MultiHeadAttention(replace(BASE, d_model=d, n_heads=heads), self_attention=True)
        self.h, self.window, self.core, self.dense_masked = heads, window, core, dense_masked

    def mask(self, n: int, device: torch.device) -> Tensor | Band | None:
        if self.window is None:
            return None
        band = Band(self.window, causal=False)
        return band.dense(n, device) if self.dense_masked else band

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        mask = self.mask(n, x.device)
        if not self.core:
            q, k, v = self.mha.project_qkv(x)
            return self.mha.attend(q, k, v, mask)[0]
        q = x.view(b, n, self.h, d // self.h).transpose(1, 2)  # (B, h, n, d/h)
        if isinstance(mask, Band):
            out = banded_attention(q, q, q, mask)
        else:
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, n, d)  # (B, n, d)


class Recurrent(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.rnn = nn.GRU(d, d, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.rnn(x)[0]


class Convolution(nn.Module):
    """A convolution over positions, kernel k, "same" padding; `separable`: depthwise (one k-tap
    filter per channel) then pointwise (d x d), O(k n d + n d^2) (Table 1's note on separable
    convolutions)."""

    def __init__(self, d: int, k: int, separable: bool = False):
        super().__init__()
        if separable:
            self.net = nn.Sequential(nn.Conv1d(d, d, k, padding=k // 2, groups=d), nn.Conv1d(d, d, 1))
        else:
            self.net = nn.Conv1d(d, d, k, padding=k // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.transpose(1, 2)).transpose(1, 2)  # (B, n, d)


# name -> (Table 1's order, builder(d, heads), connectivity for paths, the order's slope in n)
def kinds(r_small: int, r_large: int, k: int) -> dict[str, tuple[str, Callable, object, float]]:
    return {
        "self-attention": ("O(n^2 d)", lambda d, h: Attention(d, h), paths.self_attention(), 2),
        "self-attention (core)": ("O(n^2 d)", lambda d, h: Attention(d, h, core=True), None, 2),
        f"restricted r={r_small}": ("O(r n d)", lambda d, h: Attention(d, h, r_small),
                                   paths.restricted(r_small), 1),
        f"restricted r={r_small} (core)": ("O(r n d)", lambda d, h: Attention(d, h, r_small, True),
                                          None, 1),
        f"restricted r={r_large}": ("O(r n d)", lambda d, h: Attention(d, h, r_large),
                                   paths.restricted(r_large), 1),
        f"restricted r={r_large} (core)": ("O(r n d)", lambda d, h: Attention(d, h, r_large, True),
                                          None, 1),
        f"restricted r={r_small}, dense masked": (
            "O(n^2 d)", lambda d, h: Attention(d, h, r_small, dense_masked=True), None, 2),
        "recurrent (GRU)": ("O(n d^2)", lambda d, h: Recurrent(d), paths.recurrent(), 1),
        f"convolution k={k}": ("O(k n d^2)", lambda d, h: Convolution(d, k), paths.convolution(k), 1),
        f"separable convolution k={k}": ("O(k n d + n d^2)", lambda d, h: Convolution(d, k, True),
                                         paths.convolution(k), 1),
    }


def count_flops(build: Callable, n: int, d: int, batch: int) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs, counted on the meta device."""
    with torch.device("meta"):
        layer = build()
        x = torch.randn(batch, n, d, requires_grad=True)
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as fwd:
        y = layer(x)
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as bwd:
        y.backward(torch.ones_like(y))
    return fwd.get_total_flops(), fwd.get_total_flops() + bwd.get_total_flops()


def saved_bytes(layer: nn.Module, x: Tensor) -> int:
    """Bytes autograd saves for the backward pass (distinct storages, parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return sum(seen.values())


def time_layer(layer: nn.Module, x: Tensor, min_seconds: float) -> tuple[float, float, int]:
    """(forward s, backward s, repeats): minima over repeats after one warm-up run."""
    g = None
    fwd, bwd, spent, reps = math.inf, math.inf, 0.0, 0
    for i in range(1 + 100):
        x.grad = None
        t0 = time.perf_counter()
        y = layer(x)
        t1 = time.perf_counter()
        g = torch.ones_like(y) if g is None else g
        y.backward(g)
        t2 = time.perf_counter()
        if i == 0:
            layer.zero_grad(set_to_none=True)
            if t2 - t0 > 2.0:  # a slow point: the warm-up run stands as one of two repeats
                fwd, bwd, spent, reps = t1 - t0, t2 - t1, t2 - t0, 1
            continue
        fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
        spent, reps = spent + t2 - t0, reps + 1
        layer.zero_grad(set_to_none=True)
        if (reps >= 3 and spent >= min_seconds) or (reps >= 2 and t2 - t0 > 1.0):
            break
    return fwd, bwd, reps


def measure(args: argparse.Namespace) -> dict:
    ns = [2**i for i in range(int(math.log2(args.n_min)), int(math.log2(args.n_max)) + 1)]
    table = kinds(args.r[0], args.r[1], args.k)
    rows: dict[str, dict] = {}
    for name, (order, build, conn, slope) in table.items():
        points = []
        for n in ns:
            torch.manual_seed(0)
            layer = build(args.d, args.heads)
            x = torch.randn(args.batch, n, args.d, requires_grad=True)
            mem = saved_bytes(layer, x)
            fwd, bwd, reps = time_layer(layer, x, args.min_seconds)
            f_fwd, f_all = count_flops(lambda: build(args.d, args.heads), n, args.d, args.batch)
            points.append({"n": n, "fwd_s": fwd, "bwd_s": bwd, "reps": reps, "flops_fwd": f_fwd,
                           "flops": f_all, "saved_mb": mem / 2**20})
            print(f"{name:34s} n={n:5d} fwd {fwd * 1e3:9.2f} ms  bwd {bwd * 1e3:9.2f} ms  "
                  f"{f_all / 1e9:8.2f} GFLOP  {mem / 2**20:8.1f} MB  ({reps} runs)", file=sys.stderr)
        rows[name] = {"order": order, "order_slope": slope, "points": points}
    path_ns = [n for n in ns if n <= args.path_n_max]
    structure = {}
    conns = {name: t[2] for name, t in table.items() if t[2] is not None}
    conns[f"dilated convolution k={args.k}"] = paths.convolution(args.k, dilated=True)
    for name, conn in conns.items():
        stats = [paths.path_lengths(conn, n) for n in path_ns]
        structure[name] = {"n": path_ns, "max_path": [s.max_path for s in stats],
                           "layers": [s.layers for s in stats],
                           "connected": [s.connected for s in stats],
                           "sequential_ops": [paths.sequential_operations(conn, n) for n in path_ns]}
    return {"machine": machine(), "settings": vars(args), "rows": rows, "structure": structure,
            "date": time.strftime("%Y-%m-%d"), "commit": commit()}


def machine() -> str:
    cpu = cpu_name()
    from aiayn.memory import allocator_in_use

    return (f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {allocator_in_use()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--d", type=int, default=512, help="model width d (default 512, the base model's)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--r", type=int, nargs=2, default=[32, 128], help="two restricted windows")
    p.add_argument("--k", type=int, default=3, help="convolution kernel width")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--n-min", type=int, default=16)
    p.add_argument("--n-max", type=int, default=4096)
    p.add_argument("--fit-from", type=int, default=512, help="fit slopes over n >= this")
    p.add_argument("--path-n-max", type=int, default=1024, help="path lengths up to this n")
    p.add_argument("--min-seconds", type=float, default=0.3)
    p.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/complexity.json")
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "experiments")
    p.add_argument("--report-only", action="store_true", help="redraw the docs from --json")
    args = p.parse_args(argv)
    from complexity_report import write_report

    if args.report_only:
        result = json.loads(args.json.read_text())
    else:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        result = measure(argparse.Namespace(**settings))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(args.json) as f:
            f.write(json.dumps(result, indent=1) + "\n")
    write_report(result, args.docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
