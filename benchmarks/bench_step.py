"""What each CPU fast path of the training step buys, measured in one run on the same batches.

Variants, each a full update (forward, label-smoothed loss, backward, Adam) of one preset:
  reference   torch's F.dropout, the textbook loss (float32 log-softmax over (N, V), gather,
              mean) and PyTorch's own attention kernel choice (its fused flash kernel on a
              CPU): what the step cost before the fast paths;
  +dropout    aiayn's dropout mask from 64-bit random words (aiayn/kernels/dropout.py);
  +loss       ...and the fused, chunked label-smoothed loss (aiayn/kernels/loss.py);
  +attention  ...and PyTorch's unfused (math) SDPA kernel where aiayn's rule
              (aiayn/kernels/attention.py `unfused_training`) says unfused: what `aiayn train`
              ran before its own written-out attention;
  +softmax    ...and that attention written out with its own float32 softmax
              (`training_attention`): the default step, what `aiayn train` runs.
Variants alternate step by step (reference, +dropout, +loss, ..., reference, ...), so
drift of the machine's speed hits them alike; each gets the same batches and the same starting
weights. Prints target tokens/s per variant and the ratios to the reference and to the row above.

    .venv/bin/python benchmarks/bench_step.py --data runs/multi30k-en-de/data --preset translation-tiny-v2
    .venv/bin/python benchmarks/bench_step.py --preset translation-small-v2 --precision fp32  # synthetic
    .venv/bin/python benchmarks/bench_step.py --data runs/g2p-demo/data --preset g2p-small-v2  # the demo's

Run it as a script: like `aiayn train`, it applies aiayn's memory settings and restarts itself once
with mimalloc preloaded (aiayn/memory.py), so the step is timed under the allocator training uses.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiayn.memory import allocator_in_use, restart_with_allocator, tune_memory  # noqa: E402

if __name__ == "__main__":  # as `aiayn train` runs, before torch loads
    restart_with_allocator([sys.executable, *sys.argv])
    tune_memory()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_batching import SyntheticDataset  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import aiayn.kernels.attention as kernel_attention  # noqa: E402
import aiayn.model.attention as attention_module  # noqa: E402
import aiayn.model.layers as layers_module  # noqa: E402
import aiayn.model.transformer as transformer_module  # noqa: E402
import aiayn.training.seq2seq as seq2seq_module  # noqa: E402
from aiayn.data.batching import TokenBatchSampler, collate  # noqa: E402
from aiayn.kernels.loss import NEVER_TARGET  # noqa: E402
from aiayn.model.transformer import Transformer  # noqa: E402
from aiayn.presets import get_preset  # noqa: E402
from aiayn.special import PAD_ID  # noqa: E402
from aiayn.training.distributed import DistEnv  # noqa: E402
from aiayn.training.loss import LossSums  # noqa: E402
from aiayn.training.precision import Precision  # noqa: E402
from aiayn.training.schedule import build_optimizer  # noqa: E402
from aiayn.training.step import Updater  # noqa: E402


def textbook_loss(logits, target, eps, pad_id=PAD_ID) -> LossSums:
    """§5.4 as it is usually written: float32 log-probabilities of every position, autograd."""
    lprobs = torch.log_softmax(logits.reshape(-1, logits.size(-1)).float(), dim=-1)  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != pad_id
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1).masked_fill(~keep, 0.0).sum()
    allowed = torch.ones(lprobs.size(-1), dtype=torch.bool)
    allowed[list(NEVER_TARGET)] = False  # no smoothing mass on PAD and BOS, as aiayn's loss
    uniform = -lprobs[:, allowed].mean(dim=-1).masked_fill(~keep, 0.0).sum()
    return LossSums((1 - eps) * nll + eps * uniform, nll, keep.sum())


def torch_dropout(x, p, training):
    return F.dropout(x, p, training)


def sdpa_math(q, k, v, mask, is_causal, dropout_p):
    """PyTorch's unfused SDPA kernel, the path `training_attention` replaced."""
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=is_causal and mask is None)


@contextlib.contextmanager
def variant(name: str):
    """Swap the fast paths for the reference ones where the model and updater look them up."""
    saved = (layers_module.dropout, transformer_module.dropout, kernel_attention.dropout,
             seq2seq_module.label_smoothed_loss, attention_module.unfused_training,
             attention_module.training_attention)
    if name == "reference":
        layers_module.dropout = transformer_module.dropout = kernel_attention.dropout = torch_dropout
    if name in ("reference", "+dropout"):
        seq2seq_module.label_smoothed_loss = textbook_loss
    if name in ("reference", "+dropout", "+loss"):  # PyTorch's own (flash) kernel at every length
        attention_module.unfused_training = lambda q, k: False
    if name == "+attention":
        attention_module.training_attention = sdpa_math
    try:
        yield
    finally:
        (layers_module.dropout, transformer_module.dropout, kernel_attention.dropout,
         seq2seq_module.label_smoothed_loss, attention_module.unfused_training,
         attention_module.training_attention) = saved


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a dataset made by aiayn prepare (default: synthetic Multi30k-like)")
    p.add_argument("--preset", default="translation-tiny-v2")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="config overrides")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (default 20)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    if args.data:
        from aiayn.data.dataset import ParallelDataset

        ds = ParallelDataset(args.data, "train")
        cfg = ds.info.model_config(get_preset(args.preset))  # its vocabularies, shared or not
    else:
        ds = SyntheticDataset(29000, 10, 40, 8000, seed=0)
        cfg = replace(get_preset(args.preset), vocab_size=8000)
    cfg = cfg.with_overrides(args.set)
    sampler = TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, args.max_tokens, seed=1)
    batches = [collate(ds, b) for b in sampler.epoch_batches(0)[: args.warmup + args.steps]]

    names = ["reference", "+dropout", "+loss", "+attention", "+softmax"]
    torch.manual_seed(1)
    base = Transformer(cfg)
    prec = Precision(args.precision, torch.device("cpu"))
    updaters = {}
    for name in names:
        model = copy.deepcopy(base)
        updaters[name] = Updater(model, build_optimizer(model.parameters(), cfg), cfg, prec, DistEnv())
    times: dict[str, list[float]] = {n: [] for n in names}
    tokens = 0
    for i, b in enumerate(batches):
        for name in names:
            with variant(name):
                t0 = time.perf_counter()
                updaters[name].update([b], i + 1)
                dt = time.perf_counter() - t0
            if i >= args.warmup:
                times[name].append(dt)
        if i >= args.warmup:
            tokens += b.n_tgt_tokens
    deltas = f" --set {' '.join(args.set)}" if args.set else ""
    print(f"preset {args.preset}{deltas}, {prec.name}, {args.threads} threads, {len(times['reference'])} steps "
          f"of ~{args.max_tokens} tokens ({'data ' + args.data if args.data else 'synthetic'}), "
          f"{allocator_in_use()}")
    ref = sum(times["reference"])
    print("| variant | target tok/s | median step (ms) | speed-up vs reference | vs the row above |")
    print("|---|---|---|---|---|")
    above = ref
    for name in names:
        total = sum(times[name])
        print(f"| {name} | {tokens / total:,.0f} | {statistics.median(times[name]) * 1000:.0f} | "
              f"{ref / total:.2f}x | {above / total:.2f}x |")
        above = total
    return 0


if __name__ == "__main__":
    sys.exit(main())
