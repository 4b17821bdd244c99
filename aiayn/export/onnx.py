"""Export a model directory to ONNX (`aiayn export --format onnx`): two graphs that onnxruntime, or
any ONNX runtime, runs without PyTorch, and `OnnxGreedy`, a greedy search over them that gives
aiayn's greedy output token for token (tested).

    encoder.onnx   src (B, S) int64, pieces + EOS, PAD-padded
                   -> cross_k (L, B, h, S, d_k), cross_v (L, B, h, S, d_v): every decoder layer's
                      keys and values of the encoder output, computed once per sentence
    decoder.onnx   tokens (B, 1) int64, the last output token (BOS first); step () int64, its
                   position; src_mask (B, S) bool; cross_k, cross_v; past_k (L, B, h, t, d_k),
                   past_v (L, B, h, t, d_v): the self-attention keys and values of the t earlier
                   positions (t = 0 at the first step)
                   -> logp (B, V) float32, log-probabilities of the next token (PAD and BOS at
                      -inf, as aiayn's searches never write them); past_k, past_v with t + 1

Written from aiayn's own modules with `torch.onnx.export` rather than through the Hugging Face
export and Optimum: Optimum's ONNX exporter pins transformers below 5, and two small graphs with
an explicit cache are all a runtime needs. The directory also holds config.json (aiayn's
`Config`) and the sentencepiece model(s), so it tokenizes and decodes on its own. Positions run up
to `max_positions` (default 1024) target tokens. Refused: the RNN baseline and restricted
attention (its ring-buffer cache).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import Config
from aiayn.data.model_dir import CONFIG_FILE, TOKENIZER_FILES, load_model, read_config, tokenizer_files
from aiayn.errors import UserError
from aiayn.export import check_max_positions, require
from aiayn.files import write_dir_atomically
from aiayn.locks import output_directory
from aiayn.model.embedding import sinusoidal_table
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

DEFAULT_MAX_POSITIONS = 1024
ENCODER, DECODER = "encoder.onnx", "decoder.onnx"
# What an export writes: `--overwrite` replaces a directory holding nothing else.
FILES = (ENCODER, DECODER, CONFIG_FILE, *TOKENIZER_FILES)


def require_onnx(module: str) -> Any:
    return require(module, "the ONNX export", "'aiayn[onnx]'")


def check_exportable(cfg: Config) -> None:
    if cfg.arch != "transformer":
        raise UserError(f"cannot export arch={cfg.arch!r} to ONNX: only the Transformer is exported")
    if cfg.attn_window is not None:
        raise UserError(f"cannot export attn_window={cfg.attn_window} to ONNX: its decoding "
                        "cache is a ring buffer, which the exported step does not keep")


class _Encoder(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor) -> tuple[Tensor, Tensor]:
        mask = src != PAD_ID  # (B, S)
        memory = self.model.encode(src, mask)  # (B, S, d_model)
        ks, vs = zip(*(layer.cross_attn.project_kv(memory) for layer in self.model.decoder))
        return torch.stack(ks), torch.stack(vs)  # (L, B, h, S, d_k), (L, B, h, S, d_v)


class _DecoderStep(nn.Module):
    """`Transformer.decode_step` with the cache as inputs and outputs: the same layers, in the
    same order, the new keys and values concatenated instead of written into a buffer."""

    def __init__(self, model: nn.Module, max_positions: int):
        super().__init__()
        self.model = model
        cfg = model.cfg
        table = (model.tgt_pos.weight.detach() if cfg.positions == "learned"
                 else sinusoidal_table(max_positions, cfg.d_model))
        self.register_buffer("positions", table, persistent=False)  # (P, d_model)

    def forward(self, tokens: Tensor, step: Tensor, src_mask: Tensor, cross_k: Tensor,
                cross_v: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        m = self.model
        y = m.target_embedding(tokens) + self.positions[step].reshape(1, 1, -1)  # (B, 1, d_model)
        cross_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        new_k, new_v = [], []
        for i, layer in enumerate(m.decoder):
            q, k, v = layer.self_attn.project_qkv(layer.res_self.inp(y))  # (B, h, 1, d)
            k_all = torch.cat([past_k[i], k], dim=2)  # (B, h, t + 1, d_k)
            v_all = torch.cat([past_v[i], v], dim=2)
            a, _ = layer.self_attn.attend(q, k_all, v_all, None)
            y = layer.res_self.out(y, a)
            q = layer.cross_attn.project_q(layer.res_cross.inp(y))
            a, _ = layer.cross_attn.attend(q, cross_k[i], cross_v[i], cross_mask)
            y = layer.res_cross.out(y, a)
            y = layer.res_ffn.out(y, layer.ffn(layer.res_ffn.inp(y)))
            new_k.append(k_all)
            new_v.append(v_all)
        if m.dec_norm is not None:
            y = m.dec_norm(y)
        logp = torch.log_softmax(m.logits(y[:, 0]).float(), dim=-1)  # (B, V)
        never = torch.zeros_like(logp[:1], dtype=torch.bool)
        never[:, [PAD_ID, BOS_ID]] = True
        return logp.masked_fill(never, float("-inf")), torch.stack(new_k), torch.stack(new_v)


@contextlib.contextmanager
def _quiet_exporter():
    """torch.onnx.export's own chatter (a line per torchvision op it skips, warnings about axis
    names and deprecated tree specs) says nothing about the user's model: keep it off the
    terminal, errors excepted."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._export")]
    levels = [lg.level for lg in loggers]
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export_graphs(model: nn.Module, out: Path, max_positions: int = DEFAULT_MAX_POSITIONS) -> None:
    """Write encoder.onnx and decoder.onnx of `model` (an aiayn `Transformer`, float32) into `out`."""
    require_onnx("onnxscript")  # what torch.onnx.export builds graphs with
    cfg: Config = model.cfg
    check_exportable(cfg)
    model = model.float().eval()
    h, dk, dv, n = cfg.n_heads, cfg.head_dim_k, cfg.head_dim_v, cfg.n_layers
    src = torch.tensor([[4, 5, 6, EOS_ID], [7, EOS_ID, PAD_ID, PAD_ID]])
    batch, src_len, past_len = (torch.export.Dim("batch"), torch.export.Dim("src_len"),
                                torch.export.Dim("past_len"))
    with torch.no_grad(), _quiet_exporter():
        torch.onnx.export(_Encoder(model), (src,), str(out / ENCODER), input_names=["src"],
                          output_names=["cross_k", "cross_v"],
                          dynamic_shapes={"src": {0: batch, 1: src_len}}, verbose=False,
                          external_data=False)
        cross_k, cross_v = _Encoder(model)(src)
        args = (torch.tensor([[BOS_ID], [9]]), torch.tensor(1), src != PAD_ID, cross_k, cross_v,
                torch.zeros(n, 2, h, 1, dk), torch.zeros(n, 2, h, 1, dv))
        names = ["tokens", "step", "src_mask", "cross_k", "cross_v", "past_k", "past_v"]
        shapes = {"tokens": {0: batch}, "step": None, "src_mask": {0: batch, 1: src_len},
                  "cross_k": {1: batch, 3: src_len}, "cross_v": {1: batch, 3: src_len},
                  "past_k": {1: batch, 3: past_len}, "past_v": {1: batch, 3: past_len}}
        torch.onnx.export(_DecoderStep(model, max_positions), args, str(out / DECODER),
                          input_names=names, output_names=["logp", "new_past_k", "new_past_v"],
                          dynamic_shapes=shapes, verbose=False, external_data=False)


def export_onnx(model_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False,
                max_positions: int | None = None) -> Path:
    """Write `model_dir` (an aiayn model directory) as an ONNX directory (module docstring),
    atomically; the output is locked while it is written, and replaced only when it is such a
    directory and `overwrite` is given."""
    src, out = Path(model_dir), Path(out_dir)
    check_exportable(read_config(src))  # before loading any weights
    n_pos = max_positions or DEFAULT_MAX_POSITIONS
    check_max_positions(n_pos)
    with output_directory(out, "aiayn export", overwrite, DECODER, "an ONNX model directory", [src],
                          files=FILES):
        loaded = load_model(src)

        def fill(tmp: Path) -> None:
            export_graphs(loaded.model, tmp, n_pos)
            shutil.copyfile(src / CONFIG_FILE, tmp / CONFIG_FILE)
            for name, f in tokenizer_files(src).items():
                shutil.copyfile(f, tmp / name)

        return write_dir_atomically(out, fill)


class OnnxGreedy:
    """Greedy search over an exported directory with onnxruntime, as aiayn's greedy search
    (`SearchOptions(greedy=True)`) searches: the next token is the most probable one but PAD and
    BOS; a sentence ends at EOS or at floor(max_len_a * S + max_len_b) tokens (S its source
    tokens, EOS included). Sentences of a batch that end leave it, so they cost nothing more."""

    def __init__(self, directory: str | os.PathLike, threads: int | None = None):
        ort = require_onnx("onnxruntime")
        d = Path(directory)
        self.cfg = read_config(d)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.encoder = ort.InferenceSession(str(d / ENCODER), options, providers=["CPUExecutionProvider"])
        self.decoder = ort.InferenceSession(str(d / DECODER), options, providers=["CPUExecutionProvider"])

    def search(self, sources: list[list[int]]) -> list[list[int]]:
        """Output pieces (EOS dropped) of each source, given as pieces without EOS."""
        cfg = self.cfg
        n = len(sources)
        width = max(len(s) for s in sources) + 1
        src = np.full((n, width), PAD_ID, dtype=np.int64)
        for i, s in enumerate(sources):
            src[i, : len(s)] = s
            src[i, len(s)] = EOS_ID
        mask = src != PAD_ID
        max_lens = np.floor(cfg.max_len_a * mask.sum(1) + cfg.max_len_b + 1e-9).astype(np.int64)
        cross_k, cross_v = self.encoder.run(None, {"src": src})
        past_k = np.zeros((cfg.n_layers, n, cfg.n_heads, 0, cfg.head_dim_k), np.float32)
        past_v = np.zeros((cfg.n_layers, n, cfg.n_heads, 0, cfg.head_dim_v), np.float32)
        rows = np.arange(n)
        last = np.full((n, 1), BOS_ID, dtype=np.int64)
        out: list[list[int]] = [[] for _ in range(n)]
        t = 0
        while len(rows):
            logp, past_k, past_v = self.decoder.run(None, {
                "tokens": last, "step": np.array(t, dtype=np.int64), "src_mask": mask,
                "cross_k": cross_k, "cross_v": cross_v, "past_k": past_k, "past_v": past_v})
            tok = logp.argmax(-1)
            t += 1
            for r, k in zip(rows, tok):
                if k != EOS_ID:
                    out[r].append(int(k))
            keep = (tok != EOS_ID) & (t < max_lens[rows])
            if not keep.all():
                rows, tok = rows[keep], tok[keep]
                mask, cross_k, cross_v = mask[keep], cross_k[:, keep], cross_v[:, keep]
                past_k, past_v = past_k[:, keep], past_v[:, keep]
            last = tok[:, None].astype(np.int64)
        return out
