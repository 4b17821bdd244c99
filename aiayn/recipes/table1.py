"""§4, Table 1 measured on this machine (`aiayn study table1`): per-layer time, FLOPs and
activation memory against the sequence length n at a fixed width d, for self-attention,
restricted self-attention (two r, the banded kernel of aiayn.model.banded, and the dense masked
computation it replaced), a recurrent layer (torch's GRU), a convolution (kernel 3) and a
separable convolution; sequential operations and maximum path lengths from each kind's
connectivity (table1_paths.py); log-log slopes beside Table 1's orders; where the curves cross.
Writes OUT/complexity.json (the raw figures) and, from it, OUT/complexity.md and .png
(table1_report.py); docs/experiments/complexity.md is such a report.

    aiayn study table1 --out runs/table1                  # ~5 minutes
    aiayn study table1 --out runs/table1 --report-only    # redraw from its complexity.json

Each layer runs on one sequence (batch 1 by default), fp32, every core torch uses, with the memory
settings of every `aiayn` command (mimalloc, aiayn/memory.py: without them glibc maps and faults in
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

import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from aiayn.checks import read_json
from aiayn.config import BASE
from aiayn.errors import UserError
from aiayn.files import atomic_write
from aiayn.locks import exclusive_lock
from aiayn.model.attention import MultiHeadAttention
from aiayn.model.banded import Band, banded_attention
from aiayn.recipes import table1_paths as paths
from aiayn.recipes.table1_report import write_report

RESULT_FILE = "complexity.json"


@dataclass(frozen=True)
class Settings:
    """What is measured (`aiayn study table1 --set NAME=VALUE`)."""

    d: int = 512  # model width, the base model's
    heads: int = 8
    r: tuple[int, int] = (32, 128)  # the two restricted windows ("r=32,128")
    k: int = 3  # convolution kernel width
    batch: int = 1
    n_min: int = 16
    n_max: int = 4096
    fit_from: int = 512  # slopes over n >= this
    path_n_max: int = 1024  # path lengths up to this n
    min_seconds: float = 0.3  # of repeats per point, at least 3 of them

    @classmethod
    def from_overrides(cls, items: list[str]) -> Settings:
        """NAME=VALUE items over the defaults; one line naming the bad item otherwise."""
        kinds = {f.name: f for f in fields(cls)}
        values = {}
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or name not in kinds:
                raise UserError(f"--set {item}: expected NAME=VALUE with NAME one of "
                                f"{', '.join(kinds)} (Table 1's settings)")
            try:
                if name == "r":
                    values[name] = tuple(int(x) for x in value.split(","))
                    if len(values[name]) != 2:
                        raise ValueError
                else:
                    values[name] = (float if name == "min_seconds" else int)(value)
            except ValueError:
                raise UserError(f"--set {item}: not a valid {name}"
                                + (" (two windows: r=32,128)" if name == "r" else "")) from None
        s = cls(**values)
        if (min(s.d, s.heads, s.k, s.batch, s.n_min, *s.r) < 1 or s.d % s.heads
                or not (s.n_min <= s.path_n_max and 2 * s.fit_from <= s.n_max)):
            raise UserError(f"--set: Table 1's settings must be positive, d a multiple of heads, "
                            f"n_min <= path_n_max and 2 fit_from <= n_max (got {', '.join(items)})")
        return s


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


def measure(args: Settings, log: Callable[[str], None] = print) -> dict:
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
            log(f"{name:34s} n={n:5d} fwd {fwd * 1e3:9.2f} ms  bwd {bwd * 1e3:9.2f} ms  "
                f"{f_all / 1e9:8.2f} GFLOP  {mem / 2**20:8.1f} MB  ({reps} runs)")
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
    return {"machine": machine(), "settings": {**asdict(args), "r": list(args.r)}, "rows": rows,
            "structure": structure, "date": time.strftime("%Y-%m-%d"), "commit": commit()}


def cpu_name() -> str:
    """The CPU's model name (the platform's processor or architecture where /proc has none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def commit() -> str | None:
    """HEAD of the checkout aiayn runs from, marked when tracked files have uncommitted changes;
    None for an installed copy."""
    def git(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), *a],
                              capture_output=True, text=True)

    try:
        head = git("rev-parse", "--short", "HEAD")
    except OSError:  # no git
        return None
    if head.returncode != 0:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def machine() -> str:
    cpu = cpu_name()
    from aiayn.memory import allocator_in_use

    return (f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
            f"Python {platform.python_version()}, {allocator_in_use()}")


def run(out: str | Path, settings: Settings = Settings(), report_only: bool = False,
        threads: int | None = None, progress: bool = True) -> dict:
    """Measure into OUT/complexity.json (a new or empty OUT), or with `report_only` read it back;
    then write OUT/complexity.md and .png. Returns the measurement."""
    out = Path(out)
    path = out / RESULT_FILE
    with exclusive_lock(out, "aiayn study table1", "wait for it to finish, or choose another --out"):
        if report_only:
            if not path.is_file():
                raise UserError(f"{out} holds no Table 1 measurement ({RESULT_FILE}) to report")
            result = read_json(path, {"settings": dict, "rows": dict, "structure": dict,
                                      "machine": str, "date": str, "?commit": (str, None)})
        else:
            if path.exists():
                raise UserError(f"{out} holds a Table 1 measurement already; --report-only redraws "
                                f"its report, or give another --out")
            if out.is_dir() and any(p for p in out.iterdir() if not p.name.startswith(".")):
                raise UserError(f"{out} is not empty and holds no Table 1 measurement ({RESULT_FILE});"
                                f" a measurement starts in a new or empty --out")
            if threads is not None:
                torch.set_num_threads(threads)
            result = measure(settings, (lambda m: print(m, file=sys.stderr, flush=True))
                             if progress else (lambda m: None))
            out.mkdir(parents=True, exist_ok=True)
            with atomic_write(path) as f:
                f.write(json.dumps(result, indent=1) + "\n")
        write_report(result, out)
    return result
