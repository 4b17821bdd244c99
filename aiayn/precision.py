"""`--precision auto`: one meaning for every command that computes (train, translate, parse,
serve, attention, evaluate, demo, study), and the default of `Translator` in Python too
(docs/guides/decoding.md), so that a program and a command decode a model alike.

`auto` is bf16 where the hardware multiplies bf16 natively (a GPU with bf16 tensor cores, or a
CPU with AVX512-BF16 or AMX), else fp32, the paper's arithmetic. What bf16 means stays each
command's own: autocast with fp32 weights in training and teacher-forced scoring
(aiayn/training/precision.py), weights cast once in decoding (aiayn/decoding/precision.py).
Measured: bf16 was faster than fp32 in training and decoding on every kind of CPU with native
bf16 tried, and emulated, so slower than fp32, on CPUs without it (the machines and figures:
docs/experiments/performance.md, docs/experiments/decoding.md).
"""

from __future__ import annotations

import torch


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matrix products several times faster than fp32; without them
    bf16 is emulated and slower than fp32, on AVX-512 without BF16 as on AVX2 (measured per
    machine in docs/experiments/decoding.md). Asks
    the CPU's own flags: oneDNN's `_is_mkldnn_bf16_supported` also says yes where it only
    emulates bf16 on AVX-512."""
    cpu = torch.cpu
    try:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without these probes: ask oneDNN
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            return False


def gpu_has_native_bf16(device: torch.device) -> bool:
    """A CUDA device with bf16 tensor cores (Ampere or newer); older GPUs only emulate bf16."""
    return (torch.cuda.is_available()
            and torch.cuda.is_bf16_supported(including_emulation=False))


def auto_precision(device: torch.device | str) -> str:
    """What `auto` means on `device`: "bf16" where it multiplies bf16 natively, else "fp32".
    Never fp16 (it needs loss scaling in training, a choice to make knowingly) nor int8 (not
    the paper's arithmetic, and not faster end to end where measured)."""
    device = torch.device(device)
    native = gpu_has_native_bf16(device) if device.type == "cuda" else cpu_has_native_bf16()
    return "bf16" if native else "fp32"
