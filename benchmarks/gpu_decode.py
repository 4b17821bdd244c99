"""Decoding on a GPU: the time of `Translator.translate` per precision, with aiayn's choice of
attention kernels (aiayn/model/attention.py, `decoding_kernels`) and with PyTorch's default, in
one process, on the same sentences; then where the slowest setting spends its time
(torch.profiler).

    python3 benchmarks/gpu_decode.py --model runs/m30k/model --src data/test.src.txt --out DIR

Prints a table and writes it with the profile to DIR/gpu_decode.txt: per setting, the first pass
over the file (what a `translate` run pays: kernels loaded, attention plans built for each new
shape) and the fastest of `--reps` passes after it, sentences/s of that, and how many lines
equal the first row's. Two lines are decoded first (untimed) so that CUDA's own start-up falls
on neither setting; aiayn's choice runs first, so any plan PyTorch's default builds is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from aiayn.data.model_dir import load_model  # noqa: E402
from aiayn.decoding import translate  # noqa: E402
from aiayn.decoding.translate import Translator  # noqa: E402


@contextlib.contextmanager
def kernel_choice(which: str):
    """"aiayn": the project's choice; "torch": PyTorch's own for every call."""
    saved = translate.decoding_kernels
    if which == "torch":
        translate.decoding_kernels = lambda device: contextlib.nullcontext()
    try:
        yield
    finally:
        translate.decoding_kernels = saved


def timed(tr: Translator, lines: list[str], device: torch.device, reps: int
          ) -> tuple[float, float, list[str]]:
    """(first pass's seconds, fastest later pass's, the translations)."""
    times = []
    for _ in range(1 + reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = tr.translate(lines)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times[0], min(times[1:]), out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    args = p.parse_args(argv)
    device = torch.device(args.device)
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.sentences]
    rows, first, slowest = [], None, None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for precision in args.precisions:
        tr = Translator(load_model(args.model, device), precision=precision)
        if first is None:
            tr.translate(lines[:2])
        for which in ("aiayn", "torch"):
            with kernel_choice(which):
                cold, seconds, out = timed(tr, lines, device, args.reps)
            first = first or out
            same = sum(a == b for a, b in zip(out, first))
            rows.append(f"| {precision} | {which} | {cold:.2f} | {seconds:.2f} | "
                        f"{len(lines) / seconds:.1f} | {same} of {len(lines)} |")
            print(rows[-1], flush=True)
            if slowest is None or cold > slowest[0]:
                slowest = (cold, precision, which, tr)
    table = [f"{name}, torch {torch.__version__}, {len(lines)} sentences of {args.src}, "
             f"model {args.model}, beam and length penalty from its config", "",
             "| precision | kernels | first pass, s | later passes, s | sentences/s | lines equal "
             "to row 1's |", "|---|---|---:|---:|---:|---:|", *rows]
    _, precision, which, tr = slowest
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with kernel_choice(which), profile(activities=activities) as prof:
        tr.translate(lines[:200])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    report = "\n".join(table) + (f"\n\nprofile of the slowest first pass ({precision}, {which}), 200 "
                                 f"sentences, by self CPU time:\n"
                                 + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
                                 + f"\nby {key}:\n"
                                 + prof.key_averages().table(sort_by=key, row_limit=10))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_decode.txt").write_text(report + "\n", encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
