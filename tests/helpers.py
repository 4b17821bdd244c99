"""What the tests share, in one module that every test imports plainly (`from helpers import ...`);
pytest fixtures live in conftest.py. Tests never import each other.

- processes: the repository root, `aiayn` in a fresh process, a training run killed mid-way, a
  dead PID, waiting for a condition;
- model settings: `MICRO` (the tests' base size) and the `--set` overrides `SMALL`, `SMALL_CHART`;
- tiny data: a synthetic translation task prepared through `prepare_dataset` (`tiny_dataset`), a
  tiny treebank corpus, a well-formed trainer state; the small raw corpora of the `prepare` tests;
  two hand-written Penn Treebank files and a zip of them;
- models: `TableModel`, a hand-built model whose next-token probabilities are a table (the search
  tests); a model trained briefly to reverse its source (`train_reverser`, `reverser_model_dir`);
- searches: `beam_search`, the product's `BeamSearch` over one batch that starts together, and
  `greedy_search`, an independent greedy loop: the slow references the engine, beam 1, the
  ensembles, the exports and int8 are compared with;
- servers: a local HTTP file server for the download tests, and the serving tests' served
  models, uvicorn in a thread and headless Chromium.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
import uvicorn
from nltk.tree import Tree

from aiayn.commands.serve import bind
from aiayn.config import BASE
from aiayn.data.corpus import ParallelSource
from aiayn.data.model_dir import save_model
from aiayn.data.prepare import PrepareOptions, prepare_dataset
from aiayn.data.tokenizer import Tokenizer
from aiayn.decoding.beam import BeamSearch
from aiayn.decoding.common import (
    AttentionRequest,
    Hypothesis,
    StepConstraint,
    apply_constraint,
    ban_early_eos,
    decoder_length_cap,
    max_output_lengths,
    next_token_logprobs,
    resolve_mask,
    source_batch,
    unflatten_attention,
)
from aiayn.decoding.int8 import int8_supported
from aiayn.decoding.search import SearchOptions, SearchSettings, decoding_defaults, resolve_search
from aiayn.model import Transformer
from aiayn.serving.model import Attention, ServedModel
from aiayn.special import BOS_ID, EOS_ID, PAD_ID
from aiayn.training import checkpoint as ckpt
from aiayn.training.logs import RunProgress

REPO = Path(__file__).resolve().parents[1]

# --- processes ------------------------------------------------------------------------------------


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m aiayn ARGS` in a fresh process, from the repository root."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "aiayn", *args], cwd=REPO, env=e, text=True,
                          capture_output=True, timeout=timeout)


def run_script(script: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A script of the repository (benchmarks/, tools/) in a fresh process with this Python, the
    repository importable and one thread, as `run_cli` runs the CLI; matplotlib draws off
    screen."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=e, text=True,
                          capture_output=True, timeout=timeout)


def train_until_killed(out: Path, args: list[str], step: int = 10) -> None:
    """`aiayn train --out OUT ARGS` in a fresh process, killed with SIGKILL once the checkpoint of
    `step` is written; asserts that it was killed before it finished."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "train", "--out", str(out), *args],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / "checkpoints" / f"step_{step:06d}").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def dead_pid() -> int:
    """The PID of a process that has ended (what a killed command's temporaries carry)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `condition` until it holds; an AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# --- model settings -------------------------------------------------------------------------------

# A 2+2-layer model of width 64, the tests' base size (build others as deltas of it).
MICRO = replace(BASE, n_layers=2, d_model=64, d_ff=256, n_heads=4, warmup_steps=200, max_tokens=2048,
                max_steps=2000)
# As `--set` overrides: a 1+1-layer model of width 32, whose updates take milliseconds on one thread.
SMALL = ["d_model=32", "d_ff=64", "n_layers=1", "n_heads=4", "warmup_steps=30", "max_tokens=300"]
# As `--set` overrides of `parsing-chart-small`: a chart parser that trains in milliseconds.
SMALL_CHART = ["d_model=32", "d_ff=64", "n_heads=4", "d_span=32", "p_drop=0", "p_word_drop=0",
               "warmup_steps=20", "max_cells=400"]


# --- tiny data ------------------------------------------------------------------------------------

LETTERS = "abcdefghij"
TABLE = str.maketrans(LETTERS, "klmnopqrst")


def pair(rng: random.Random) -> tuple[str, str]:
    """Source: 2-6 words of letters a-j; target: the words in reverse order, letters shifted to
    k-t. Learnable by a tiny model, so the dev loss must fall within a few dozen updates."""
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
             for _ in range(rng.randint(2, 6))]
    return " ".join(words), " ".join(reversed(words)).translate(TABLE)


def tiny_dataset(root: Path, n_train: int = 400, n_valid: int = 40, seed: int = 0, **prepare) -> Path:
    """A prepared dataset directory at root/data: a character vocabulary of 25 ids, or what the
    `PrepareOptions` fields in `prepare` ask for (e.g. model_type="bpe")."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    sources = {}
    for name, n in (("train", n_train), ("valid", n_valid)):
        pairs = [pair(rng) for _ in range(n)]
        (root / f"{name}.xx").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
        (root / f"{name}.yy").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
        sources[name] = ParallelSource(root / f"{name}.xx", root / f"{name}.yy")
    out = root / "data"
    settings = {"vocab_size": 25, "model_type": "char", **prepare}
    prepare_dataset(out, sources, PrepareOptions("xx", "yy", **settings))
    return out


# Four tiny trees: a chart parser of width 32 learns them by heart in ~150 updates.
TREES = [
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (NNP John)) (VP (VBD ran)))",
    "(SINV (S (VP (VB Go))) (, ,) (VP (VBD said)) (NP (PRP he)) (. .))",
    "(NP (NN Hello))",
]


def tiny_treebank_corpus(root: Path, trees: list[str] = TREES, copies: int = 1) -> Path:
    """A corpus as `aiayn treebank` writes it (SPLIT.words, SPLIT.gold) at root: `trees` (each
    `copies` times) in train, the same trees in valid."""
    root.mkdir(parents=True, exist_ok=True)
    gold = [Tree.fromstring(t) for t in trees]
    for split, n in (("train", copies), ("valid", 1)):
        (root / f"{split}.words").write_text("".join(" ".join(t.leaves()) + "\n" for t in gold) * n)
        (root / f"{split}.gold").write_text("".join(t.pformat(margin=1 << 30) + "\n" for t in gold) * n)
    return root


def trainer_state(step: int, world_size: int = 1) -> dict:
    """A well-formed trainer state (what `checkpoint.load_trainer_state` accepts), for tests of
    checkpoint files that need no real optimizer."""
    return ckpt.new_trainer_state(
        step=step, optimizer={"state": {}, "param_groups": [{"lr": 1.0, "params": [0]}]}, scaler={},
        sampler={"epoch": 0, "position": 0}, ranks=[{"rng": ckpt.capture_rng()}] * world_size,
        progress=asdict(RunProgress()),
        run={"seed": 1, "world_size": world_size, "batch_tokens": 10, "accum": 1})


# --- raw corpora for `aiayn prepare` (the `raw` fixture of conftest.py) --------------------------

EN = "the a man woman dog walks runs over street house big small red blue green , . !".split()
DE = "der die das Mann Frau Hund läuft rennt über Straße Haus groß klein rot blau grün schön , . !".split()
_rng = random.Random(0)
EN += ["".join(_rng.choice(["ka", "lo", "mi", "ste", "ran", "pu", "th"]) for _ in range(3)) for _ in range(60)]
DE += ["".join(_rng.choice(["schä", "ü", "ber", "ei", "nö", "ßa", "ch"]) for _ in range(3)) for _ in range(60)]


def sentences(words, n, seed, lo=2, hi=14):
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def write_lines(path: Path, lines, gz: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def options(**kw) -> PrepareOptions:
    """The prepare tests' options for the raw corpora (English to German), changed by `kw`."""
    base = dict(src_lang="en", tgt_lang="de", vocab_size=500, max_len=40, max_ratio=9.0)
    base.update(kw)
    return PrepareOptions(**base)


def splits(d: Path) -> dict[str, ParallelSource]:
    """The three splits of the raw corpora in directory `d` (the `raw` fixture's "dir")."""
    return {"train": ParallelSource(d / "train.en", d / "train.de"),
            "valid": ParallelSource(d / "val.en", d / "val.de"),
            "test": ParallelSource(d / "test.en", d / "test.de")}


# --- Penn Treebank files --------------------------------------------------------------------------

# Two PTB-style files, as the treebank writes them: outer empty brackets, traces, function tags.
FILE_A = """( (S
    (NP-SBJ-1 (DT The) (NN cat) )
    (VP (VBD was)
      (VP (VBN seen)
        (NP (-NONE- *-1) )
        (PP-LOC (IN on) (NP (DT the) (NN mat) ))))
    (. .) ))
( (S (NP-SBJ (PRP It)) (VP (VBD ran) (-NONE- *T*-2)) (. .)) )
"""
FILE_B = """( (SINV (S-TPC-2 (NP-SBJ (-NONE- *)) (VP (VB Go) )) (, ,) (VP (VBD said) (S (-NONE- *T*-2)))
  (NP-SBJ=3 (NNP Ann) ) (. .) ))
"""


def treebank_zip(tmp_path: Path) -> Path:
    """FILE_A and FILE_B as a zip laid out as the LDC's treebank is, with a tagged file beside."""
    z = tmp_path / "tb.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("treebank/combined/wsj_0001.mrg", FILE_A)
        f.writestr("treebank/combined/wsj_0002.mrg", FILE_B)
        f.writestr("treebank/tagged/wsj_0001.pos", "[ The/DT cat/NN ]")
    return z


# --- a hand-built model: next-token probabilities from a table ------------------------------------

V = 10  # ids 4..9 are ordinary tokens
A, B, C, D = 4, 5, 6, 7


class TableCache:
    """The fake's decoding state: each row's table key and generated prefix."""

    def __init__(self, keys: list[int]):
        self.keys = keys
        self.prefixes: list[tuple[int, ...]] = [() for _ in keys]
        self.steps: list[int] = [0 for _ in keys]  # per row: tokens fed so far (BOS first)
        self.length = 0

    @property
    def group(self) -> int:
        return len(self.prefixes) // len(self.keys)

    def reorder(self, index: torch.Tensor, cross_index=True) -> None:
        # `keys` plays the cross-attention state (per source), `prefixes` the self-attention one
        self.prefixes = [self.prefixes[i] for i in index.tolist()]
        self.steps = [self.steps[i] for i in index.tolist()]
        if cross_index is not None:
            ci = index if cross_index is True else cross_index
            self.keys = [self.keys[i] for i in ci.tolist()]

    def extend(self, other: "TableCache") -> "TableCache":
        """Sentences joining at their own step (`BeamSearch.add`)."""
        assert other.group == self.group
        self.keys, self.prefixes = self.keys + other.keys, self.prefixes + other.prefixes
        self.steps = self.steps + other.steps
        return self


class TableModel:
    """The model API (encode / new_cache / decode_step / cache.reorder) with next-token
    probabilities p(token | prefix) read from `tables[first source token]`: a dict from the
    generated prefix (no BOS) to {token: probability}, or a function of the prefix. A prefix not
    in a dict ends: {EOS: 1}. Counts decode_step calls in `steps`."""

    def __init__(self, tables: dict):
        self.tables = tables
        self.steps = 0

    def encode(self, src, src_mask=None):
        return src  # the "memory" is the source itself: its first token selects the table

    def new_cache(self, memory, src_mask):
        return TableCache([int(row[0]) for row in memory])

    def decode_step(self, tokens, cache):
        self.steps += 1
        out = torch.full((tokens.size(0), V), float("-inf"))
        for i, tok in enumerate(tokens[:, 0].tolist()):
            if cache.steps[i] == 0:
                assert tok == BOS_ID
            else:
                cache.prefixes[i] = cache.prefixes[i] + (tok,)
            cache.steps[i] += 1
            # a sentence's beams share its source row (the search stores it once)
            table = self.tables[cache.keys[i * len(cache.keys) // len(cache.prefixes)]]
            dist = table(cache.prefixes[i]) if callable(table) else table.get(cache.prefixes[i], {EOS_ID: 1.0})
            for t, p in dist.items():
                out[i, t] = math.log(p)
        cache.length += 1
        return out


# Tables of the hand-built model (tests/test_decoding_search.py, test_decoding_engine.py).
# Key 10: the length penalty decides. [A] EOS has p = .6 * .5 = .3 (|Y| = 2); [B, B, B] EOS has
# p = .4 * 1 * 1 * .625 = .25 (|Y| = 4); [A, C] EOS has p = .6 * .3 * .6 = .108 (|Y| = 3).
ALPHA_TABLE = {
    (): {A: 0.6, B: 0.4},
    (A,): {EOS_ID: 0.5, C: 0.3, D: 0.2},
    (B,): {B: 1.0},
    (A, C): {EOS_ID: 0.6, D: 0.4},
    (B, B): {B: 1.0},
    (B, B, B): {EOS_ID: 0.625, C: 0.375},
    (A, C, D): {D: 1.0},
}
# Key 11: after [C], EOS (p .7) or a chain of twenty A's that must then end (p .3 for all of it).
CHAIN = {(): {C: 1.0}, (C,): {EOS_ID: 0.7, A: 0.3}}
CHAIN.update({(C,) + (A,) * j: {A: 1.0} for j in range(1, 20)})
# Key 12: the same with EOS p .9 and the chain p .1.
CHAIN_LOW = {**CHAIN, (C,): {EOS_ID: 0.9, A: 0.1}}
# Key 13: never ends.
ENDLESS = lambda prefix: {A: 0.7, B: 0.3}  # noqa: E731
TABLES = {10: ALPHA_TABLE, 11: CHAIN, 12: CHAIN_LOW, 13: ENDLESS}


def summary(hyps):
    return [(h.tokens, round(h.score, 5), round(h.logprob, 5), h.complete) for h in hyps]


# --- reference searches ---------------------------------------------------------------------------


def search_settings(model: Any, early_stop: bool | str = True, **options: Any) -> SearchSettings:
    """`SearchSettings` for `model` from `SearchOptions` fields (None: the model config's), with
    `early_stop` as the tests write it: True or "exact", "current", or False ("never": every
    sentence to its maximum length)."""
    settings = resolve_search(model, SearchOptions(**options))
    if isinstance(early_stop, bool):
        early_stop = "exact" if early_stop else "never"
    return replace(settings, early_stop=early_stop)


def beam_search(model: Any, src: torch.Tensor, src_mask: torch.Tensor | None = None,
                beam_size: int | None = None, alpha: float | None = None,
                max_len_a: float | None = None, max_len_b: float | None = None,
                nbest: int = 1, early_stop: bool | str = True, min_len: int = 0,
                attention: AttentionRequest | None = None,
                constraint: StepConstraint | None = None) -> list[list[Hypothesis]]:
    """The product's `BeamSearch` over one batch that starts together (None: the model config's
    setting). src: (B, S) int64, pieces + EOS, right-padded with PAD; src_mask: (B, S) bool
    (default `src != PAD`); `constraint` one row per sentence when given. Returns per sentence,
    in batch order, up to `nbest` hypotheses best first."""
    settings = search_settings(model, early_stop, beam_size=beam_size, alpha=alpha,
                               max_len_a=max_len_a, max_len_b=max_len_b, nbest=nbest,
                               min_len=min_len, attention=attention)
    search = BeamSearch(model, settings)
    out: list[list[Hypothesis]] = [[] for _ in range(src.size(0))]
    search.add(src, src_mask, range(src.size(0)), constraint)
    while search.sentences:
        for i, hyps in search.step():
            out[i] = hyps
    return out


@torch.inference_mode()
def greedy_search(model: Any, src: torch.Tensor, src_mask: torch.Tensor | None = None,
                  max_len_a: float | None = None, max_len_b: float | None = None,
                  min_len: int = 0, attention: AttentionRequest | None = None,
                  constraint: StepConstraint | None = None) -> list[Hypothesis]:
    """Greedy decoding of a batch, written apart from the product's search (which decodes greedy
    as a beam of one): the most probable next token at every step, over the model's incremental
    API, finished rows dropped from the cache. src: (B, S) int64, pieces + EOS, right-padded with
    PAD; src_mask: (B, S) bool (default `src != PAD`). Returns one `Hypothesis` per sentence, in
    batch order, score = log-probability. `max_len_a`/`max_len_b` default to the model config's;
    `min_len` forbids EOS before that length; `attention` keeps each step's cross-attention;
    `constraint` (one row per sentence) limits the tokens each step may choose."""
    cfg = decoding_defaults(model)
    a = cfg.max_len_a if max_len_a is None else max_len_a
    b = cfg.max_len_b if max_len_b is None else max_len_b
    src_mask = resolve_mask(src, src_mask)
    n, device = src.size(0), src.device
    max_lens = max_output_lengths(src_mask, a, b, decoder_length_cap(model))  # (B,)
    width = int(max_lens.max()) if n else 0

    # Results for every sentence, written when it finishes.
    out_tok = torch.full((n, width), PAD_ID, dtype=torch.long, device=device)
    out_lp = torch.zeros(n, width, dtype=torch.float32, device=device)
    out_len = torch.zeros(n, dtype=torch.long, device=device)  # pieces, EOS excluded
    out_complete = torch.zeros(n, dtype=torch.bool, device=device)
    out_raw = torch.zeros(n, dtype=torch.float32, device=device)

    if n:
        cache = model.new_cache(model.encode(src, src_mask), src_mask)
    rows = torch.arange(n, device=device)  # sentence index of each live row
    hist_tok = torch.zeros(n, 0, dtype=torch.long, device=device)  # (n_live, t)
    hist_lp = torch.zeros(n, 0, dtype=torch.float32, device=device)
    raw = torch.zeros(n, dtype=torch.float32, device=device)  # running sum, as beam search keeps it
    hist_w = out_w = w_shape = None  # kept attention: (n_live, t, A), (n, width, A), (L', h', S)
    last = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)
    t = 0
    while rows.numel():
        if attention is None:
            logits = model.decode_step(last, cache)  # (n_live, V)
        else:
            logits, weights = model.decode_step(last, cache, return_attention=True)
            step_w = attention.select(weights["cross"])  # (n_live, L', h', S)
            w_shape = tuple(step_w.shape[1:])
            step_w = step_w.flatten(1)[:, None]  # (n_live, 1, A)
            hist_w = step_w if hist_w is None else torch.cat([hist_w, step_w], dim=1)
            if out_w is None:
                out_w = step_w.new_zeros(n, width, step_w.size(2))
        logp = ban_early_eos(next_token_logprobs(logits), t + 1, min_len)  # (n_live, V) float32
        logp = apply_constraint(logp, constraint, max_lens[rows] - t)
        tok_lp, tok = logp.max(dim=-1)  # (n_live,)
        hist_tok = torch.cat([hist_tok, tok[:, None]], dim=1)  # (n_live, t+1)
        hist_lp = torch.cat([hist_lp, tok_lp[:, None]], dim=1)
        raw = raw + tok_lp
        t += 1
        ended = tok == EOS_ID
        done = ended | (t >= max_lens[rows])
        if bool(done.any()):
            d = rows[done]
            out_tok[d, :t] = hist_tok[done]
            out_lp[d, :t] = hist_lp[done]
            out_len[d] = t - ended[done].long()
            out_complete[d] = ended[done]
            out_raw[d] = raw[done]
            keep = (~done).nonzero().squeeze(1)
            if hist_w is not None:
                out_w[d, :t] = hist_w[done]
                hist_w = hist_w[keep]
            rows, hist_tok, hist_lp, tok = rows[keep], hist_tok[keep], hist_lp[keep], tok[keep]
            raw = raw[keep]
            if rows.numel():
                cache.reorder(keep)
                if constraint is not None:
                    constraint.reorder(keep)
        if constraint is not None and rows.numel():
            constraint.advance(tok)
        last = tok[:, None]

    hyps = []
    toks, lps, raws = out_tok.tolist(), out_lp.tolist(), out_raw.tolist()
    src_lens = src_mask.sum(dim=1).tolist()
    for i, (length, complete) in enumerate(zip(out_len.tolist(), out_complete.tolist())):
        steps = length + int(complete)
        w = None if out_w is None else unflatten_attention(out_w[i], steps, w_shape, src_lens[i])
        hyps.append(Hypothesis(toks[i][:length], raws[i], raws[i], bool(complete), lps[i][:steps],
                               w))
    return hyps


# --- a briefly trained model (confident, position-dependent outputs) -------------------------------

needs_int8 = pytest.mark.skipif(not int8_supported(), reason="needs fbgemm on an x86 CPU with AVX2")

TEXTS = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "ein hund läuft im park",
    "die katze sitzt auf der matte",
    "the children play in the garden",
    "die kinder spielen im garten",
]


def train_reverser(cfg, steps: int = 120, seed: int = 0):
    """A model trained briefly to output its source reversed (ids mapped into the target
    vocabulary): enough for varied, position-dependent greedy outputs."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    v_src, v_tgt = cfg.src_vocab, cfg.tgt_vocab
    for _ in range(steps):
        srcs = [torch.randint(4, v_src, (int(n),), generator=g).tolist()
                for n in torch.randint(2, 9, (32,), generator=g)]
        tgts = [[4 + (x - 4) % (v_tgt - 4) for x in reversed(s)] for s in srcs]
        src, src_mask = source_batch(srcs)
        width = max(map(len, tgts)) + 1
        tgt_in = torch.full((len(tgts), width), PAD_ID)
        tgt_out = torch.full((len(tgts), width), PAD_ID)
        for i, t in enumerate(tgts):
            tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID] + t)
            tgt_out[i, : len(t) + 1] = torch.tensor(t + [EOS_ID])
        logits = model(src, tgt_in, src_mask)  # (B, T, V)
        loss = F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def reverser_model_dir(root: Path, separate: bool = False, **overrides) -> Path:
    """A saved, briefly trained model directory; `separate` gives it its own target vocabulary."""
    root.mkdir(parents=True, exist_ok=True)
    if separate:
        src_tok = Tokenizer.train(TEXTS[::2] * 3, 40, path=root / "src.spm.model", byte_fallback=False)
        tgt_tok = Tokenizer.train(TEXTS[1::2] * 3, 34, path=root / "tgt.spm.model", byte_fallback=False)
        files = {"src.spm.model": root / "src.spm.model", "tgt.spm.model": root / "tgt.spm.model"}
        overrides = dict(tgt_vocab_size=tgt_tok.vocab_size, tie_embeddings=False, **overrides)
    else:
        src_tok = Tokenizer.train(TEXTS * 3, 48, path=root / "spm.model", byte_fallback=False)
        files = {"spm.model": root / "spm.model"}
    sizes = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0)
    cfg = replace(MICRO, vocab_size=src_tok.vocab_size, **{**sizes, **overrides})
    return save_model(root / "model", train_reverser(cfg), cfg, files)


# --- a local HTTP file server (127.0.0.1 only; the tests never reach the internet) -----------------
# It serves files from a dict, answers HTTP Range requests, records what it was asked, and can break
# off a response midway or ignore Range headers, as real servers and networks do.


@dataclass
class Served:
    files: dict[str, bytes]
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    cut_after: dict[str, int] = field(default_factory=dict)  # name -> bytes sent before breaking off (once)
    ignore_range: bool = False
    url: str = ""


def _handler(served: Served):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            name = self.path.lstrip("/")
            rng = self.headers.get("Range")
            served.requests.append((name, rng))
            data = served.files.get(name)
            if data is None:
                self.send_error(404)
                return
            start = 0
            m = re.fullmatch(r"bytes=(\d+)-", rng or "")
            if m and not served.ignore_range:
                start = int(m.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cut = served.cut_after.pop(name, None)
            self.wfile.write(body if cut is None else body[:cut])
            self.wfile.flush()
            self.close_connection = True

    return Handler


@contextlib.contextmanager
def serve(files: dict[str, bytes], **kw) -> Iterator[Served]:
    """Serve `files` (name -> bytes) at `served.url` for the duration of the block."""
    served = Served(dict(files), **kw)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- the serving tests: engines, uvicorn in a thread, headless Chromium ----------------------------


class GatedModel(ServedModel):
    """A served model whose decoding steps wait while `gate` is clear, so a test decides when
    the model worker may go on; `entered` is set once a step has started."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def search_engine(self, key):
        engine = super().search_engine(key)
        step = engine.step

        def gated():
            self.entered.set()
            assert self.gate.wait(60)
            return step()

        engine.step = gated
        return engine


class FixedAttentionModel(ServedModel):
    """A served model that answers alignment requests with a hand-built cross-attention: target
    piece t attends mostly to source piece t (mod S), the rest spread evenly."""

    supports_alignment = True

    def attention(self, text, source, hyp):
        src = self.src_pieces(source) + ["</s>"]
        tgt = self.tgt_pieces(hyp.tokens) + ["</s>"]
        s = len(src)
        weights = [[0.7 + 0.3 / s if j == t % s else 0.3 / s for j in range(s)] for t in range(len(tgt))]
        pairs = " ".join(f"{max(range(len(row)), key=row.__getitem__)}-{t}"
                         for t, row in enumerate(weights[:-1]))
        return Attention(src, tgt, weights, pairs)


def chrome(profile, width: int, height: int, skip: Callable[[str], None] | None = None,
           fail: Callable[[str], None] | None = None):
    """Debian's headless Chromium (`chromium`) driven through Debian's `chromedriver` by selenium,
    with a fresh profile and no background networking. Missing browser or driver: `fail` under
    CI (which installs both), else `skip`, else RuntimeError."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        message = "needs Debian's chromium and chromium-driver packages (.ci/run installs them)"
        if os.environ.get("CI") and fail is not None:
            fail(message)
        if skip is not None:
            skip(message)
        raise RuntimeError(message)
    # selenium is optional (the `test` extra): imported only where a browser is driven
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium must never fetch a driver or a browser
    chrome_options = webdriver.ChromeOptions()
    chrome_options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                f"--window-size={width},{height}"):
        chrome_options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=chrome_options)


@contextlib.contextmanager
def serve_in_thread(app) -> Iterator[str]:
    """Run `app` on uvicorn at 127.0.0.1 (a free port) in a thread; yields the base URL."""
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="uvicorn to start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for torchrun's MASTER_PORT): never a
    fixed one, since the suite runs on several workers at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
