"""What a second OpenMP pool costs torch's small parallel ops: the reason `aiayn serve` loads its
model on a passing thread (`aiayn.serving.batcher.in_passing_thread`).

    .venv/bin/python benchmarks/omp_pools.py              # 2 torch threads
    .venv/bin/python benchmarks/omp_pools.py --threads 4 --calls 5000

Times one small op that torch runs in parallel (LayerNorm over (16, 1, 128), a decoding step's
shape at d_model 128) on a thread that is not the main one, as the server's model worker is, in
three fresh processes:
  only pool          the main thread never ran parallel work: the worker's pool is the only one;
  main ran first     the main thread ran parallel work first (as loading a model does), so its
                     pool lives on beside the worker's;
  passing thread     that first work ran on a thread that ended before the worker started
                     (what `aiayn serve` does).
Prints microseconds per call and the ratio to "only pool". Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time

CASES = ("only pool", "main ran first", "passing thread")


def child(case: str, threads: int, calls: int) -> float:
    import torch

    torch.set_num_threads(threads)
    x, w, b = torch.randn(16, 1, 128), torch.ones(128), torch.zeros(128)

    def first_work() -> None:
        torch.ones(1 << 22).mul_(2.0)  # far above torch's grain size: a parallel region

    if case == "main ran first":
        first_work()
    elif case == "passing thread":
        t = threading.Thread(target=first_work)
        t.start()
        t.join()
        time.sleep(0.5)  # its pool's workers end with it
    took: list[float] = []

    def worker() -> None:
        for _ in range(200):
            torch.nn.functional.layer_norm(x, (128,), w, b)
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.nn.functional.layer_norm(x, (128,), w, b)
        took.append((time.perf_counter() - t0) / calls)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    return took[0] * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--calls", type=int, default=3000, help="timed calls per case (default 3000)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the cases (default 2)")
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(child(args.child, args.threads, args.calls))
        return 0
    us: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            out = subprocess.run([sys.executable, __file__, "--child", case, "--threads",
                                  str(args.threads), "--calls", str(args.calls)],
                                 check=True, capture_output=True, text=True).stdout
            us[case].append(float(out.split()[-1]))
    base = min(us["only pool"])
    print(f"LayerNorm (16, 1, 128) on a worker thread, {args.threads} torch threads, "
          f"{args.calls} calls, best of {args.rounds} rounds")
    print("| case | us per call | vs only pool |")
    print("|---|---:|---:|")
    for case in CASES:
        best = min(us[case])
        print(f"| {case} | {best:.1f} | {best / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
