"""Every attention weight of one sentence pair: what `aiayn attention` draws and its page browses.

Without a given target, the model translates the source (the translator's search, beam by
default) and the encoder-decoder attention is the one that search used, step by step
(`AttentionRequest`); the encoder's and the decoder's self-attention come from one
teacher-forced pass over the output the search chose, which computes the same weights
(tested: cached and teacher-forced weights agree). With a target, all three come from the
teacher-forced pass over that target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from aiayn.decoding.alignment import EOS_PIECE
from aiayn.decoding.common import AttentionRequest, source_batch
from aiayn.errors import UserError
from aiayn.special import BOS_ID

BOS_PIECE = "<s>"
Kind = Literal["encoder", "decoder", "cross"]
KINDS: tuple[Kind, ...] = ("encoder", "decoder", "cross")
KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
               "cross": "encoder-decoder attention"}
# (query axis, key axis) of each kind's pictures
KIND_AXES = {"encoder": ("source (query)", "source (key)"),
             "decoder": ("decoder input (query)", "decoder input (key)"),
             "cross": ("output piece (query)", "source (key)")}


@dataclass
class AttentionMaps:
    """One sentence pair's attention weights, float32, every row summing to 1.

    src_pieces (S): source pieces then "</s>". dec_pieces (T): the decoder's inputs, "<s>" then
    the target pieces (decoder self-attention queries and keys). out_pieces (T): what each
    decoder position predicts, the target pieces then "</s>" when the output ended (the rows of
    the encoder-decoder attention, as alignments read them).
    encoder (L, h, S, S); decoder (L, h, T, T), zero above the diagonal (causal); cross (L, h, T, S).
    from_search: the cross-attention is the one the search used (no target was given).
    """

    source: str
    target: str
    src_pieces: list[str]
    dec_pieces: list[str]
    out_pieces: list[str]
    encoder: np.ndarray
    decoder: np.ndarray
    cross: np.ndarray
    from_search: bool

    @property
    def n_layers(self) -> int:
        return self.encoder.shape[0]

    @property
    def n_heads(self) -> int:
        return self.encoder.shape[1]

    def view(self, kind: Kind) -> tuple[np.ndarray, list[str], list[str]]:
        """(weights (L, h, Q, K), query labels, key labels) of one kind of attention."""
        if kind == "encoder":
            return self.encoder, self.src_pieces, self.src_pieces
        if kind == "decoder":
            return self.decoder, self.dec_pieces, self.dec_pieces
        return self.cross, self.out_pieces, self.src_pieces

    def to_dict(self, decimals: int = 3) -> dict[str, Any]:
        """JSON-ready, weights rounded (the browsing page embeds this)."""
        return {"source": self.source, "target": self.target, "src_pieces": self.src_pieces,
                "dec_pieces": self.dec_pieces, "out_pieces": self.out_pieces,
                "from_search": self.from_search, "layers": self.n_layers, "heads": self.n_heads,
                **{k: np.round(getattr(self, k), decimals).tolist() for k in KINDS}}


def _stack(weights: list[torch.Tensor]) -> np.ndarray:
    """Per-layer (1, h, Q, K) -> (L, h, Q, K) float32 numpy."""
    return torch.stack([w[0] for w in weights]).float().cpu().numpy()


def collect_attention(translator: Any, source: str, target: str | None = None) -> AttentionMaps:
    """The weights of `source` and its translation by `translator` (`aiayn.decoding.translate.
    Translator`, whose search settings apply), or of the given `target` (teacher-forced)."""
    src = translator.prepare([source])[0]
    if not src:
        raise UserError("the source sentence is empty (or encodes to no pieces)")
    if target is None:
        hyp = translator.search([src], 1, attention=AttentionRequest())[0][0]
        tokens, complete, searched = list(hyp.tokens), hyp.complete, hyp.attention
    else:
        tokens, complete, searched = list(translator.tgt_tokenizer.encode(target)), True, None
    model = translator.model
    steps = len(tokens) + int(complete)  # decoder positions: one per generated token
    device = next(model.parameters()).device
    src_t, src_mask = source_batch([src], device, multiple=1)  # (1, S): no PAD columns to draw
    tgt_in = torch.tensor([[BOS_ID] + tokens[: steps - 1]], device=device)  # (1, T)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            _, w = model(src_t, tgt_in, src_mask, return_attention=True)
    finally:
        model.train(was_training)
    src_pieces = [translator.src_tokenizer.id_to_piece(i) for i in src] + [EOS_PIECE]
    tgt_pieces = [translator.tgt_tokenizer.id_to_piece(i) for i in tokens]
    cross = _stack(w["cross"]) if searched is None else searched.float().cpu().numpy()
    return AttentionMaps(
        source=source, target=translator.detokenize(tokens) if target is None else target,
        src_pieces=src_pieces, dec_pieces=[BOS_PIECE] + tgt_pieces[: steps - 1],
        out_pieces=(tgt_pieces + [EOS_PIECE])[:steps], encoder=_stack(w["encoder"]),
        decoder=_stack(w["self"]), cross=cross, from_search=searched is not None)
