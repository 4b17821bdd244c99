"""Export a model directory to Hugging Face Transformers (`aiayn export --format huggingface`):
the paper's post-norm model as a `MarianMTModel`, a pre-norm one (`norm="pre"`, as the recipe's
`translation-tiny-v2`) as a `PegasusForConditionalGeneration`. `from_pretrained` loads it (either
class through `AutoModelForSeq2SeqLM`), `generate` translates with it, the Hub takes it.

The paper's Transformer is, weight for weight, Marian's: post-norm layers, LayerNorm(x +
Dropout(Sublayer(x))) (§3.1), attention and FFN with the same shapes, embeddings scaled by
sqrt(d_model) (§3.4) and tied to the pre-softmax projection, sinusoidal positions (§3.5), ReLU.
aiayn's pre-norm option is, weight for weight, Pegasus's: Pegasus is Marian's model (the same
attention, FFN, scaled and tied embeddings, no LayerNorm on the embeddings, zero output bias,
sinusoids from position 0 in Marian's layout, by the same code) with each sub-layer wrapped as
x + Dropout(Sublayer(LayerNorm(x))) and a final LayerNorm at the end of the encoder and of the
decoder, which is `norm="pre"` in aiayn (`Residual`, the stacks' `enc_norm` and `dec_norm`). The
dropouts sit where aiayn's do (P_drop on the embeddings' sum and each sub-layer's output,
`p_attn_drop` on the attention weights, `p_ffn_drop` on the ReLU's output), for fine-tuning;
aiayn's source word dropout (`p_word_drop`) has no counterpart. Decoding uses none of them.

One thing differs in layout: aiayn interleaves the sinusoid's dimensions (sine at 2i, cosine at
2i + 1) while Marian and Pegasus put the sines first (sine at i, cosine at d/2 + i), with the
same frequencies. A permutation of the model dimension carries one into the other exactly
through every weight that reads or writes the residual stream: the embeddings' columns, the
input columns of Q/K/V and of the FFN's first matrix, the output rows of W^O and of the FFN's
second matrix and their biases, and every LayerNorm's gains and biases (the stacks' final ones
too); the attention heads and the FFN's inner units are untouched. Attention in the permuted
basis computes the same numbers, and so do the logits (the tied output matrix is permuted with
the embeddings).

What differs, said plainly (the same for both classes):
- LayerNorm epsilon: Marian's and Pegasus's are PyTorch's 1e-5 (not configurable), aiayn's
  `Config.layer_norm_eps` (1e-6 by default): the fp32 logits differ in about the 5th
  significant digit; a model trained with layer_norm_eps=1e-5 gives aiayn's fp32 logits to
  float32 rounding (tested, post- and pre-norm).
- Search: Hugging Face's beam search divides a hypothesis's log-probability by |Y|**alpha
  (`length_penalty`, EOS counted), not by the GNMT penalty ((5 + |Y|) / 6)**alpha of §6.1, and
  has no per-sentence maximum length (a * source length + b). Greedy search is the same search,
  and so is beam search when both rank by log-probability alone (`length_penalty=0` there,
  alpha = 0 here): tested token for token at fp32.
- Tokenizer: the export writes `MarianTokenizer`'s files for either class (Pegasus's own
  tokenizer numbers its specials otherwise); `AutoTokenizer` loads them. It reads the same
  sentencepiece model, but first normalizes punctuation with sacremoses (quotes, dashes), and
  strips the text it decodes; plain text gives the same ids and the same translation.
Refused, one line each: the RNN baseline, learned positions, restricted attention, separate
source and target vocabularies, untied output, head sizes other than d_model / h, and an odd
d_model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from aiayn.config import Config
from aiayn.data.model_dir import load_model, read_config
from aiayn.errors import UserError
from aiayn.export import check_max_positions, require
from aiayn.files import write_dir_atomically
from aiayn.locks import output_directory
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

DEFAULT_MAX_POSITIONS = 1024  # Marian's and Pegasus's position table; aiayn's sinusoids have no limit
# What an export writes (`save_pretrained` of the model, sharded or not, and of MarianTokenizer):
# `--overwrite` replaces a directory holding nothing else.
FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
         "model.safetensors.index.json", "source.spm", "target.spm", "vocab.json",
         "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


def require_transformers() -> Any:
    return require("transformers", "exporting to Hugging Face", "'aiayn[huggingface]'")


def model_class(cfg: Config) -> str:
    """The Hugging Face class that holds `cfg`'s model: Marian for post-norm, Pegasus for pre-norm."""
    return "PegasusForConditionalGeneration" if cfg.norm == "pre" else "MarianMTModel"


def check_exportable(cfg: Config) -> None:
    """Refuse, in one line naming the option, what neither a MarianMTModel nor a
    PegasusForConditionalGeneration can hold (post-norm goes to the one, pre-norm to the other)."""
    refusals = [
        (cfg.arch != "transformer", f"arch={cfg.arch!r}: only the Transformer is exported"),
        (cfg.positions != "sinusoidal", "positions='learned': Marian's and Pegasus's positions "
                                        "are sinusoids"),
        (cfg.attn_window is not None, f"attn_window={cfg.attn_window}: Marian and Pegasus have no "
                                      "restricted self-attention"),
        (cfg.tgt_vocab != cfg.src_vocab or not cfg.tie_embeddings,
         "separate vocabularies or untied embeddings: the export holds the paper's one shared, "
         "tied vocabulary (§3.4)"),
        (cfg.head_dim_k != cfg.d_model // cfg.n_heads or cfg.head_dim_v != cfg.d_model // cfg.n_heads,
         f"d_k={cfg.head_dim_k}, d_v={cfg.head_dim_v}: Marian's and Pegasus's heads are d_model / "
         f"h = {cfg.d_model // cfg.n_heads} wide"),
        (cfg.d_model % 2 == 1, f"d_model={cfg.d_model}: the sinusoid permutation needs an even width"),
    ]
    for refused, why in refusals:
        if refused:
            raise UserError(f"cannot export to Hugging Face: {why}")


def residual_permutation(d_model: int) -> torch.Tensor:
    """(d_model,) long: Marian's (and Pegasus's) dimension j is aiayn's dimension perm[j] (the
    sines of aiayn's even dimensions first, then the cosines of its odd ones)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def hf_config(cfg: Config, max_positions: int) -> Any:
    """A MarianConfig (post-norm) or PegasusConfig (pre-norm) of `cfg`'s sizes and dropouts, with
    aiayn's special ids; both scale the embeddings by sqrt(d_model) and tie them to the output."""
    transformers = require_transformers()
    common = dict(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.n_layers,
        encoder_attention_heads=cfg.n_heads, decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function="relu",
        max_position_embeddings=max_positions, scale_embedding=True,
        dropout=cfg.p_drop, attention_dropout=cfg.p_attn_drop, activation_dropout=cfg.p_ffn_drop,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID, forced_eos_token_id=None, tie_word_embeddings=True)
    if cfg.norm == "pre":  # Pegasus always shares the encoder's and decoder's embeddings
        return transformers.PegasusConfig(**common)
    return transformers.MarianConfig(**common, decoder_vocab_size=cfg.vocab_size,
                                     share_encoder_decoder_embeddings=True)


@torch.no_grad()
def to_huggingface(model: Any, max_positions: int = DEFAULT_MAX_POSITIONS) -> Any:
    """A `transformers.MarianMTModel` (post-norm) or `PegasusForConditionalGeneration` (pre-norm),
    in eval mode, holding `model`'s weights (an aiayn `Transformer`, float32), the residual stream
    permuted to their sinusoid layout."""
    transformers = require_transformers()
    cfg: Config = model.cfg
    check_exportable(cfg)
    hf = getattr(transformers, model_class(cfg))(hf_config(cfg, max_positions)).eval()
    p = residual_permutation(cfg.d_model)
    d = cfg.d_model

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.detach().float().cpu()

    def reads(dst: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """A projection that reads the residual stream: its input columns permuted."""
        dst.weight.copy_(f32(weight)[:, p])
        dst.bias.copy_(f32(bias) if bias is not None else torch.zeros_like(dst.bias))

    def writes(dst: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """A projection that writes the residual stream: its output rows permuted."""
        dst.weight.copy_(f32(weight)[p, :])
        dst.bias.copy_(f32(bias)[p] if bias is not None else torch.zeros_like(dst.bias))

    def norm(dst: Any, src: Any) -> None:
        dst.weight.copy_(f32(src.weight)[p])
        dst.bias.copy_(f32(src.bias)[p])

    def ffn(dst: Any, src: Any) -> None:
        reads(dst.fc1, src.ffn.w1.weight, src.ffn.w1.bias)
        writes(dst.fc2, src.ffn.w2.weight, src.ffn.w2.bias)

    def split(linear: Any, parts: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """A fused projection's blocks (q, k, v or k, v), each (d, d) with its bias."""
        biases = linear.bias.split(d) if linear.bias is not None else [None] * parts
        return list(zip(linear.weight.split(d), biases))

    def self_attention(theirs, ours) -> None:  # a layer's self-attention, encoder or decoder
        for dst, (w, b) in zip((theirs.self_attn.q_proj, theirs.self_attn.k_proj,
                                theirs.self_attn.v_proj), split(ours.self_attn.qkv_proj, 3)):
            reads(dst, w, b)
        writes(theirs.self_attn.out_proj, ours.self_attn.out_proj.weight, ours.self_attn.out_proj.bias)

    hf.model.shared.weight.copy_(f32(model.src_embed.weight)[:, p])  # also lm_head: tied
    for ours, theirs in zip(model.encoder, hf.model.encoder.layers):
        self_attention(theirs, ours)
        norm(theirs.self_attn_layer_norm, ours.res_attn.norm)
        ffn(theirs, ours)
        norm(theirs.final_layer_norm, ours.res_ffn.norm)
    for ours, theirs in zip(model.decoder, hf.model.decoder.layers):
        self_attention(theirs, ours)
        norm(theirs.self_attn_layer_norm, ours.res_self.norm)
        reads(theirs.encoder_attn.q_proj, ours.cross_attn.q_proj.weight, ours.cross_attn.q_proj.bias)
        for dst, (w, b) in zip((theirs.encoder_attn.k_proj, theirs.encoder_attn.v_proj),
                               split(ours.cross_attn.kv_proj, 2)):
            reads(dst, w, b)
        writes(theirs.encoder_attn.out_proj, ours.cross_attn.out_proj.weight,
               ours.cross_attn.out_proj.bias)
        norm(theirs.encoder_attn_layer_norm, ours.res_cross.norm)
        ffn(theirs, ours)
        norm(theirs.final_layer_norm, ours.res_ffn.norm)
    if cfg.norm == "pre":  # each stack's final LayerNorm (Marian's post-norm has none)
        norm(hf.model.encoder.layer_norm, model.enc_norm)
        norm(hf.model.decoder.layer_norm, model.dec_norm)
    hf.final_logits_bias.zero_()
    return hf


def write_tokenizer(directory: Path, tokenizer: Any, langs: tuple[str | None, str | None]) -> None:
    """MarianTokenizer's files, for either model class: the sentencepiece model as source.spm and
    target.spm, vocab.json (each piece's id: aiayn's ids are sentencepiece's) and
    tokenizer_config.json, which names MarianTokenizer for `AutoTokenizer`."""
    transformers = require_transformers()
    spm = directory / "spm.model"
    tokenizer.save(spm)
    vocab = directory / "vocab.json"
    vocab.write_text(json.dumps({tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)},
                                ensure_ascii=False), encoding="utf-8")
    tok = transformers.MarianTokenizer(str(spm), str(spm), str(vocab), source_lang=langs[0],
                                       target_lang=langs[1])
    tok.save_pretrained(str(directory))
    spm.unlink()


def export_huggingface(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                       overwrite: bool = False, max_positions: int | None = None) -> Path:
    """Write `model_dir` (an aiayn model directory) as a Hugging Face model directory, a
    MarianMTModel or PegasusForConditionalGeneration (`model_class`), with MarianTokenizer's files
    (config.json, generation_config.json, model.safetensors, the tokenizer's files), atomically;
    the output is locked while it is written, and replaced only when it is such a directory
    and `overwrite` is given."""
    transformers = require_transformers()
    src, out = Path(model_dir), Path(out_dir)
    check_exportable(read_config(src))  # before loading any weights
    n_pos = max_positions or DEFAULT_MAX_POSITIONS
    check_max_positions(n_pos)
    with output_directory(out, "aiayn export", overwrite, "tokenizer_config.json",
                          "a Hugging Face model directory", [src], files=FILES):
        loaded = load_model(src)
        langs = (loaded.meta.get("src_lang"), loaded.meta.get("tgt_lang"))
        hf = to_huggingface(loaded.model, n_pos)
        generation = transformers.GenerationConfig(
            decoder_start_token_id=BOS_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
            pad_token_id=PAD_ID, num_beams=loaded.cfg.beam_size, max_length=n_pos,
            suppress_tokens=[PAD_ID, BOS_ID])  # aiayn's search never writes them

        def fill(tmp: Path) -> None:
            hf.generation_config = generation
            hf.save_pretrained(str(tmp))
            write_tokenizer(tmp, loaded.src_tokenizer, langs)

        return write_dir_atomically(out, fill)
