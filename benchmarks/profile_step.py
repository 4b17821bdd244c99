"""Where aiayn's training step spends its time, and what two of its parts cost.

    .venv/bin/python benchmarks/profile_step.py --config base          # torch.profiler table of a step
    .venv/bin/python benchmarks/profile_step.py --config base --parts  # Adam and loss alone

The step is the peer harness's (benchmarks/train_systems.py, `--system aiayn`), bf16 autocast, on
the workload's batches, after one untimed pass over them (steady state). `--parts` times torch's
fused Adam against its per-parameter Adam on the config's parameter shapes, and aiayn's
label-smoothed loss (forward + backward) on (4000, V) bf16 logits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.argv[1:1] = ["--system", "aiayn"]  # train_systems applies aiayn's memory settings before torch
import torch  # noqa: E402
import train_systems  # noqa: E402

import workload  # noqa: E402

del sys.argv[1:3]


def median_ms(f, n: int = 8) -> float:
    f()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def parts(cfg) -> None:
    from aiayn.model.transformer import Transformer
    from aiayn.training.loss import label_smoothed_loss

    shapes = [p.shape for p in Transformer(cfg).parameters()]
    for fused in (False, True):
        ps = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.Adam(ps, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=False if not fused else None,
                               fused=fused or None)
        print(f"Adam step, {'fused' if fused else 'per-parameter'}: {median_ms(opt.step):.0f} ms "
              f"({sum(p.numel() for p in ps) / 1e6:.1f}M parameters)")
    logits = (torch.randn(4000, cfg.vocab_size) * 2).bfloat16().requires_grad_()
    target = torch.randint(4, cfg.vocab_size, (4000,))

    def loss_step():
        label_smoothed_loss(logits, target, 0.1).smoothed.backward()
        logits.grad = None

    print(f"label-smoothed loss, forward + backward, (4000, {cfg.vocab_size}) bf16: {median_ms(loss_step):.1f} ms")


def profile(cfg) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    batches = workload.training_batches()[:8]
    system = train_systems.build_aiayn(cfg, "bf16")
    for b in batches:  # every shape once: oneDNN's kernels exist, as after the first epoch
        system.step(b)
    t = time.perf_counter()
    for b in batches:
        system.step(b)
    dt = time.perf_counter() - t
    print(f"{sum(b.n_tgt_tokens for b in batches) / dt:.0f} target tok/s, {dt / len(batches) * 1000:.0f} ms per step")
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in batches[:4]:
            system.step(b)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=40))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="base", choices=workload.CONFIGS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parts", action="store_true", help="time Adam and the loss alone")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cfg = workload.model_config(a.config)
    parts(cfg) if a.parts else profile(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
