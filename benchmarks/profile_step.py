"""Where aiayn's training step spends its time, and what two of its parts cost.

    .venv/bin/python benchmarks/profile_step.py --config base          # torch.profiler table of a step
    .venv/bin/python benchmarks/profile_step.py --config base --parts  # Adam and loss alone
    python3 benchmarks/profile_step.py --config base --device cuda --vocab 37000 --max-tokens 25000

On a GPU the table is sorted by kernel time, and a line says how busy the GPU is (its kernels'
time per step over an unprofiled step's time): well under 100% means the host (Python, kernel
launches, reads back to the host) is what the step waits on, not the GPU.

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
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.argv[1:1] = ["--system", "aiayn"]  # train_systems applies aiayn's memory settings before torch
import torch  # noqa: E402
import train_systems  # noqa: E402

import workload  # noqa: E402

# the harness restarts the process with the allocator it needs, argv and all: drop every copy
while "--system" in sys.argv:
    i = sys.argv.index("--system")
    del sys.argv[i:i + 2]


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


def profile(cfg, device: str, max_tokens: int, lengths: tuple[int, int]) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    train_systems.DEVICE = torch.device(device)
    batches = [b.to(train_systems.DEVICE) for b in workload.training_batches(
        max_tokens=max_tokens, lo=lengths[0], hi=lengths[1], vocab=cfg.vocab_size)[:8]]
    system = train_systems.build_aiayn(cfg, "bf16")
    for b in batches:  # every shape once: oneDNN's kernels exist, as after the first epoch
        system.step(b)
    t = time.perf_counter()
    for b in batches:
        system.step(b)  # returns the loss read from the device: each step ends synchronized
    dt = time.perf_counter() - t
    ms_per_step = dt / len(batches) * 1000
    print(f"{sum(b.n_tgt_tokens for b in batches) / dt:.0f} target tok/s, {ms_per_step:.0f} ms per step")
    gpu = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with torch_profile(activities=activities) as prof:
        for b in batches[:4]:
            system.step(b)
    stats = prof.key_averages()
    if gpu:  # the kernels' own rows (operators' rows repeat their kernels' time)
        from torch.autograd import DeviceType

        kernels = sum(e.self_device_time_total for e in stats if e.device_type == DeviceType.CUDA)
        per_step = kernels / 1e3 / 4
        print(f"GPU kernels {per_step:.1f} ms per step against {ms_per_step:.1f} ms per step "
              f"unprofiled: the GPU is busy about {min(per_step / ms_per_step, 1):.0%} of a step")
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    print(stats.table(sort_by=key, row_limit=25, max_name_column_width=40))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="base", choices=workload.CONFIGS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parts", action="store_true", help="time Adam and the loss alone (CPU)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--vocab", type=int, default=workload.VOCAB, help="shared vocabulary (default 8000)")
    p.add_argument("--max-tokens", type=int, default=workload.MAX_TOKENS,
                   help="tokens per side and batch, padding counted (default 4000)")
    p.add_argument("--lengths", type=int, nargs=2, default=(10, 40), metavar=("LO", "HI"),
                   help="source lengths uniform in [LO, HI] (default 10 40)")
    a = p.parse_args()
    if a.parts and a.device != "cpu":
        p.error("--parts times the CPU's Adam and loss; leave out --device")
    torch.set_num_threads(a.threads)
    cfg = replace(workload.model_config(a.config), vocab_size=a.vocab)
    parts(cfg) if a.parts else profile(cfg, a.device, a.max_tokens, tuple(a.lengths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
