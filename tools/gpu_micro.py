"""Which redesign of the GPU training step pays, measured before any is built: attention over
padded batches against packed sequences and equal-length buckets, the loss against a fused chunked
output projection, the whole step eager against CUDA graphs. Under 3 minutes on one GPU for base
and big together (`--budget-s`, default 170); the first command of benchmarks/gpu_session.sh.

    python3 tools/gpu_micro.py --config base big --device cuda --out runs/micro.json
    python3 tools/gpu_micro.py --config base --device cuda --data DIR   # DIR: `aiayn prepare`'s
    .venv/bin/python tools/gpu_micro.py --config tiny --dtype fp32 --device cpu --tokens 300 \\
        --vocab 300 --reps 1 --out /tmp/micro.json                         # the CPU test's run

Batches: `--updates` updates (default 4) drawn by aiayn's own sampler and collate
(aiayn.data.batching, similar lengths together, at most `--tokens` padded tokens a side per
update, 25,000 by default as in §5.1; `--accum` micro-batches each), from the train split of a
prepared dataset (`--data`) or from synthetic pairs (`--lengths`): `multi30k`, source lengths
log-normal (sigma 0.35) with Multi30k's measured mean of 14.3 BPE tokens and targets 1.04 times
as long (14.9; docs/experiments/wmt.md), 8,000 ids; `wmt`, log-normal (sigma 0.6) with twice
that mean, targets about as long (a shape assumed, not measured: WMT 2014's pairs are about
twice Multi30k's length), at most 250 tokens, 37,000 ids (the paper's EN-DE vocabulary).

Rows, per `--config` (base and big: the paper's presets; tiny: for the CPU test), each timed
forward + backward, the median of `--reps` after `--warmup` untimed runs (CUDA events on a GPU),
with its speedup against the row marked "today":
- attention: one encoder self-attention, one decoder self-attention and one cross-attention
  over every micro-batch (a step has n_layers of each): `masked`, aiayn's MultiHeadAttention.heads
  over right-padded (B, h, L, d) heads with the model's masks (today); `packed varlen`,
  torch.nn.attention.varlen.varlen_attn over the real tokens only, with their own query and key
  offsets (cu_seq_q, cu_seq_k; causal for the decoder's self-attention); `equal-length buckets`,
  each micro-batch regrouped by exact source length, so no key is ever padding and no mask is
  needed (the decoder's right padding is hidden by its causal mask). Each checks its output on the
  real tokens against today's (max abs diff).
- loss: the output projection and the label-smoothed loss (§5.4) of one update's decoder states,
  forward + backward to the states and the (V, d_model) matrix: `label_smoothed_loss` (today,
  bf16 logits under autocast, then aiayn's loss kernels) against `linear_cross_entropy chunked`,
  torch's fused projection and NLL in row chunks (no (N, V) logits kept) plus the smoothing term,
  which is linear in the states: aiayn's smoothed loss is nll + eps (z_y - mean over the V - 2
  targetable ids of z), and z_y - mean z = h . (W_y - mean W), an (N, d) product. The two must
  agree: the row reports the loss and gradient differences. (linear_cross_entropy's own
  label_smoothing spreads eps over all V ids, not aiayn's V - 2, and `apis` records whether it
  still chunks with label_smoothing on.)
- step: one training step of aiayn's model on one real micro-batch of fixed shape (forward, loss,
  backward, Adam; bf16 autocast with `--dtype bf16`): `eager` (today, aiayn's fused Adam) against
  `CUDA graph`, the same step captured once over fixed buffers (torch.cuda.graph, capturable
  Adam) and replayed, and `reduce-overhead compile`, each layer compiled as `aiayn train
  --compile` does but with mode="reduce-overhead" and a fixed shape (last: it compiles, and is
  skipped with a note when the budget is spent). On a CPU the last two say "needs CUDA".

A row whose API this torch lacks says "unavailable in torch X"; one that raised says "failed"
with the error's first line; one past the budget "skipped". Output: a JSON file (`--out`,
rewritten after every row, so a run cut short keeps what it finished) with the GPU, torch, the
commit and every row, and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import inspect
import json
import math
import signal
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "benchmarks"))  # provenance: the commit and the CPU

import provenance  # noqa: E402  (torch-free)

LENGTHS = {  # synthetic pairs: mean source length (pieces), log-normal sigma, target/source, cap, ids
    "multi30k": {"mean": 14.3, "sigma": 0.35, "ratio": 14.9 / 14.3, "cap": 80, "vocab": 8000},
    "wmt": {"mean": 28.6, "sigma": 0.6, "ratio": 1.0, "cap": 250, "vocab": 37000},
}
SYNTHETIC_PAIRS = 20_000
ATTENTION = ("masked", "packed varlen", "equal-length buckets")
LOSS = ("label_smoothed_loss", "linear_cross_entropy chunked")
STEP = ("eager", "CUDA graph", "reduce-overhead compile")
ROWS = {"attention": ATTENTION, "loss": LOSS, "step": STEP}  # the first of each: today


class OverBudget(Exception):
    """Raised by the alarm when `--budget-s` has run out."""


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


# --- batches ----------------------------------------------------------------------------------


class SyntheticPairs:
    """Pairs of random ids in [4, vocab) with the given lengths (pieces, no specials): what
    aiayn.data.batching.collate reads, `pairs[i] -> (src, tgt)`."""

    def __init__(self, src_lengths, tgt_lengths, vocab: int, seed: int):
        self.src_lengths, self.tgt_lengths, self.vocab, self.seed = src_lengths, tgt_lengths, vocab, seed

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, i: int):
        import numpy as np

        rng = np.random.default_rng([self.seed, i])
        return (rng.integers(4, self.vocab, int(self.src_lengths[i])),
                rng.integers(4, self.vocab, int(self.tgt_lengths[i])))


def synthetic_lengths(kind: str, n: int, limit: int, seed: int):
    """(source, target) piece lengths of n pairs, log-normal as `LENGTHS[kind]` says, each at most
    `limit` - 1 (room for EOS/BOS within the token budget)."""
    import numpy as np

    spec = LENGTHS[kind]
    rng = np.random.default_rng(seed)
    mu = math.log(spec["mean"]) - spec["sigma"] ** 2 / 2  # a log-normal of that mean
    cap = max(1, min(spec["cap"], limit - 1))
    src = np.clip(np.rint(rng.lognormal(mu, spec["sigma"], n)), 1, cap).astype(np.int64)
    ratio = rng.lognormal(math.log(spec["ratio"]), 0.15, n)
    tgt = np.clip(np.rint(src * ratio), 1, cap).astype(np.int64)
    return src, tgt


def draw_updates(a, vocab: int, data_info=None):
    """`a.updates` updates of `a.accum` micro-batches each (aiayn.data.batching.Batch, on the
    CPU), the first of a seeded epoch, and a line saying where they come from."""
    from aiayn.data.batching import TokenBatchSampler, collate
    from aiayn.training.stream import batch_plan

    micro_tokens, accum = batch_plan(a.tokens, 1, a.accum, None)
    if data_info is not None:
        pairs = data_info.split("train")
        src, tgt = pairs.src_lengths, pairs.tgt_lengths
        source = f"the train split of {a.data}"
    else:
        src, tgt = synthetic_lengths(a.lengths, SYNTHETIC_PAIRS, micro_tokens, a.seed)
        pairs = SyntheticPairs(src, tgt, vocab, a.seed)
        source = f"synthetic {a.lengths}-like lengths ({SYNTHETIC_PAIRS:,} pairs, log-normal)"
    sampler = TokenBatchSampler(src, tgt, micro_tokens, seed=a.seed)
    order = sampler.epoch_batches()
    need = a.updates * accum
    if len(order) < need:
        from aiayn.errors import UserError

        raise UserError(f"{source} makes {len(order)} micro-batches of {micro_tokens} tokens; "
                        f"--updates {a.updates} needs {need}")
    batches = [collate(pairs, idx) for idx in order[:need]]
    return [batches[i * accum:(i + 1) * accum] for i in range(a.updates)], source, micro_tokens


def describe(updates) -> dict:
    micro = [b for u in updates for b in u]
    return {"updates": len(updates), "micro_batches": len(micro),
            "sentences": sum(len(b) for b in micro),
            "src_tokens": sum(b.n_src_tokens for b in micro),
            "tgt_tokens": sum(b.n_tgt_tokens for b in micro),
            "padded_src_tokens": sum(b.src.numel() for b in micro),
            "padded_tgt_tokens": sum(b.tgt_out.numel() for b in micro),
            "shapes": [[list(b.src.shape), list(b.tgt_out.shape)] for b in micro]}


# --- timing -----------------------------------------------------------------------------------


class Timer:
    def __init__(self, torch, device, reps: int, warmup: int):
        self.torch, self.cuda = torch, device.type == "cuda"
        self.reps, self.warmup = reps, warmup

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def median_ms(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.reps):
            if self.cuda:
                start = self.torch.cuda.Event(enable_timing=True)
                end = self.torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)


# --- the APIs this torch has ------------------------------------------------------------------


def probe_apis(torch) -> dict:
    """Which of the APIs the redesign would use exist here, with their signatures; and whether
    linear_cross_entropy keeps its chunked path with label_smoothing on (a tiny CPU call)."""
    import torch.nn.functional as F

    v = torch.__version__
    apis = {"torch": v}
    try:
        from torch.nn.attention.varlen import varlen_attn

        apis["varlen_attn"] = {"available": True, "signature": str(inspect.signature(varlen_attn))}
    except ImportError as e:
        apis["varlen_attn"] = {"available": False, "reason": f"unavailable in torch {v} ({first_line(e)})"}
    options = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    if not hasattr(F, "linear_cross_entropy") or options is None:
        apis["linear_cross_entropy"] = {"available": False, "reason": f"unavailable in torch {v}"}
    else:
        entry = {"available": True, "signature": str(inspect.signature(F.linear_cross_entropy)),
                 "options": str(inspect.signature(options))}
        h, w = torch.randn(8, 4), torch.randn(6, 4)
        t = torch.tensor([1, 2, 3, 4, 5, 1, 2, 3])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                F.linear_cross_entropy(h, w, t, label_smoothing=0.1, options=options())
            except Exception as e:  # noted; the loss row says what its own call does
                entry["label_smoothing_error"] = first_line(e)
        fell_back = [str(c.message).splitlines()[0][:200] for c in caught if "options" in str(c.message)]
        entry["chunks_with_label_smoothing"] = not fell_back
        if fell_back:
            entry["label_smoothing_note"] = fell_back[0]
        apis["linear_cross_entropy"] = entry
    apis["cuda_graphs"] = {"available": torch.cuda.is_available(),
                           **({} if torch.cuda.is_available() else {"reason": "needs CUDA"})}
    return apis


# --- attention ----------------------------------------------------------------------------------


def unit_lengths(torch, b):
    """Host (B,) int64 lengths of a micro-batch: source (pieces + EOS), target (BOS + pieces)."""
    from aiayn.special import PAD_ID

    return (b.src != PAD_ID).sum(1), (b.tgt_out != PAD_ID).sum(1)


def cu_seqlens(torch, lengths, device):
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return cu.to(device)


def to_padded(torch, x, lengths, width: int):
    """(N, h, d) packed rows, sentence after sentence -> (B, width, h * d), zeros at padding."""
    b = len(lengths)
    real = torch.arange(width)[None, :] < lengths[:, None]  # (B, width)
    out = x.new_zeros(b, width, x.shape[1] * x.shape[2])
    out[real.to(x.device)] = x.reshape(x.shape[0], -1)
    return out


def from_padded(torch, y, lengths):
    """(B, L, F) -> (N, F): the real rows, sentence after sentence."""
    real = torch.arange(y.shape[1])[None, :] < lengths[:, None]
    return y[real.to(y.device)]


def token_rows(torch, lengths, sentences):
    """Row numbers in the packed (N, ...) tensors of the tokens of `sentences`, in their order."""
    starts = torch.zeros(len(lengths), dtype=torch.int64)
    starts[1:] = lengths.cumsum(0)[:-1]
    return torch.cat([torch.arange(int(starts[i]), int(starts[i] + lengths[i])) for i in sentences])


def heads(x, h: int):
    """(B, L, h * d) -> (B, h, L, d), a view, as aiayn's projections give them."""
    b, l, f = x.shape
    return x.view(b, l, h, f // h).transpose(1, 2)


def varlen_reference(torch, q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):
    """varlen_attn's meaning written out, one sequence at a time with SDPA: what the packed
    layout is checked against where the flash kernel cannot run (a CPU). (N, h, d) -> (N, h, d_v)."""
    import torch.nn.functional as F

    outs = []
    for i in range(len(cu_q) - 1):
        a, b, c, d = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
        o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[c:d].transpose(0, 1),
                                           v[c:d].transpose(0, 1), is_causal=window_size == (-1, 0))
        outs.append(o.transpose(0, 1))  # (L, h, d_v)
    return torch.cat(outs)


def attention_rows(torch, cfg, updates, dtype, device, timer, row, varlen):
    """The three attention layouts over every micro-batch of `updates`: one encoder
    self-attention, one decoder self-attention and one cross-attention each, from the same
    per-token q, k, v (so each layout's output on the real tokens must equal today's)."""
    from aiayn.model.attention import MultiHeadAttention

    mha = MultiHeadAttention(cfg, self_attention=True).to(device).train()
    h, dk, dv = cfg.n_heads, cfg.head_dim_k, cfg.head_dim_v
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(n: int, d: int):  # drawn where they are used: a GPU's are gigabytes at big's size
        return torch.randn(n, h, d, generator=gen, device=device).to(dtype)

    units = []  # per micro-batch, packed (tokens, h, d): q, k, v and the output's gradient
    for b in (b for u in updates for b in u):
        s_len, t_len = unit_lengths(torch, b)
        ns, nt = int(s_len.sum()), int(t_len.sum())
        units.append({"s_len": s_len, "t_len": t_len, "S": b.src.shape[1], "T": b.tgt_out.shape[1],
                      "enc": (rand(ns, dk), rand(ns, dk), rand(ns, dv), rand(ns, dv)),
                      "dec": (rand(nt, dk), rand(nt, dk), rand(nt, dv), rand(nt, dv)),
                      "cross": (rand(nt, dk), rand(ns, dk), rand(ns, dv), rand(nt, dv))})
    real = sum(int(u["s_len"].sum()) + int(u["t_len"].sum()) for u in units)

    def leaf(x):
        return x.detach().requires_grad_()

    def sides(s_len, t_len, S, T):
        """(kind, (query lengths, padded width), (key lengths, padded width)) of the three kinds."""
        src, tgt = (s_len, S), (t_len, T)
        return (("enc", src, src), ("dec", tgt, tgt), ("cross", tgt, src))

    def padded_inputs(u, kinds, rows=None):
        ins, gs = [], []
        for name, (ql, wq), (kl, wk) in kinds:
            q, k, v, g = u[name]
            if rows is not None:  # a bucket's sentences: their token rows, query side and key side
                rq, rk = rows[name]
                q, g, k, v = q[rq], g[rq], k[rk], v[rk]
            ins.append([leaf(to_padded(torch, q, ql, wq)), leaf(to_padded(torch, k, kl, wk)),
                        leaf(to_padded(torch, v, kl, wk))])
            gs.append(to_padded(torch, g, ql, wq))
        return ins, gs

    def heads_run(ins, key_mask):
        (qe, ke, ve), (qd, kd, vd), (qc, kc, vc) = ins
        return [mha.heads(heads(qe, h), heads(ke, h), heads(ve, h), key_mask)[0],
                mha.heads(heads(qd, h), heads(kd, h), heads(vd, h), None, is_causal=True)[0],
                mha.heads(heads(qc, h), heads(kc, h), heads(vc, h), key_mask)[0]]

    # a layout: calls (run() -> outputs, output grads, inputs, outputs -> packed (tokens, F)
    # per kind, None at rows the call does not compute) and the token positions it computes
    def masked_layout():
        calls, computed = [], 0
        for u in units:
            s_len, t_len, S, T = u["s_len"], u["t_len"], u["S"], u["T"]
            key_mask = (torch.arange(S)[None, :] < s_len[:, None]).to(device)[:, None, None, :]  # (B,1,1,S)
            ins, gs = padded_inputs(u, sides(s_len, t_len, S, T))
            computed += len(s_len) * (S + T)

            def packed(outs, s_len=s_len, t_len=t_len):
                return [from_padded(torch, o, ln) for o, ln in zip(outs, (s_len, t_len, t_len))]
            calls.append((lambda ins=ins, m=key_mask: heads_run(ins, m), gs, [x for i in ins for x in i], packed))
        return calls, computed

    def varlen_layout(fn):
        params = inspect.signature(fn).parameters
        causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
        calls = []
        for u in units:
            cs, ct = cu_seqlens(torch, u["s_len"], device), cu_seqlens(torch, u["t_len"], device)
            ms, mt = int(u["s_len"].max()), int(u["t_len"].max())
            ins = [[leaf(x) for x in u[name][:3]] for name in ("enc", "dec", "cross")]
            gs = [u[name][3] for name in ("enc", "dec", "cross")]

            def run(ins=ins, cs=cs, ct=ct, ms=ms, mt=mt):
                (qe, ke, ve), (qd, kd, vd), (qc, kc, vc) = ins
                return [fn(qe, ke, ve, cs, cs, ms, ms), fn(qd, kd, vd, ct, ct, mt, mt, **causal),
                        fn(qc, kc, vc, ct, cs, mt, ms)]
            calls.append((run, gs, [x for i in ins for x in i],
                          lambda outs: [o.reshape(o.shape[0], -1) for o in outs]))
        return calls, real

    def bucket_layout():
        calls, computed = [], 0
        for u in units:
            s_len, t_len = u["s_len"], u["t_len"]
            ns, nt = int(s_len.sum()), int(t_len.sum())
            for s in sorted(set(s_len.tolist())):
                idx = torch.nonzero(s_len == s).flatten().tolist()
                rs = token_rows(torch, s_len, idx).to(device)
                rt = token_rows(torch, t_len, idx).to(device)
                bs, bt = s_len[idx], t_len[idx]
                T = int(bt.max())
                computed += len(idx) * (s + T)
                rows = {"enc": (rs, rs), "dec": (rt, rt), "cross": (rt, rs)}
                ins, gs = padded_inputs(u, sides(bs, bt, s, T), rows)

                def packed(outs, bs=bs, bt=bt, rs=rs, rt=rt, ns=ns, nt=nt):
                    res = []
                    for o, ln, r, n in zip(outs, (bs, bt, bt), (rs, rt, rt), (ns, nt, nt)):
                        full = o.new_full((n, o.shape[-1]), float("nan"))
                        full[r] = from_padded(torch, o, ln)
                        res.append(full)
                    return res
                # no key is padding: no mask (the decoder's causal mask hides its right padding)
                calls.append((lambda ins=ins: heads_run(ins, None), gs, [x for i in ins for x in i], packed))
        return calls, computed

    def fwd_bwd(calls):
        def go():
            for run, gs, ins, _ in calls:
                torch.autograd.grad(run(), ins, gs)
        return go

    def outputs(calls):
        """Each micro-batch's three outputs on its real tokens, float32 (a micro-batch's buckets
        each fill their own rows of one tensor)."""
        with torch.no_grad():
            per = [[o.float() for o in call[3](call[0]())] for call in calls]
        if len(per) == len(units):
            return per
        merged, i = [], 0
        for u in units:
            acc = None
            for _ in set(u["s_len"].tolist()):
                acc = per[i] if acc is None else [torch.where(torch.isnan(x), a, x) for a, x in zip(acc, per[i])]
                i += 1
            merged.append(acc)
        return merged

    reference = []

    def differs(got) -> dict:
        if not reference:
            return {}
        return {"max_abs_diff": max(float((a - b).abs().max()) for ra, rb in zip(reference[0], got)
                                    for a, b in zip(ra, rb))}

    def masked():
        calls, computed = masked_layout()
        reference.append(outputs(calls))
        return {"tokens": real, "computed_tokens": computed, "calls": 3 * len(calls),
                "ms": timer.median_ms(fwd_bwd(calls))}

    def packed():
        if varlen is None:
            return {"status": "unavailable", "reason": f"unavailable in torch {torch.__version__}"}
        if device.type != "cuda":  # check the packing against varlen's meaning, time nothing
            calls, _ = varlen_layout(functools.partial(varlen_reference, torch))
            return {"status": "needs CUDA", "reason": "varlen_attn is flash attention, CUDA only; "
                    "checked: its meaning written out, on the CPU", "tokens": real, **differs(outputs(calls))}
        calls, computed = varlen_layout(varlen)
        return {"tokens": real, "computed_tokens": computed, "calls": 3 * len(calls),
                **differs(outputs(calls)), "ms": timer.median_ms(fwd_bwd(calls))}

    def buckets():
        calls, computed = bucket_layout()
        return {"tokens": real, "computed_tokens": computed, "calls": 3 * len(calls),
                **differs(outputs(calls)), "ms": timer.median_ms(fwd_bwd(calls))}

    row("attention", "masked", masked)
    row("attention", "packed varlen", packed)
    row("attention", "equal-length buckets", buckets)


# --- the loss -----------------------------------------------------------------------------------


def loss_rows(torch, cfg, updates, dtype, device, timer, row, autocast):
    """The output projection and label-smoothed loss of the update's decoder states, forward and
    backward, today's against linear_cross_entropy's chunks plus the smoothing term."""
    import torch.nn.functional as F

    from aiayn.special import BOS_ID, PAD_ID
    from aiayn.training.loss import label_smoothed_loss

    eps, v, d = cfg.eps_ls, cfg.tgt_vocab, cfg.d_model
    gen = torch.Generator(device=device).manual_seed(1)
    weight = torch.nn.Parameter(torch.randn(v, d, generator=gen, device=device) * d ** -0.5)
    cases = []
    for b in (b for u in updates for b in u):
        n = b.tgt_out.numel()
        hidden = torch.randn(n, d, generator=gen, device=device).to(dtype).requires_grad_()
        cases.append((hidden, b.tgt_out.reshape(-1).to(device), b.n_tgt_tokens))
    tokens = sum(c[2] for c in cases)

    def today(hidden, target):
        with autocast():
            logits = F.linear(hidden, weight)  # (N, V), bf16 under bf16 autocast
        return label_smoothed_loss(logits, target, eps).smoothed

    options = getattr(torch.nn, "LinearCrossEntropyOptions", None)

    def chunked(hidden, target):
        w = weight.to(dtype)  # what autocast's F.linear multiplies by
        nll = F.linear_cross_entropy(hidden, w, target, reduction="sum", ignore_index=PAD_ID,
                                     options=options())
        keep = target != PAD_ID
        wf = w.float()
        w_mean = (wf.sum(0) - wf[PAD_ID] - wf[BOS_ID]) / (v - 2)  # (d,): mean over targetable ids
        z_gap = (hidden[keep].float() * (wf[target[keep]] - w_mean)).sum()  # sum of z_y - mean z
        return nll.float() + eps * z_gap

    results = {}
    for name, loss in (("label_smoothed_loss", today), ("linear_cross_entropy chunked", chunked)):
        def measure(name=name, loss=loss):
            if name != "label_smoothed_loss" and (options is None or not hasattr(F, "linear_cross_entropy")):
                return {"status": "unavailable",
                        "reason": f"unavailable in torch {torch.__version__} (linear_cross_entropy)"}
            out = {"tokens": tokens}
            hidden, target, _ = cases[0]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = loss(hidden, target)
                grads = torch.autograd.grad(value, [hidden, weight])
            notes = [str(c.message).splitlines()[0][:200] for c in caught if "linear_cross_entropy" in str(c.message)]
            if notes:
                out["note"] = notes[0]
            value = float(value.detach())
            results[name] = (value, [g.float() for g in grads], cases[0][2])
            if name != "label_smoothed_loss" and "label_smoothed_loss" in results:
                ref, ref_grads, n = results["label_smoothed_loss"]
                out["check"] = {
                    "loss_per_token": [ref / n, value / n],
                    "max_abs_diff_loss_per_token": abs(ref - value) / n,
                    "max_abs_diff_grad_hidden": float((ref_grads[0] - grads[0].float()).abs().max()),
                    "max_abs_diff_grad_weight": float((ref_grads[1] - grads[1].float()).abs().max()),
                    "max_abs_grad_hidden": float(ref_grads[0].abs().max()),
                    "max_abs_grad_weight": float(ref_grads[1].abs().max())}

            def go():
                for hidden, target, _ in cases:
                    torch.autograd.grad(loss(hidden, target), [hidden, weight])
            out["ms"] = timer.median_ms(go)
            return out
        row("loss", name, measure)


# --- the whole step -----------------------------------------------------------------------------


def step_rows(torch, cfg, updates, dtype, device, timer, row, later):
    """One training step on the update's median micro-batch: eager, as a captured CUDA graph;
    the reduce-overhead compile is handed to `later`, to run after every config's other rows."""
    from aiayn.model.build import build_model
    from aiayn.training.loss import label_smoothed_loss
    from aiayn.training.schedule import build_optimizer, lr_at, set_lr

    micro = sorted((b for u in updates for b in u), key=lambda b: b.src.shape[1] + b.tgt_out.shape[1])
    b = micro[len(micro) // 2].to(device)
    scale = 1.0 / b.n_tgt_tokens
    lr = lr_at(cfg, cfg.warmup_steps)
    torch.manual_seed(0)
    initial = build_model(cfg)
    tokens = b.n_src_tokens + b.n_tgt_tokens
    shape = {"tokens": tokens, "shape": [list(b.src.shape), list(b.tgt_out.shape)]}

    def autocast(cache: bool = True):
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)

    def make_step(model, opt, cache=True):
        def step():
            with autocast(cache):
                logits = model(b.src, b.tgt_in)
            (label_smoothed_loss(logits, b.tgt_out, cfg.eps_ls).smoothed * scale).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    def eager():
        model = copy.deepcopy(initial).to(device).train()
        opt = build_optimizer(model.parameters(), cfg)
        set_lr(opt, lr)
        return {**shape, "ms": timer.median_ms(make_step(model, opt))}

    def graphed():
        if device.type != "cuda":
            return {"status": "needs CUDA", "reason": "CUDA graphs need a CUDA device"}
        model = copy.deepcopy(initial).to(device).train()
        opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                               eps=cfg.adam_eps, fused=True, capturable=True)
        step = make_step(model, opt, cache=False)  # autocast's cache must be off under capture
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return {**shape, "ms": timer.median_ms(graph.replay)}

    def compiled():
        if device.type != "cuda":
            return {"status": "needs CUDA", "reason": "reduce-overhead records CUDA graphs"}
        from aiayn.model.layers import DecoderLayer, EncoderLayer

        model = copy.deepcopy(initial).to(device).train()
        for layer in model.modules():
            if isinstance(layer, (EncoderLayer, DecoderLayer)):
                layer.compile(mode="reduce-overhead", dynamic=False)
        opt = build_optimizer(model.parameters(), cfg)
        set_lr(opt, lr)
        step = make_step(model, opt)
        t = time.perf_counter()
        step()
        timer.sync()
        return {**shape, "compile_s": round(time.perf_counter() - t, 1), "ms": timer.median_ms(step)}

    row("step", "eager", eager)
    row("step", "CUDA graph", graphed)
    later(lambda: row("step", "reduce-overhead compile", compiled))


# --- the run ------------------------------------------------------------------------------------


def table(report: dict) -> str:
    lines = [f"gpu_micro: {report['device_name']}, torch {report['torch']}, {report['dtype']}; "
             f"{report['batches']['source']}, {report['tokens']:,} tokens an update",
             provenance.stamp_line(report) if hasattr(provenance, "stamp_line")
             else f"Commit: {report.get('commit')}", "",
             "| config | part | variant | ms | speedup | tokens | check | note |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["rows"]:
        ms = f"{r['ms']:.2f}" if "ms" in r else r["status"]
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        check = r.get("max_abs_diff")
        if "check" in r:
            c = r["check"]
            check = f"loss {c['max_abs_diff_loss_per_token']:.2g}/tok, grad {c['max_abs_diff_grad_hidden']:.2g}"
        check = f"{check:.2g}" if isinstance(check, float) else (check or "")
        note = r.get("reason") or r.get("note") or ""
        lines.append(f"| {r['config']} | {r['part']} | {r['variant']} | {ms} | {speed} | "
                     f"{r.get('tokens', '')} | {check} | {note} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", nargs="+", default=["base", "big"], choices=["base", "big", "tiny"],
                   help="the paper's presets (base, big) or tiny, for the CPU test (default: base big)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                   help="bf16: autocast as `aiayn train --precision bf16` (default); fp32")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--data", type=Path, help="a dataset directory made by `aiayn prepare` (its train split)")
    p.add_argument("--lengths", default="wmt", choices=sorted(LENGTHS),
                   help="without --data: synthetic pairs of these lengths (default wmt)")
    p.add_argument("--vocab", type=int, help="ids of the synthetic pairs (default: 37000 wmt, 8000 multi30k)")
    p.add_argument("--tokens", type=int, default=25_000, help="tokens a side per update (default 25000)")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per update (default 1)")
    p.add_argument("--updates", type=int, default=4, help="updates drawn (default 4)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--reps", type=int, default=10, help="timed runs per row (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs before them (default 2)")
    p.add_argument("--budget-s", type=float, default=170.0,
                   help="skip the rows left after this many seconds (default 170)")
    p.add_argument("--out", type=Path, help="the JSON report")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    from aiayn.errors import UserError

    try:
        if a.data is not None and not a.data.is_dir():
            raise UserError(f"{a.data}: no such dataset directory; run aiayn prepare")
        if min(a.tokens, a.accum, a.updates, a.reps) < 1 or a.warmup < 0:
            raise UserError("--tokens, --accum, --updates and --reps must be >= 1, --warmup >= 0")
        if a.out is not None:
            from aiayn.files import check_writable

            check_writable(a.out, a.overwrite)
        return run(a)
    except UserError as e:
        print(f"gpu_micro: error: {e}", file=sys.stderr)
        return 2


def run(a) -> int:
    started = time.monotonic()
    import torch

    from aiayn.config import BASE, PRESETS
    from aiayn.errors import UserError

    if a.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: this torch sees no CUDA device; use --device cpu")
    device = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    data_info = None
    if a.data is not None:
        from aiayn.data.dataset import load_dataset_dir

        data_info = load_dataset_dir(a.data)
    vocab = a.vocab or LENGTHS[a.lengths]["vocab"]
    if data_info is None and vocab < 5:
        raise UserError(f"--vocab {vocab}: needs the 4 special ids and at least one piece")
    updates, source, micro_tokens = draw_updates(a, vocab, data_info)
    fields = provenance.stamp() if hasattr(provenance, "stamp") else {
        "commit": provenance.commit(), "machine": provenance.cpu_name()}
    report = {"script": "tools/gpu_micro.py", **fields, "cpu": provenance.cpu_name(),
              "device": a.device,
              "device_name": torch.cuda.get_device_name() if device.type == "cuda" else provenance.cpu_name(),
              "torch": torch.__version__, "dtype": a.dtype, "reps": a.reps, "warmup": a.warmup,
              "budget_s": a.budget_s, "tokens": a.tokens, "micro_batch_tokens": micro_tokens,
              "apis": probe_apis(torch),
              "batches": {"source": source, **({} if data_info else {"vocab": vocab}), **describe(updates)},
              "rows": []}

    def save() -> None:
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        if a.out is not None:
            from aiayn.files import atomic_write

            with atomic_write(a.out) as f:
                json.dump(report, f, indent=1)

    # the budget: rows not begun by the deadline are skipped; the alarm cuts short the one under
    # way (only while a row measures: never in the middle of writing the report)
    deadline = started + a.budget_s
    measuring = [False]

    def expire(*_):
        if measuring[0]:
            raise OverBudget()

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))
    config_name = [None]

    def row(part: str, variant: str, measure) -> None:
        entry = {"config": config_name[0], "part": part, "variant": variant}
        if variant == ROWS[part][0]:
            entry["today"] = True
        if measure is None or time.monotonic() >= deadline:
            entry.update(status="skipped", reason=f"over --budget-s {a.budget_s:g}")
        else:
            try:
                measuring[0] = True
                try:
                    result = measure()
                finally:
                    measuring[0] = False
                entry.update({"status": "ok", **result} if "status" not in result else result)
            except OverBudget:
                entry.update(status="skipped", reason=f"over --budget-s {a.budget_s:g} (cut short)")
            except Exception as e:  # a kernel this GPU or torch refuses: the row says so, others go on
                entry.update(status="failed", reason=first_line(e))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        today = next((r for r in report["rows"] if r["config"] == entry["config"] and r["part"] == part
                      and r.get("today") and "ms" in r), None)
        if "ms" in entry:
            if today is not None:
                entry["speedup"] = round(today["ms"] / entry["ms"], 3)
            entry["ms"] = round(entry["ms"], 3)
        report["rows"].append(entry)
        print(f"{entry['config']} {part} {variant}: "
              f"{str(entry['ms']) + ' ms' if 'ms' in entry else entry['status']}"
              f"{' - ' + entry['reason'] if 'reason' in entry else ''}", file=sys.stderr, flush=True)
        save()

    try:
        from torch.nn.attention.varlen import varlen_attn as varlen
    except ImportError:
        varlen = None
    timer = Timer(torch, device, a.reps, a.warmup)

    def autocast():
        return (contextlib.nullcontext() if dtype == torch.float32
                else torch.autocast(device.type, dtype=dtype))

    compile_rows: list = []
    for name in a.config:
        config_name[0] = name
        cfg = replace(BASE, n_layers=2, d_model=64, d_ff=128, n_heads=4) if name == "tiny" else PRESETS[name]
        cfg = data_info.model_config(cfg) if data_info is not None else replace(cfg, vocab_size=vocab)
        cfg = replace(cfg, max_tokens=a.tokens)
        later = functools.partial(lambda n, fn: compile_rows.append((n, fn)), name)
        parts = ((attention_rows, (varlen,)), (loss_rows, (autocast,)), (step_rows, (later,)))
        for part, (rows, extra) in zip(ROWS, parts):
            if time.monotonic() >= deadline:  # not even the set-up of the part's tensors
                for variant in ROWS[part]:
                    row(part, variant, None)
                continue
            try:
                rows(torch, cfg, updates, dtype, device, timer, row, *extra)
            except Exception as e:  # in a part's set-up (its tensors, its model): its rows failed
                done = {r["variant"] for r in report["rows"] if r["config"] == name and r["part"] == part}
                for variant in ROWS[part]:
                    if variant not in done:
                        row(part, variant, lambda e=e: {"status": "failed", "reason": first_line(e)})
    for name, add in compile_rows:
        config_name[0] = name
        add()
    signal.setitimer(signal.ITIMER_REAL, 0)
    save()
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
