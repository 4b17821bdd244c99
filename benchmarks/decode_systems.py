"""Decoding throughput of aiayn and its peers on one workload, one system per run.

    .venv/bin/python benchmarks/decode_systems.py --system aiayn --config tiny --precision fp32 --json
    .venv/bin/python benchmarks/decode_systems.py --system ctranslate2 --config base --precision int8 --json
    .venv-peers/bin/python benchmarks/decode_systems.py --system fairseq --config tiny --json
    .venv/bin/python benchmarks/decode_systems.py --system aiayn --config base --profile 1   # by operator

prints one JSON line {"system", "config", "precision", "greedy_sent_per_s", "beam4_sent_per_s",
"peak_rss_mb"}. The workload: 200 random sources, 10-30 ids each (seeded, the same for
every system), decoded in 4 batches of 50, in order, with the output forced to exactly 30 tokens
(no EOS before that, none allowed to stop it earlier), so every system does the same work. The
weights are random (vocabulary 8000, shared and tied); speed does not depend on them. A warm-up
batch is excluded; the figure is 200 / the median time of `--reps` passes over the 4 batches.
peak_rss_mb is the process's peak resident memory (ru_maxrss), everything loaded included.

Systems and how each is forced to 30 tokens:
- aiayn: `aiayn.decoding.translate.search_batched`, the path of `aiayn translate` (KV cache),
  with max_len_a=0, max_len_b=30, min_len=30 (30 decoder steps); fp32, bf16 or int8 as
  `aiayn translate --precision` converts the model (aiayn/decoding/precision.py).
- ctranslate2: the same random aiayn weights (same seed), exported by `aiayn export`'s code in a
  child process (so this process never imports torch and its RSS is CTranslate2's own), then
  `ctranslate2.Translator(intra_threads=T)`, min/max_decoding_length=30; fp32 or int8.
- torch: `torch.nn.Transformer` with tied embeddings and sinusoids, no KV cache: every step
  re-runs the decoder over the whole prefix, as its API invites.
- marian: Hugging Face `MarianMTModel` from a `MarianConfig` (random init, ReLU, scaled
  embeddings), `generate(min_new_tokens=30, max_new_tokens=30)`.
- fairseq: a `transformer` built through its own option parser and TranslationTask
  (--share-all-embeddings), `SequenceGenerator(min_len=30, max_len_b=30)`: 30 tokens, then the
  EOS that fairseq always spends one more decoder step on.
- opennmt: OpenNMT-py's model builder (its defaults: pre-norm, no Q/K/V bias) and its
  Translator, GreedySearch (top-1) or BeamSearch, min_length=max_length=30.

The peers run from `.venv-peers` (scripts/setup_peers.sh); a missing package is one clear line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import workload  # noqa: E402

VOCAB = workload.VOCAB
N_SENTENCES, BATCH, SRC_LEN, OUT_LEN, SEED = 200, 50, (10, 30), 30, 1234
# the workload's TINY and BASE sizes, in the terms the peers' constructors take
CONFIGS = {name: dict(d_model=c.d_model, layers=c.n_layers, heads=c.n_heads, d_ff=c.d_ff)
           for name, c in workload.CONFIGS.items()}
PRECISIONS = {"aiayn": ("fp32", "bf16", "int8"), "ctranslate2": ("fp32", "int8"), "torch": ("fp32",),
              "marian": ("fp32",), "fairseq": ("fp32",), "opennmt": ("fp32",)}
BEAM, ALPHA = 4, 0.6
# ids 0-3 are each system's own specials (aiayn, fairseq, OpenNMT-py all keep 4 there); sources
# use 4..VOCAB-1 only.
PAD, UNK, BOS, EOS = 0, 1, 2, 3

Decode = Callable[[list[list[int]], int], list[list[int]]]  # (batch of ids, beam) -> outputs


class Missing(Exception):
    """A peer's package is not installed: reported as one line."""


def need(module: str, hint: str = "run scripts/setup_peers.sh and use .venv-peers/bin/python"):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise Missing(f"{module} is not installed in {sys.prefix} ({e}); {hint}") from None


def make_sources(n: int = N_SENTENCES, seed: int = SEED) -> list[list[int]]:
    """n random sources of SRC_LEN[0]..SRC_LEN[1] ids in [4, VOCAB), without EOS."""
    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB) for _ in range(rng.randint(*SRC_LEN))] for _ in range(n)]


def padded(batch: list[list[int]], pad: int, eos: int, left: bool = False):
    """(B, S) int64 tensor of ids + [eos], padded with the system's `pad` on the right (or left),
    and (B,) lengths: aiayn's padding routine with another system's ids."""
    import torch

    from aiayn.data.batching import pad_rows

    out, lengths = pad_rows([s + [eos] for s in batch], extra=0, pad_id=pad, left=left)
    return torch.from_numpy(out), torch.from_numpy(lengths)


# --- aiayn and CTranslate2 (the same weights) -------------------------------------------------
def aiayn_model(config: str, seed: int):
    import torch

    from aiayn.model import Transformer

    torch.manual_seed(seed)
    return Transformer(workload.model_config(config)).eval()


def make_aiayn(config: str, precision: str, threads: int, seed: int) -> Decode:
    import sys as _sys

    from aiayn.decoding.precision import convert
    from aiayn.decoding.translate import SearchOptions, search_batched

    # What `aiayn translate --precision P` runs: bf16 weights cast once, or int8 weights
    model = convert(aiayn_model(config, seed), precision)

    def decode(batch, beam):
        # One call per batch of 50 with no length budget: the batch is decoded as given.
        opts = SearchOptions(greedy=beam == 1, beam_size=beam, alpha=ALPHA, max_len_a=0,
                             max_len_b=OUT_LEN, min_len=OUT_LEN, batch_tokens=_sys.maxsize,
                             batch_size=len(batch))
        found = search_batched(model, batch, opts, bf16=precision == "bf16")
        # Every hypothesis took OUT_LEN steps: OUT_LEN pieces cut off, or OUT_LEN - 1 and EOS.
        return [h[0].tokens + [EOS] * (len(h[0].token_logprobs) - len(h[0].tokens)) for h in found]
    decode.model = model
    return decode


def ct2_tokens() -> list[str]:
    return ["<pad>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, VOCAB)]


def export_ct2(config: str, seed: int, out: str, quantization: str | None) -> None:
    """The aiayn model of `make_aiayn` (same seed), written as a CTranslate2 model directory."""
    from aiayn.export.ctranslate2 import build_spec, save_spec

    tokens = ct2_tokens()
    save_spec(build_spec(aiayn_model(config, seed), tokens, tokens), out, quantization)


def make_ctranslate2(config: str, precision: str, threads: int, seed: int) -> Decode:
    ctranslate2 = need("ctranslate2", "pip install 'aiayn[export]'")
    tmp = tempfile.mkdtemp(prefix="ct2-bench-")
    out = os.path.join(tmp, "model")
    quant = "int8" if precision == "int8" else None
    cmd = [sys.executable, __file__, "--export-ct2", out, "--config", config, "--seed", str(seed)]
    subprocess.run(cmd + (["--quantization", quant] if quant else []), check=True)
    tr = ctranslate2.Translator(out, device="cpu", compute_type="int8" if quant else "float32",
                                intra_threads=threads, inter_threads=1)
    tokens = ct2_tokens()
    index = {t: i for i, t in enumerate(tokens)}

    def decode(batch, beam):
        res = tr.translate_batch([[tokens[i] for i in s] for s in batch], beam_size=beam,
                                 length_penalty=ALPHA, min_decoding_length=OUT_LEN,
                                 max_decoding_length=OUT_LEN)
        return [[index[t] for t in r.hypotheses[0]] for r in res]
    return decode


# --- torch.nn.Transformer, no KV cache --------------------------------------------------------
def make_torch(config: str, precision: str, threads: int, seed: int) -> Decode:
    import torch
    from torch import nn

    size = CONFIGS[config]
    d = size["d_model"]
    torch.manual_seed(seed)
    core = nn.Transformer(d, size["heads"], size["layers"], size["layers"], size["d_ff"],
                          dropout=0.0, batch_first=True).eval()
    emb = nn.Embedding(VOCAB, d)
    nn.init.normal_(emb.weight, std=d**-0.5)
    pos = torch.arange(1024, dtype=torch.float32)[:, None] / 10000 ** (
        torch.arange(0, d, 2, dtype=torch.float32) / d)  # (1024, d/2)
    pe = torch.stack([pos.sin(), pos.cos()], dim=-1).flatten(1)  # (1024, d) interleaved

    def embed(ids):
        return emb(ids) * math.sqrt(d) + pe[: ids.size(1)]  # (B, T, d)

    @torch.inference_mode()
    def decode(batch, beam):
        src, _ = padded(batch, PAD, EOS)
        pad_mask = src == PAD  # True = padding, nn.Transformer's convention
        memory = core.encoder(embed(src), src_key_padding_mask=pad_mask)  # (B, S, d)
        n = len(batch)
        memory, pad_mask = memory.repeat_interleave(beam, 0), pad_mask.repeat_interleave(beam, 0)
        prefix = torch.full((n * beam, 1), BOS, dtype=torch.long)
        score = torch.full((n, beam), float("-inf"))
        score[:, 0] = 0.0
        for t in range(OUT_LEN):
            causal = nn.Transformer.generate_square_subsequent_mask(t + 1)
            y = core.decoder(embed(prefix), memory, tgt_mask=causal, tgt_is_causal=True,
                             memory_key_padding_mask=pad_mask)[:, -1]  # (n*beam, d)
            logp = torch.log_softmax(y @ emb.weight.T, dim=-1)  # (n*beam, V), tied output
            logp[:, [PAD, BOS, EOS]] = float("-inf")  # forced length: no EOS
            cand = (score[:, :, None] + logp.view(n, beam, VOCAB)).view(n, -1)  # (n, beam*V)
            score, idx = cand.topk(beam, dim=1)
            rows = (torch.arange(n)[:, None] * beam + idx // VOCAB).view(-1)  # (n*beam,)
            prefix = torch.cat([prefix[rows], (idx % VOCAB).view(-1, 1)], dim=1)
        return prefix.view(n, beam, -1)[:, 0, 1:].tolist()
    decode.model = nn.ModuleList([core, emb])
    return decode


# --- Hugging Face Marian ----------------------------------------------------------------------
def make_marian(config: str, precision: str, threads: int, seed: int) -> Decode:
    transformers = need("transformers")
    import torch

    size = CONFIGS[config]
    torch.manual_seed(seed)
    cfg = transformers.MarianConfig(
        vocab_size=VOCAB, d_model=size["d_model"], encoder_layers=size["layers"],
        decoder_layers=size["layers"], encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"], encoder_ffn_dim=size["d_ff"],
        decoder_ffn_dim=size["d_ff"], activation_function="relu", scale_embedding=True,
        dropout=0.0, max_position_embeddings=512, pad_token_id=PAD, eos_token_id=EOS,
        decoder_start_token_id=BOS, forced_eos_token_id=None, bos_token_id=None)
    model = transformers.MarianMTModel(cfg).eval()

    @torch.inference_mode()
    def decode(batch, beam):
        src, _ = padded(batch, PAD, EOS)
        beam_opts = dict(length_penalty=ALPHA, early_stopping=False) if beam > 1 else {}
        out = model.generate(input_ids=src, attention_mask=src != PAD, num_beams=beam,
                             do_sample=False, min_new_tokens=OUT_LEN, max_new_tokens=OUT_LEN,
                             **beam_opts)
        return out[:, 1:].tolist()  # without the decoder start token
    decode.model = model
    return decode


# --- fairseq ------------------------------------------------------------------------------
def make_fairseq(config: str, precision: str, threads: int, seed: int) -> Decode:
    need("fairseq")
    import torch
    from fairseq import options, tasks
    from fairseq.data import Dictionary
    from fairseq.sequence_generator import SequenceGenerator

    size = CONFIGS[config]
    data = tempfile.mkdtemp(prefix="fairseq-bench-")
    vocab = Dictionary()  # bos=0, pad=1, eos=2, unk=3, then our ids 4.. unchanged
    for i in range(4, VOCAB):
        vocab.add_symbol(f"t{i}")
    for lang in ("src", "tgt"):
        vocab.save(os.path.join(data, f"dict.{lang}.txt"))
    n, d, h, ff = (str(size[k]) for k in ("layers", "d_model", "heads", "d_ff"))
    argv = [data, "--task", "translation", "-s", "src", "-t", "tgt", "--arch", "transformer",
            "--share-all-embeddings", "--dropout", "0", "--cpu",
            "--encoder-layers", n, "--decoder-layers", n, "--encoder-embed-dim", d,
            "--decoder-embed-dim", d, "--encoder-ffn-embed-dim", ff, "--decoder-ffn-embed-dim", ff,
            "--encoder-attention-heads", h, "--decoder-attention-heads", h]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(seed)
    task = tasks.setup_task(args)
    model = task.build_model(args).eval()
    tgt = task.target_dictionary
    generators = {k: SequenceGenerator([model], tgt, beam_size=k, max_len_a=0, max_len_b=OUT_LEN,
                                       min_len=OUT_LEN, len_penalty=ALPHA) for k in (1, BEAM)}

    @torch.inference_mode()
    def decode(batch, beam):
        src, lengths = padded(batch, tgt.pad(), tgt.eos(), left=True)  # fairseq pads on the left
        sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
        hyps = generators[beam].generate([model], sample)
        return [h[0]["tokens"].tolist() for h in hyps]  # 30 tokens + EOS
    decode.model = model
    return decode


# --- OpenNMT-py ---------------------------------------------------------------------------
def make_opennmt(config: str, precision: str, threads: int, seed: int) -> Decode:
    need("onmt")
    import io
    from collections import Counter

    import onmt.opts
    import pyonmttok
    import torch
    from onmt.constants import DefaultTokens
    from onmt.model_builder import build_base_model
    from onmt.translate import GNMTGlobalScorer
    from onmt.translate.translator import Translator
    from onmt.utils.parse import ArgumentParser
    from torch.nn.init import xavier_uniform_, zeros_

    size = CONFIGS[config]
    parser = ArgumentParser()
    onmt.opts.model_opts(parser)
    onmt.opts.distributed_opts(parser)
    onmt.opts._add_train_general_opts(parser)
    n, d, h, ff = (str(size[k]) for k in ("layers", "d_model", "heads", "d_ff"))
    opt = parser.parse_known_args([
        "-data", "unused", "-encoder_type", "transformer", "-decoder_type", "transformer",
        "-position_encoding", "-enc_layers", n, "-dec_layers", n, "-hidden_size", d,
        "-word_vec_size", d, "-transformer_ff", ff, "-heads", h, "-dropout", "0",
        "-attention_dropout", "0", "-share_embeddings", "-share_decoder_embeddings"])[0]
    ArgumentParser.update_model_opts(opt)
    ArgumentParser.validate_model_opts(opt)
    specials = [DefaultTokens.UNK, DefaultTokens.PAD, DefaultTokens.BOS, DefaultTokens.EOS]
    vocab = pyonmttok.build_vocab_from_tokens(Counter({f"t{i}": 1 for i in range(4, VOCAB)}),
                                              special_tokens=specials)
    assert len(vocab) == VOCAB and vocab[DefaultTokens.EOS] == EOS
    vocabs = {"src": vocab, "tgt": vocab, "decoder_start_token": DefaultTokens.BOS,
              "data_task": "seq2seq"}
    torch.manual_seed(seed)
    model = build_base_model(opt, vocabs)
    for name, p in model.named_parameters():  # its -param_init_glorot
        (xavier_uniform_ if p.dim() > 1 else zeros_)(p)
    model.eval()
    scorer = GNMTGlobalScorer(alpha=ALPHA, beta=0.0, length_penalty="wu", coverage_penalty="none")
    translators = {k: Translator(model, vocabs, gpu=-1, n_best=1, min_length=OUT_LEN,
                                 max_length=OUT_LEN, max_length_ratio=0, beam_size=k,
                                 random_sampling_topk=1 if k == 1 else 0, global_scorer=scorer,
                                 out_file=io.StringIO(), report_score=False) for k in (1, BEAM)}

    def decode(batch, beam):
        src, lengths = padded(batch, vocab[DefaultTokens.PAD], EOS)
        out = translators[beam].translate_batch(
            {"src": src[:, :, None], "srclen": lengths, "indices": torch.arange(len(batch))},
            attn_debug=False)
        return [p[0].tolist() for p in out["predictions"]]
    decode.model = model
    return decode


SYSTEMS = {"aiayn": make_aiayn, "ctranslate2": make_ctranslate2, "torch": make_torch,
           "marian": make_marian, "fairseq": make_fairseq, "opennmt": make_opennmt}


# --- timing -------------------------------------------------------------------------------
def check_lengths(system: str, outputs: list[list[int]]) -> None:
    """Every output must be OUT_LEN tokens (fairseq: and its EOS), or the work differs."""
    want = OUT_LEN + (system == "fairseq")
    bad = [len(o) for o in outputs if len(o) != want]
    if bad:
        raise RuntimeError(f"{system}: {len(bad)} outputs are not {want} tokens long "
                           f"(lengths {sorted(set(bad))[:5]}); the workload is not the same")


def sentences_per_second(system: str, decode: Decode, batches: list[list[list[int]]], beam: int,
                         reps: int, warmup: int) -> float:
    check_lengths(system, decode(batches[0][:warmup], beam))  # warm-up, not timed
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        outputs = [o for b in batches for o in decode(b, beam)]
        times.append(time.perf_counter() - start)
        check_lengths(system, outputs)
    return sum(map(len, batches)) / statistics.median(times)


def run(system: str, config: str, precision: str, threads: int, reps: int, n: int,
        warmup: int, seed: int) -> dict:
    if precision not in PRECISIONS[system]:
        raise Missing(f"--precision {precision} is not measured for {system} "
                      f"(choose from {', '.join(PRECISIONS[system])})")
    if system != "ctranslate2":  # CTranslate2's process never imports torch
        import torch

        torch.set_num_threads(threads)
    decode = SYSTEMS[system](config, precision, threads, seed)
    model = getattr(decode, "model", None)
    if model is not None:  # sanity: the systems' models are the same size (shared weights once)
        n_params = sum({id(p): p.numel() for p in model.parameters()}.values())
        print(f"{system} {config}: {n_params / 1e6:.2f}M parameters", file=sys.stderr)
    sources = make_sources(n)
    batches = [sources[i : i + BATCH] for i in range(0, len(sources), BATCH)]
    result = {"system": system, "config": config, "precision": precision}
    for key, beam in (("greedy_sent_per_s", 1), ("beam4_sent_per_s", BEAM)):
        result[key] = round(sentences_per_second(system, decode, batches, beam, reps, warmup), 2)
        print(f"{system} {config} {precision}: {key} {result[key]}", file=sys.stderr, flush=True)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def profile(system: str, config: str, precision: str, threads: int, beam: int, seed: int) -> int:
    """Where one batch's decoding time goes, by operator (torch.profiler, self time)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    if system == "ctranslate2":
        print("decode_systems: --profile needs a PyTorch system", file=sys.stderr)
        return 2
    torch.set_num_threads(threads)
    decode = SYSTEMS[system](config, precision, threads, seed)
    first, second = make_sources(2 * BATCH)[:BATCH], make_sources(2 * BATCH)[BATCH:]
    decode(first, beam)  # oneDNN and the allocator see these shapes once, untimed
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        check_lengths(system, decode(second, beam))
        took = time.perf_counter() - start
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    print(f"{system} {config} {precision}, beam {beam}: one batch of {BATCH} in {took:.2f} s "
          "(profiled)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", choices=list(SYSTEMS), help="what to measure")
    p.add_argument("--config", choices=list(CONFIGS), default="tiny")
    p.add_argument("--precision", choices=["fp32", "bf16", "int8"], default="fp32")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    p.add_argument("--reps", type=int, default=3, help="timed passes, median reported (default 3)")
    p.add_argument("--sentences", type=int, default=N_SENTENCES,
                   help=f"sources (default {N_SENTENCES}; fewer only for smoke tests)")
    p.add_argument("--warmup", type=int, default=BATCH, help="sentences in the untimed warm-up")
    p.add_argument("--seed", type=int, default=0, help="weights' seed (sources are fixed)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--profile", type=int, metavar="BEAM",
                   help="instead of timing: torch.profiler's operator table for one batch decoded "
                        "with this beam size (1 = greedy), after an untimed one (PyTorch systems)")
    p.add_argument("--export-ct2", metavar="DIR", help=argparse.SUPPRESS)  # child process
    p.add_argument("--quantization", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.export_ct2:
        export_ct2(args.config, args.seed, args.export_ct2, args.quantization)
        return 0
    if args.system is None:
        p.error("--system is required")
    if args.system == "aiayn":  # as `aiayn translate` runs (aiayn/memory.py); torch not loaded yet
        from aiayn.memory import restart_with_allocator, tune_memory
        restart_with_allocator([sys.executable, *sys.argv])  # mimalloc, as the `aiayn` command runs
        tune_memory()
    if args.profile:
        return profile(args.system, args.config, args.precision, args.threads, args.profile, args.seed)
    try:
        result = run(args.system, args.config, args.precision, args.threads, args.reps,
                     args.sentences, max(1, args.warmup), args.seed)
    except Missing as e:
        print(f"decode_systems: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else
          "  ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
