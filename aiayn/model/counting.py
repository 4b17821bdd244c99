"""Parameter counts and model FLOPs (Table 2, Table 3 "params"), and Table 2's training cost."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aiayn.config import Config
from aiayn.model.build import build_model


def count_parameters(cfg: Config) -> int:
    """Exact trainable-parameter count of the model `cfg` describes (`build_model`), each shared
    matrix counted once. Builds the model on the meta device, so even `big` costs no memory."""
    with torch.device("meta"):
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters())


def matmul_weights_per_token(cfg: Config) -> dict[str, int]:
    """Weights multiplied per token (biases and norms excluded): per source token in the encoder,
    per target token in the decoder and the pre-softmax projection."""
    d, h = cfg.d_model, cfg.n_heads
    qk, vv = h * cfg.head_dim_k, h * cfg.head_dim_v
    attn = d * (2 * qk + vv) + vv * d  # Q, K, V, W^O
    ffn = 2 * d * cfg.d_ff
    return {
        "encoder": cfg.n_layers * (attn + ffn),
        "decoder": cfg.n_layers * (2 * attn + ffn),
        "output": d * cfg.tgt_vocab,
    }


def flops_per_target_token(cfg: Config, src_len: float = 25.0, tgt_len: float = 25.0,
                           training: bool = True) -> float:
    """Model FLOPs per target token: 2 per multiply-add forward, 3x that for training (forward
    plus backward). Attention adds 2*h*(d_k + d_v) per query per key (scores and weighted sum);
    causal masking is not discounted, the usual convention. The encoder's cost per source token is
    charged at src_len / tgt_len source tokens per target token. The RNN baseline
    (`cfg.arch == "rnn"`) is counted by `rnn_flops_per_target_token`."""
    if cfg.arch == "rnn":
        return rnn_flops_per_target_token(cfg, src_len, tgt_len, training)
    w = matmul_weights_per_token(cfg)
    hd = cfg.n_heads * (cfg.head_dim_k + cfg.head_dim_v)
    ratio = src_len / tgt_len
    enc = (2 * w["encoder"] + cfg.n_layers * 2 * hd * src_len) * ratio
    dec = 2 * (w["decoder"] + w["output"]) + cfg.n_layers * 2 * hd * (tgt_len + src_len)
    return (enc + dec) * (3 if training else 1)


def rnn_flops_per_target_token(cfg: Config, src_len: float = 25.0, tgt_len: float = 25.0,
                               training: bool = True) -> float:
    """Model FLOPs per target token of `aiayn.model.rnn.RNNSearch`, counted as the Transformer's:
    2 per multiply-add of the weight products, the additive attention's v_a and context products
    per source position, 3x for training. Encoder: two GRU directions (3 gates, input and
    recurrent products) and the keys U_a h_j, per source token; decoder per target token: W_a s,
    the GRU cell, the readout and the output layer."""
    e, h, a = cfg.rnn_emb, cfg.rnn_hidden, cfg.rnn_attn
    enc = 2 * 3 * (e * h + h * h) + 2 * h * a  # per source token
    dec = h * a + 3 * ((e + 2 * h) * h + h * h) + (h + e + 2 * h) * 2 * e + e * cfg.tgt_vocab
    attn = src_len * (a + 2 * h)  # scores and context, per target token
    return 2 * (enc * src_len / tgt_len + dec + attn) * (3 if training else 1)


# --- Table 2: the paper's training cost -------------------------------------------------------

PAPER_TOKENS_PER_STEP = 25_000  # target tokens in one update (§5.1: ~25,000 of each side)


@dataclass(frozen=True)
class PaperTrainingCost:
    """Table 2's way of counting a model's training cost: training time x number of GPUs x the
    sustained single-precision throughput of one GPU (its footnote: K80 2.8, K40 3.7, M40 6.0,
    P100 9.5 TFLOPS), against the figure Table 2 prints."""

    hours: float
    gpus: int
    tflops: float
    steps: int
    reported: float

    @property
    def flops(self) -> float:
        return self.hours * 3600 * self.gpus * self.tflops * 1e12


# §5.2: base 100K steps in 12 hours, big 300K steps in 3.5 days, both on 8 P100 GPUs.
TABLE2: dict[str, PaperTrainingCost] = {
    "base": PaperTrainingCost(hours=12, gpus=8, tflops=9.5, steps=100_000, reported=3.3e18),
    "big": PaperTrainingCost(hours=3.5 * 24, gpus=8, tflops=9.5, steps=300_000, reported=2.3e19),
}


def training_flops(cfg: Config, steps: int, tokens_per_step: int = PAPER_TOKENS_PER_STEP,
                   src_len: float = 25.0, tgt_len: float = 25.0) -> float:
    """The analytic training cost: model FLOPs per target token x target tokens trained."""
    return flops_per_target_token(cfg, src_len, tgt_len) * steps * tokens_per_step
