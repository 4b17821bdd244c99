"""Training throughput of aiayn and of the peers a user would pick instead, one system per
process. Each system builds the model with its own code at the workload's dims
(benchmarks/workload.py), then runs full training steps on the same batches in the same order:
forward, label-smoothed (0.1) loss over non-padding targets, backward, Adam(0.9, 0.98, 1e-9) step.
An untimed pass over the timed batches comes first (every epoch of training after the first
repeats its batch shapes; `--cold` times new shapes); tokens/s is the median over timed windows.

    .venv-peers/bin/python benchmarks/train_systems.py --system marian --config tiny \\
        --precision bf16 --threads 2 --json
    python3 benchmarks/train_systems.py --system aiayn --config big --device cuda --precision bf16 \
        --vocab 37000 --max-tokens 12500 --lengths 10 60 --peak-tflops 989.4 --json   # a GPU

Systems and what was set to bring each close to the paper's model (§3; aiayn is the paper's model
with bias-free Q/K/V/O projections and no final stack norm; dropout 0.1 on sub-layer outputs and
embedding sums, none on attention weights or FFN activations, everywhere):
  aiayn    aiayn's own training step (`Updater`), exactly as `aiayn train` builds it.
  torch    torch.nn.Transformer, post-norm (its default); its stacks are passed in without the
           final LayerNorm nn.Transformer adds by default (the paper has none); Q/K/V/O and FFN
           biases on (its `bias` switch would also drop the LayerNorm biases); its dropout on
           attention weights and FFN activations set to 0 on the modules (no option for it); our
           shared embedding scaled by sqrt(d_model), interleaved sinusoids, tied output layer;
           torch Adam.
  marian   HF MarianMTModel from a MarianConfig: post-norm, relu, scaled embeddings, sinusoids
           (sin and cos halves concatenated, not interleaved), shared and tied embeddings; Q/K/V/O
           biases always on; attention and activation dropout 0; torch Adam.
  fairseq  `--arch transformer` through fairseq's own option parser and TranslationTask,
           --share-all-embeddings: post-norm, relu, scaled embeddings, sinusoids (halves
           concatenated), attention and activation dropout 0, Q/K/V/O biases always on; its
           label_smoothed_cross_entropy criterion and its own Adam, as fairseq-train runs them.
  opennmt  OpenNMT-py transformer: always pre-norm with a final LayerNorm per stack (no option
           for post-norm); -add_qkvbias off as in the paper, -add_ffnbias on (Eq. 2; off by
           default); FFN-activation dropout set to 0 on the modules (it reuses -dropout);
           interleaved sinusoids; shared and tied embeddings, but its generator keeps a bias;
           relu; its own Optimizer wrapper around torch Adam.
Precision: fp32 everywhere, or bf16 autocast (`torch.autocast(device, torch.bfloat16)`) around the
forward pass; the loss is taken in fp32. `--device cuda` runs aiayn and torch on a GPU (the other
peers are CPU-only here) and reports peak GPU memory and MFU against `--peak-tflops`. aiayn's bf16 row is its precision "auto" (bf16 autocast
on a CPU with native bf16).
aiayn's rows run with aiayn/memory.py's process settings (mimalloc preloaded, freed memory kept in
the process, torch on transparent huge pages), as every `aiayn` command does; the peers run with
the defaults their users get (glibc's malloc). Wrapping a peer's forward in autocast is our
choice, not an option of fairseq's or OpenNMT-py's (their bf16/fp16 switches are for GPUs).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import logging
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from aiayn.memory import restart_with_allocator, tune_memory

# aiayn runs as `aiayn train` does, with aiayn/memory.py's settings, which must precede torch's load
_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--system")
if _early.parse_known_args()[0].system == "aiayn":
    restart_with_allocator([sys.executable, *sys.argv])  # mimalloc, as the `aiayn` command runs
    tune_memory()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aiayn.config import Config  # noqa: E402
from aiayn.data.batching import Batch  # noqa: E402
from aiayn.special import PAD_ID  # noqa: E402
from aiayn.training.schedule import set_lr  # noqa: E402

import workload  # noqa: E402

EPS_LS = 0.1
BETAS, ADAM_EPS = (0.9, 0.98), 1e-9
LR = 1e-4  # constant and small: the step's cost does not depend on it, the weights stay sane
DEVICE = torch.device("cpu")  # set once by main (--device) before any system is built


@dataclass
class System:
    """A built model with its one-update function. `step(batch)` returns the loss per token.
    `set_lr(lr)` sets the rate of the next steps (else LR throughout); `logits(batch)` is the
    system's own forward pass, (B, T, V) logits over *our* ids, for evaluation: the caller sets
    eval mode, no_grad and autocast (benchmarks/bench_quality.py)."""

    step: Callable[[Batch], float]
    model: nn.Module
    set_lr: Callable[[float], None]
    logits: Callable[[Batch], torch.Tensor]
    notes: str = ""
    extra: dict = field(default_factory=dict)


# this harness's precision names -> aiayn's --precision
AIAYN_PRECISIONS = {"fp32": "fp32", "bf16": "auto"}


def autocast(precision: str):
    if precision == "bf16":
        return torch.autocast(DEVICE.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def smoothed_ce_sum(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Label-smoothed cross-entropy summed over non-PAD targets, in fp32 whatever the logits are;
    eps is spread over the whole vocabulary (aiayn: over the V - 2 ids other than PAD and BOS;
    fairseq: over the V - 1 other ids), which changes the loss's value, not its cost."""
    V = logits.size(-1)
    return F.cross_entropy(logits.float().reshape(-1, V), target.reshape(-1), ignore_index=PAD_ID,
                           label_smoothing=EPS_LS, reduction="sum")


def torch_adam(model: nn.Module) -> torch.optim.Adam:
    """torch Adam; its fused kernel on a GPU (the best configuration a GPU user would pick)."""
    fused = True if DEVICE.type == "cuda" else None
    return torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=ADAM_EPS, fused=fused)


def plain_step(model: nn.Module, opt: torch.optim.Optimizer, precision: str,
               logits_of: Callable[[Batch], torch.Tensor]) -> Callable[[Batch], float]:
    """The usual loop body: forward under autocast, fp32 loss normalised by target tokens,
    backward, optimizer step."""

    def step(b: Batch) -> float:
        model.train()
        with autocast(precision):
            logits = logits_of(b)  # (B, T, V)
        loss = smoothed_ce_sum(logits, b.tgt_out) / b.n_tgt_tokens
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


# --- aiayn --------------------------------------------------------------------------------------


def build_aiayn(cfg: Config, precision: str, compile: bool = False, seed: int = 1) -> System:
    """What `aiayn train` runs per update, built as Trainer.__init__ builds it (keep in step with
    aiayn/training/trainer.py): seeded Transformer, dropout stream seeded per rank, Precision,
    build_optimizer, optionally each layer compiled (`compile_for_training`, as `aiayn train
    --compile`), Updater on a single-process DistEnv, one micro-batch per update. The Updater
    sets Eq. 3's rate itself from `cfg` and its step count; `set_lr` only states the rate the
    caller expects, and the next step fails if the Updater used another."""
    from aiayn.model.transformer import Transformer
    from aiayn.training.distributed import DistEnv, rank_seed
    from aiayn.training.precision import Precision
    from aiayn.training.schedule import build_optimizer
    from aiayn.training.step import Updater, compile_for_training

    env = DistEnv(device=DEVICE)
    torch.manual_seed(seed)
    model = Transformer(cfg).to(env.device)
    torch.manual_seed(rank_seed(seed, env.rank))
    prec = Precision(AIAYN_PRECISIONS[precision], env.device)
    optimizer = build_optimizer(model.parameters(), cfg)
    stepped = compile_for_training(model) if compile else model
    updater = Updater(stepped, optimizer, cfg, prec, env)
    counter = itertools.count(1)
    expected: list[float] = []  # the rate the caller set for the next step, if any

    def step(b: Batch) -> float:
        r = updater.update([b], next(counter))
        if expected and not math.isclose(r.lr, expected.pop(), rel_tol=1e-12):
            raise RuntimeError(f"aiayn's Updater used lr {r.lr}, the caller's schedule says otherwise")
        return r.loss

    def expect_lr(lr: float) -> None:
        expected[:] = [lr]

    return System(step, model, expect_lr, lambda b: model(b.src, b.tgt_in),
                  f"aiayn Updater, precision {prec.name}" + (", compiled" if compile else ""),
                  {"precision_resolved": prec.name, "compiled": compile})


# --- torch.nn.Transformer -----------------------------------------------------------------------


class TorchSeq2Seq(nn.Module):
    """nn.Transformer with what it lacks for translation: one shared embedding scaled by
    sqrt(d_model) (§3.4), sinusoidal positions (§3.5), dropout on their sum, tied output layer."""

    def __init__(self, cfg: Config):
        super().__init__()
        d, N = cfg.d_model, cfg.n_layers
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, 0.0, d**-0.5)
        self.scale = d**0.5
        pos = torch.arange(1024).unsqueeze(1)  # (P, 1)
        freq = torch.exp(torch.arange(0, d, 2) * (-torch.log(torch.tensor(10000.0)) / d))  # (d/2,)
        pe = torch.zeros(1024, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)  # interleaved
        self.register_buffer("pe", pe, persistent=False)
        self.drop = nn.Dropout(cfg.p_drop)
        layer = dict(d_model=d, nhead=cfg.n_heads, dim_feedforward=cfg.d_ff, dropout=cfg.p_drop,
                     batch_first=True, norm_first=False)
        # Passing the stacks ourselves drops the final LayerNorm nn.Transformer puts on each.
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), N, norm=None,
                                    enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer), N, norm=None)
        self.transformer = nn.Transformer(d, cfg.n_heads, custom_encoder=enc, custom_decoder=dec,
                                          batch_first=True)
        # Its one `dropout` also drops attention weights and FFN activations; the paper (and every
        # other system here) does neither, and both cost time, so those two are switched off.
        for m in self.modules():
            if isinstance(m, nn.MultiheadAttention):
                m.dropout = 0.0
            elif isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
                m.dropout.p = 0.0  # used only between the FFN's two layers (_ff_block)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(ids) * self.scale + self.pe[: ids.size(1)])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        pad = src == PAD_ID  # (B, S): torch's key_padding_mask means True = ignore
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)  # (T, T)
        h = self.transformer(self._embed(src), self._embed(tgt_in), tgt_mask=causal,
                             src_key_padding_mask=pad, memory_key_padding_mask=pad,
                             tgt_is_causal=True)  # (B, T, d)
        return F.linear(h, self.embed.weight)  # (B, T, V)


def build_torch(cfg: Config, precision: str, seed: int = 1, compile: bool = False) -> System:
    torch.manual_seed(seed)
    model = TorchSeq2Seq(cfg).to(DEVICE)
    opt = torch_adam(model)
    stepped = model
    if compile:
        from aiayn.training.step import compile_layers

        # each encoder and decoder layer compiled in place, as aiayn's are (PyTorch's "regional
        # compilation"): the whole model under torch.compile(dynamic=True) never finished
        # compiling within 140-160 s on one H100 (docs/experiments/wmt.md)
        compile_layers(model, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer))

    def logits_of(b: Batch) -> torch.Tensor:
        return stepped(b.src, b.tgt_in)

    step = plain_step(model, opt, precision, logits_of)
    return System(step, model, functools.partial(set_lr, opt), logits_of,
                  "nn.Transformer post-norm, no final stack norms, biases on"
                  + (", compiled by layer" if compile else ""), {"compiled": compile})


# --- Hugging Face Marian ------------------------------------------------------------------------


def build_marian(cfg: Config, precision: str, seed: int = 1) -> System:
    from transformers import MarianConfig, MarianMTModel

    from aiayn.special import BOS_ID, EOS_ID

    torch.manual_seed(seed)
    mc = MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.n_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        activation_function="relu",  # the paper's FFN (Marian's default is gelu)
        dropout=cfg.p_drop, attention_dropout=0.0, activation_dropout=0.0,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None, max_position_embeddings=1024)
    model = MarianMTModel(mc)
    model.config.use_cache = False  # training: no KV cache to build

    def logits_of(b: Batch) -> torch.Tensor:
        return model(input_ids=b.src, attention_mask=(b.src != PAD_ID).long(),
                     decoder_input_ids=b.tgt_in, use_cache=False).logits

    opt = torch_adam(model)
    step = plain_step(model, opt, precision, logits_of)
    return System(step, model, functools.partial(set_lr, opt), logits_of,
                  f"MarianMTModel, attention {model.config._attn_implementation}",
                  {"attn_implementation": model.config._attn_implementation})


# --- fairseq ------------------------------------------------------------------------------------


def _fairseq_ids(t: torch.Tensor) -> torch.Tensor:
    """Our special ids (PAD 0, UNK 1, BOS 2, EOS 3) to fairseq's Dictionary order (<s> 0, <pad> 1,
    </s> 2, <unk> 3); ordinary ids (>= 4) are the same in both."""
    return torch.tensor([1, 3, 0, 2], dtype=t.dtype)[t.clamp(max=3)].where(t < 4, t)


def _fairseq_sample(b: Batch) -> dict:
    """A batch as fairseq's criterion takes it, in its ids."""
    src, tgt_in, tgt_out = (_fairseq_ids(t) for t in (b.src, b.tgt_in, b.tgt_out))
    # fairseq starts the decoder with </s>, not a separate BOS
    prev = torch.where(tgt_in == 0, torch.full_like(tgt_in, 2), tgt_in)
    return {"net_input": {"src_tokens": src, "src_lengths": (b.src != PAD_ID).sum(1),
                          "prev_output_tokens": prev},
            "target": tgt_out, "ntokens": b.n_tgt_tokens, "nsentences": len(b.src)}


def build_fairseq(cfg: Config, precision: str, seed: int = 1) -> System:
    from fairseq import optim, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    # TranslationTask reads its dictionaries from the data directory: write a 7996-word one (its
    # 4 specials make the vocabulary 8000).
    data = tempfile.mkdtemp(prefix="bench-fairseq-")
    for lang in ("src", "tgt"):
        with open(os.path.join(data, f"dict.{lang}.txt"), "w") as f:
            f.writelines(f"w{i} 1\n" for i in range(workload.FIRST_ID, cfg.vocab_size))
    d, ff, N, h = str(cfg.d_model), str(cfg.d_ff), str(cfg.n_layers), str(cfg.n_heads)
    argv = [data, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
            "--arch", "transformer", "--share-all-embeddings",
            "--encoder-embed-dim", d, "--decoder-embed-dim", d,
            "--encoder-ffn-embed-dim", ff, "--decoder-ffn-embed-dim", ff,
            "--encoder-layers", N, "--decoder-layers", N,
            "--encoder-attention-heads", h, "--decoder-attention-heads", h,
            "--dropout", str(cfg.p_drop), "--attention-dropout", "0", "--activation-dropout", "0",
            "--activation-fn", "relu",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(EPS_LS),
            "--optimizer", "adam", "--adam-betas", str(BETAS), "--adam-eps", str(ADAM_EPS),
            "--lr", str(LR), "--cpu", "--seed", str(seed)]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    fcfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(seed)
    task = tasks.setup_task(fcfg.task)
    model = task.build_model(fcfg.model)
    criterion = task.build_criterion(fcfg.criterion)
    opt = optim.build_optimizer(fcfg.optimizer, [p for p in model.parameters() if p.requires_grad])
    assert len(task.source_dictionary) == cfg.vocab_size

    # column j of our logits is column ours_to_fairseq[j] of fairseq's
    ours_to_fairseq = _fairseq_ids(torch.arange(cfg.vocab_size))

    def step(b: Batch) -> float:
        sample = _fairseq_sample(b)
        model.train()
        criterion.train()
        with autocast(precision):
            loss, sample_size, _ = criterion(model, sample)
        # as fairseq's Trainer: backward the summed loss, then scale gradients by 1/sample_size
        opt.backward(loss)
        opt.multiply_grads(1.0 / sample_size)
        opt.step()
        opt.zero_grad()
        return loss.item() / sample_size

    def logits_of(b: Batch) -> torch.Tensor:
        out, _ = model(**_fairseq_sample(b)["net_input"])  # (B, T, V) in fairseq's id order
        return out.index_select(-1, ours_to_fairseq)

    return System(step, model, opt.set_lr, logits_of,
                  "fairseq transformer arch, its criterion and Adam",
                  {"optimizer": type(opt._optimizer).__module__ + "." + type(opt._optimizer).__name__})


# --- OpenNMT-py ---------------------------------------------------------------------------------


def build_opennmt(cfg: Config, precision: str, seed: int = 1) -> System:
    import pyonmttok
    from onmt.constants import DefaultTokens
    from onmt.model_builder import build_model
    from onmt.opts import train_opts
    from onmt.utils.optimizers import Optimizer
    from onmt.utils.parse import ArgumentParser

    d, ff, N, h = str(cfg.d_model), str(cfg.d_ff), str(cfg.n_layers), str(cfg.n_heads)
    parser = ArgumentParser(description="bench")
    train_opts(parser)
    # -data and -src_vocab are required by the parser but unused: we hand it batches and a vocab.
    argv = ["-data", "{}", "-src_vocab", "unused",
            "-encoder_type", "transformer", "-decoder_type", "transformer",
            "-position_encoding", "-position_encoding_type", "SinusoidalInterleaved",
            "-layers", N, "-hidden_size", d, "-word_vec_size", d, "-transformer_ff", ff,
            "-heads", h, "-share_embeddings", "-share_decoder_embeddings",
            "-dropout", str(cfg.p_drop), "-attention_dropout", "0.0",
            "-pos_ffn_activation_fn", "relu", "-layer_norm", "standard", "-norm_eps", "1e-6",
            "-add_ffnbias",  # Eq. 2 has b1 and b2; its default leaves them out
            "-self_attn_type", "scaled-dot",
            "-param_init", "0", "-param_init_glorot",
            "-optim", "adam", "-adam_beta1", str(BETAS[0]), "-adam_beta2", str(BETAS[1]),
            "-learning_rate", str(LR), "-decay_method", "none", "-max_grad_norm", "0",
            "-label_smoothing", str(EPS_LS), "-seed", str(seed)]
    opt, _ = parser.parse_known_args(argv)
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    # Our ids as its vocabulary: its PAD/UNK/BOS/EOS tokens at our 0/1/2/3.
    specials = [DefaultTokens.PAD, DefaultTokens.UNK, DefaultTokens.BOS, DefaultTokens.EOS]
    vocab = pyonmttok.build_vocab_from_tokens(
        [f"w{i}" for i in range(workload.FIRST_ID, cfg.vocab_size)], special_tokens=specials)
    assert len(vocab) == cfg.vocab_size and vocab[DefaultTokens.PAD] == PAD_ID
    vocabs = {"src": vocab, "tgt": vocab, "data_task": "seq2seq", "decoder_start_token": "<s>"}
    torch.manual_seed(seed)
    logging.getLogger("onmt").setLevel(logging.WARNING)  # it logs the whole module tree
    model = build_model(opt, opt, vocabs, None, -1)
    # Its FFN drops its hidden activations with -dropout too (no option of its own); the paper
    # does not, nor does any other system here.
    for m in model.modules():
        if type(m).__name__ == "PositionwiseFeedForward":
            m.dropout_1.p = 0.0
    optim = Optimizer.from_opt(model, opt)
    # OpenNMT-py's own loss is nn.CrossEntropyLoss(ignore_index=pad, reduction="sum",
    # label_smoothing=eps) on the generator's logits: smoothed_ce_sum is the same computation.

    def logits_of(b: Batch) -> torch.Tensor:
        # It takes the whole target and feeds tgt[:, :-1] to the decoder: BOS + tgt_out.
        tgt = torch.cat([b.tgt_in[:, :1], b.tgt_out], 1).unsqueeze(-1)  # (B, T + 1, 1)
        # (B, S, 1): its inputs carry a features axis. Its padding mask is built from the lengths
        # with width max(src_len), which every batch here satisfies (no all-PAD columns).
        src = b.src.unsqueeze(-1)
        dec_out, _ = model(src, tgt, (b.src != PAD_ID).sum(1))  # (B, T, d)
        return model.generator(dec_out)  # (B, T, V)

    def set_onmt_lr(lr: float) -> None:
        # Optimizer.step() sets the rate to _learning_rate times its decay, which stays 1 with
        # -decay_method none until 10000 steps before -start_decay_steps (default 50000).
        optim._learning_rate = lr

    def step(b: Batch) -> float:
        model.train()
        with autocast(precision):
            logits = logits_of(b)  # (B, T, V)
        loss = smoothed_ce_sum(logits, b.tgt_out) / b.n_tgt_tokens
        optim.backward(loss)
        optim.step()
        optim.zero_grad()
        return loss.item()

    return System(step, model, set_onmt_lr, logits_of,
                  "OpenNMT-py transformer: pre-norm (fixed), no QKV bias, FFN bias, generator bias")


BUILDERS = {"aiayn": build_aiayn, "torch": build_torch, "marian": build_marian,
            "fairseq": build_fairseq, "opennmt": build_opennmt}


# --- timing -------------------------------------------------------------------------------------


def measure(system: System, batches: list[Batch], warmup: int, windows: int, per_window: int,
            cold: bool = False) -> dict:
    """`windows` timed windows of `per_window` steps each, on the first windows * per_window
    batches, after an untimed pass over those same batches (at least `warmup` steps): the steady
    state of training, where every epoch after the first repeats the batch shapes. oneDNN builds
    a kernel per new matrix shape (~5 ms each here), which first-seen shapes pay: aiayn's BASE
    step measured 1,752 tokens/s on new shapes against 2,170 on seen ones. `cold`: time the
    batches that follow the `warmup` steps instead, each shape new. Returns the median window's
    tokens/s and every window's."""
    timed = [batches[i % len(batches)] for i in range(windows * per_window)]
    if cold:
        it = itertools.cycle(batches)
        losses = [system.step(next(it)) for _ in range(warmup)]
        timed = [next(it) for _ in range(windows * per_window)]
    else:
        losses = [system.step(timed[i % len(timed)]) for i in range(max(warmup, len(timed)))]
    rates = []
    for w in range(windows):
        chunk = timed[w * per_window:(w + 1) * per_window]
        t0 = time.perf_counter()
        for b in chunk:
            losses.append(system.step(b))
        rates.append(sum(b.n_tgt_tokens for b in chunk) / (time.perf_counter() - t0))
    return {"tok_per_s": statistics.median(rates), "window_tok_per_s": [round(r, 1) for r in rates],
            "loss_first": losses[0], "loss_last": losses[-1]}


def gpu_figures(flops_per_s: float, peak_tflops: float | None) -> dict:
    """The GPU's name, peak memory allocated by torch, and MFU against the dense peak given."""
    return {"gpu": torch.cuda.get_device_name(),
            "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2),
            "mfu": round(flops_per_s / (peak_tflops * 1e12), 4) if peak_tflops else None}


def versions(system: str) -> dict:
    v = {"torch": torch.__version__}
    mod = {"marian": "transformers", "fairseq": "fairseq", "opennmt": "onmt"}.get(system)
    if mod:
        v[mod] = getattr(__import__(mod), "__version__", "?")
    return v


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", required=True, choices=sorted(BUILDERS))
    p.add_argument("--config", default="tiny", choices=workload.CONFIGS)
    p.add_argument("--precision", default="fp32", choices=tuple(AIAYN_PRECISIONS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed steps, at least one pass over the timed batches (default 3)")
    p.add_argument("--cold", action="store_true",
                   help="time batches of shapes not seen before (the first epoch of training)")
    p.add_argument("--windows", type=int, default=3, help="timed windows (default 3)")
    p.add_argument("--steps", type=int, default=4, help="steps per timed window (default 4)")
    p.add_argument("--compile", action="store_true",
                   help="aiayn and torch: torch.compile each encoder and decoder layer (aiayn as "
                        "`aiayn train --compile` does); give enough --warmup steps to cover compiling")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: aiayn and torch only")
    p.add_argument("--eager-loss", action="store_true",
                   help="aiayn on a GPU: the loss's eager one-block path instead of its compiled "
                        "kernels (what the compiled loss buys)")
    p.add_argument("--vocab", type=int, default=workload.VOCAB, help="shared vocabulary (default 8000)")
    p.add_argument("--max-tokens", type=int, default=workload.MAX_TOKENS,
                   help="tokens per side and batch, padding counted (default 4000)")
    p.add_argument("--lengths", type=int, nargs=2, default=(10, 40), metavar=("LO", "HI"),
                   help="source lengths uniform in [LO, HI] (default 10 40)")
    p.add_argument("--pairs", type=int, default=3000, help="sentence pairs batched (default 3000)")
    p.add_argument("--peak-tflops", type=float, help="the device's dense peak, for MFU")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    a = p.parse_args()
    global DEVICE
    DEVICE = torch.device(a.device)
    if a.device == "cuda" and a.system not in ("aiayn", "torch"):
        p.error("--device cuda is for --system aiayn or torch")
    if a.compile and a.system not in ("aiayn", "torch"):
        p.error("--compile is for --system aiayn or torch (the other peers run as their users run them)")
    if a.eager_loss:
        if a.system != "aiayn" or a.device != "cuda":
            p.error("--eager-loss is for --system aiayn --device cuda (elsewhere the loss is eager already)")
        from aiayn.kernels import loss as loss_kernel
        loss_kernel.fused_on = lambda _logits: False
    torch.set_num_threads(a.threads)
    cfg = replace(workload.model_config(a.config), vocab_size=a.vocab)
    batches = [b.to(DEVICE) for b in workload.training_batches(
        a.pairs, max_tokens=a.max_tokens, lo=a.lengths[0], hi=a.lengths[1], vocab=a.vocab)]
    t0 = time.perf_counter()
    if a.compile:
        system = (build_aiayn if a.system == "aiayn" else build_torch)(cfg, a.precision, compile=True)
    else:
        system = BUILDERS[a.system](cfg, a.precision)
    build_s = time.perf_counter() - t0
    res = measure(system, batches, a.warmup, a.windows, a.steps, a.cold)
    fpt = workload.flops_per_token(cfg, batches)
    params = {id(q): q.numel() for q in system.model.parameters() if q.requires_grad}
    out = {"system": a.system, "config": a.config, "precision": a.precision,
           "tok_per_s": round(res["tok_per_s"], 1), "steps": a.windows * a.steps,
           "warmup": a.warmup, "cold": a.cold, "flops_per_tok": fpt,
           "gflops": round(res["tok_per_s"] * fpt / 1e9, 1),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "window_tok_per_s": res["window_tok_per_s"],
           "loss_first": round(res["loss_first"], 4), "loss_last": round(res["loss_last"], 4),
           "params": sum(params.values()), "threads": torch.get_num_threads(),
           "device": a.device, "vocab": a.vocab, "max_tokens": a.max_tokens,
           "mean_lengths": [round(x, 1) for x in workload.mean_lengths(batches)],
           **(gpu_figures(res["tok_per_s"] * fpt, a.peak_tflops) if a.device == "cuda" else {}),
           "build_s": round(build_s, 2), "notes": system.notes, "versions": versions(a.system),
           "python": sys.executable, **system.extra,
           **({"eager_loss": True} if a.eager_loss else {})}
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
