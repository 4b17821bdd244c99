"""Export a model directory to CTranslate2 (`aiayn export --format ctranslate2`), for fast
deployment and for comparing decoders on the same weights.

The model is described with CTranslate2's own specification API (`ctranslate2.specs`): a
`TransformerSpec` whose variables are filled from our modules, then validated, optionally quantized,
and saved. What maps one to one:

- post-norm (§3.1) or pre-norm (plus the final LayerNorm of each stack), ReLU FFN (§3.3, Eq. 2),
  with our LayerNorm epsilon;
- the fused projections: self-attention's one (Q; K; V) matrix and cross-attention's Q and (K; V)
  matrices are stored in the same stacked layout CTranslate2 reads; optional biases (`attn_bias`);
- embeddings scaled by sqrt(d_model) (§3.4) and the positional encodings (§3.5) written out as a
  table: our sinusoids interleave sin/cos per dimension pair, which is not CTranslate2's built-in
  layout, so its built-in table must not be used; learned positions (Table 3 row E) are a table
  anyway;
- tied or untied output projection, shared or separate vocabularies. Tokens are the
  sentencepiece pieces in id order (our ids are sentencepiece ids), so PAD=0 UNK=1 BOS=2 EOS=3 keep
  their positions; CTranslate2 starts decoding with our BOS, stops on our EOS, and appends EOS
  to each source itself (`add_source_eos`), as our batches do.

Refused with a `UserError` naming the option: `arch` other than the Transformer, `attn_window`
(CTranslate2 has no two-sided window for the encoder) and d_k != d_v (it has one head size for
queries, keys and values).

Two behaviours stay with the caller: aiayn's searches never emit PAD or BOS, so pass
`suppress_sequences=[["<pad>"], ["<s>"]]` (our piece names) to `translate_batch` for identical
outputs; and the positional table has `max_positions` rows, the longest input or output
CTranslate2 can then take.

ctranslate2 is an optional dependency (`pip install 'aiayn[export]'`), imported where it is used:
without it this module still imports, and `require_ctranslate2` says what to install.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from aiayn.config import Config
from aiayn.data.model_dir import TOKENIZER_FILES, load_model, read_config, tokenizer_files
from aiayn.errors import UserError
from aiayn.export import check_max_positions, require
from aiayn.files import write_dir_atomically
from aiayn.locks import output_directory
from aiayn.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# Rows of the sinusoid table when the caller gives none: a source of 1024 tokens (aiayn
# translate's default limit) plus room for its output.
DEFAULT_SINUSOID_POSITIONS = 2048
# What an export writes (CTranslate2's spec.save: model.bin, config.json, the vocabularies; our
# sentencepiece models): `--overwrite` replaces a directory holding nothing else.
FILES = ("model.bin", "config.json", "*vocabulary.json", "*vocabulary.txt", *TOKENIZER_FILES)


def require_ctranslate2() -> Any:
    return require("ctranslate2", "exporting to CTranslate2", "'aiayn[export]'")


def check_exportable(cfg: Config) -> None:
    """Refuse, in one line naming the option, what CTranslate2 cannot represent."""
    if cfg.arch != "transformer":
        raise UserError(f"cannot export arch={cfg.arch!r} to CTranslate2: only the Transformer "
                        "is exported")
    if cfg.attn_window is not None:
        raise UserError(f"cannot export attn_window={cfg.attn_window} to CTranslate2: it has no "
                        "restricted (windowed) self-attention for the encoder")
    if cfg.head_dim_k != cfg.head_dim_v:
        raise UserError(f"cannot export d_k={cfg.head_dim_k} with d_v={cfg.head_dim_v} to "
                        "CTranslate2: it uses one head size for queries, keys and values")


def _np(t: Any):
    return t.detach().float().cpu().numpy()


def _linear(spec: Any, module: Any) -> None:
    spec.weight = _np(module.weight)  # (out, in), the layout of nn.Linear
    if module.bias is not None:
        spec.bias = _np(module.bias)


def _norm(spec: Any, module: Any) -> None:
    spec.gamma, spec.beta = _np(module.weight), _np(module.bias)


def _positions(module: Any, n: int):
    """The (n, d_model) table of a positions module: learned weights, or sinusoids (§3.5)."""
    if hasattr(module, "weight"):  # learned: its own size, max_positions
        return _np(module.weight)
    return _np(module(n))  # sinusoidal: forward(t) gives positions [0, t)


def build_spec(model: Any, src_tokens: Sequence[str], tgt_tokens: Sequence[str],
               max_positions: int | None = None) -> Any:
    """A validated `ctranslate2.specs.TransformerSpec` holding the weights of `model` (an
    aiayn `Transformer`); `src_tokens`/`tgt_tokens` name every id of each vocabulary, ids 0-3
    being PAD, UNK, BOS, EOS. `max_positions` sizes a sinusoid table (default 2048)."""
    ctranslate2 = require_ctranslate2()
    from ctranslate2.specs import TransformerDecoderSpec, TransformerEncoderSpec, TransformerSpec

    cfg: Config = model.cfg
    check_exportable(cfg)
    if len(src_tokens) != cfg.src_vocab or len(tgt_tokens) != cfg.tgt_vocab:
        raise UserError(f"the vocabularies have {len(src_tokens)} and {len(tgt_tokens)} tokens, "
                        f"the model {cfg.src_vocab} and {cfg.tgt_vocab}")
    specials = [(src_tokens[i], tgt_tokens[i]) for i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID)]
    if any(s != t for s, t in specials):
        raise UserError(f"source and target vocabularies name their special tokens differently "
                        f"({specials}); CTranslate2 needs one name for each")
    pre = cfg.norm == "pre"
    d, h = cfg.d_model, cfg.n_heads
    # CTranslate2 derives the head size as d_model / h unless told otherwise (Table 3 rows A, B).
    head_dim = None if d % h == 0 and cfg.head_dim_k == d // h else cfg.head_dim_k
    encoder = TransformerEncoderSpec(cfg.n_layers, h, pre_norm=pre, head_dim=head_dim)
    decoder = TransformerDecoderSpec(cfg.n_layers, h, pre_norm=pre, head_dim=head_dim)
    spec = TransformerSpec(encoder, decoder)
    n_pos = max_positions or (cfg.max_positions if cfg.positions == "learned"
                              else DEFAULT_SINUSOID_POSITIONS)

    # §3.4, §3.5: embedding * sqrt(d_model) + position table.
    for stack, embed, pos in ((encoder, model.src_embed, model.src_pos),
                              (decoder, model.target_embedding, model.tgt_pos)):
        emb = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        emb.weight = _np(embed.weight)
        stack.scale_embeddings = True  # multiply by sqrt(d_model), as ScaledEmbedding does
        stack.position_encodings.encodings = _positions(pos, n_pos)
    if pre:
        _norm(encoder.layer_norm, model.enc_norm)
        _norm(decoder.layer_norm, model.dec_norm)
    # §3.4: the pre-softmax projection, the target embedding itself when tied.
    decoder.projection.weight = _np(model.out_proj.weight if model.out_proj is not None
                                    else model.target_embedding.weight)

    # §3.1: each sub-layer's LayerNorm is the one CTranslate2 keeps beside it, applied before
    # (pre-norm) or after the residual sum (post-norm) as `pre_norm` says.
    for ls, layer in zip(encoder.layer, model.encoder):
        _linear(ls.self_attention.linear[0], layer.self_attn.qkv_proj)  # (Q; K; V) stacked
        _linear(ls.self_attention.linear[1], layer.self_attn.out_proj)  # W^O
        _norm(ls.self_attention.layer_norm, layer.res_attn.norm)
        _linear(ls.ffn.linear_0, layer.ffn.w1)
        _linear(ls.ffn.linear_1, layer.ffn.w2)
        _norm(ls.ffn.layer_norm, layer.res_ffn.norm)
    for ls, layer in zip(decoder.layer, model.decoder):
        _linear(ls.self_attention.linear[0], layer.self_attn.qkv_proj)
        _linear(ls.self_attention.linear[1], layer.self_attn.out_proj)
        _norm(ls.self_attention.layer_norm, layer.res_self.norm)
        _linear(ls.attention.linear[0], layer.cross_attn.q_proj)
        _linear(ls.attention.linear[1], layer.cross_attn.kv_proj)  # (K; V) stacked
        _linear(ls.attention.linear[2], layer.cross_attn.out_proj)
        _norm(ls.attention.layer_norm, layer.res_cross.norm)
        _linear(ls.ffn.linear_0, layer.ffn.w1)
        _linear(ls.ffn.linear_1, layer.ffn.w2)
        _norm(ls.ffn.layer_norm, layer.res_ffn.norm)

    conf = spec.config
    conf.unk_token, conf.bos_token, conf.eos_token = (tgt_tokens[UNK_ID], tgt_tokens[BOS_ID],
                                                      tgt_tokens[EOS_ID])
    conf.decoder_start_token = tgt_tokens[BOS_ID]  # decoder input = [BOS] + pieces
    conf.add_source_eos = True  # source = pieces + [EOS]
    conf.layer_norm_epsilon = cfg.layer_norm_eps
    spec.register_source_vocabulary(list(src_tokens))
    spec.register_target_vocabulary(list(tgt_tokens))
    try:
        spec.validate()
    except ValueError as e:  # a spec we filled wrongly is our bug, but say where
        raise RuntimeError(f"CTranslate2 {ctranslate2.__version__} rejected the spec: {e}") from e
    return spec


def check_quantization(quantization: str | None) -> None:
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise UserError(f"unknown quantization {quantization!r}; choose from "
                        f"{', '.join(ACCEPTED_MODEL_TYPES)}")


def save_spec(spec: Any, out_dir: str | os.PathLike, quantization: str | None = None,
              overwrite: bool = False, files: Sequence[Path] = ()) -> Path:
    """Quantize (optional) and write `spec` to `out_dir` atomically, with `files` copied beside;
    the output is locked while it is written (a second export into it is refused)."""
    check_quantization(quantization)
    with output_directory(out_dir, "aiayn export", overwrite, "model.bin",
                          "a CTranslate2 model directory", files=FILES):
        for f in files:
            spec.register_file(str(f))  # copied by spec.save
        spec.validate()  # again: wraps any array set since build_spec, as optimize expects
        spec.optimize(quantization=quantization)  # also stores tied/shared matrices once
        return write_dir_atomically(out_dir, lambda tmp: spec.save(str(tmp)))


def export_ctranslate2(model_dir: str | os.PathLike, out_dir: str | os.PathLike,
                       quantization: str | None = None, overwrite: bool = False,
                       max_positions: int | None = None) -> Path:
    """Convert an aiayn model directory into a CTranslate2 model directory (model.bin,
    config.json, vocabularies) holding also the sentencepiece model(s), to tokenize with."""
    require_ctranslate2()
    src, out = Path(model_dir), Path(out_dir)
    check_exportable(read_config(src))  # before loading any weights
    check_quantization(quantization)
    with output_directory(out, "aiayn export", overwrite, "model.bin", "a CTranslate2 model directory",
                          [src], files=FILES):
        pass  # refused before the slow work, not only when the output is written
    check_max_positions(max_positions)
    loaded = load_model(src)
    for side, tok, n in (("source", loaded.src_tokenizer, loaded.cfg.src_vocab),
                         ("target", loaded.tgt_tokenizer, loaded.cfg.tgt_vocab)):
        if tok.vocab_size != n:
            raise UserError(f"{src}: the {side} tokenizer has {tok.vocab_size} pieces but the model "
                            f"a vocabulary of {n}")
    pieces = [[t.id_to_piece(i) for i in range(t.vocab_size)]
              for t in (loaded.src_tokenizer, loaded.tgt_tokenizer)]
    spec = build_spec(loaded.model, pieces[0], pieces[1], max_positions)
    return save_spec(spec, out, quantization, overwrite, list(tokenizer_files(src).values()))
