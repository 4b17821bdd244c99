"""Ensemble decoding: several models searched as one (not in the paper, which decodes one model;
used when more than one model directory is given: `aiayn parse --model A B`, `aiayn translate
--model A B`).

At each step the ensemble's next-token distribution is the mean of its members' distributions,

    p(y_t | y_<t, x) = 1/M * sum_m p_m(y_t | y_<t, x),

computed as logsumexp_m(log p_m) - log M in float32; beam and greedy search then run on it
unchanged (`Ensemble` has the model API they use: encode, new_cache, decode_step and the cache's
reorder). Members may differ in size and architecture but must share their vocabularies, so that
a token id means the same piece to every one; decoding settings (beam, alpha, maximum length)
come from the first member's config. Kept attention weights (alignments) are per model, so an
ensemble has none.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor

from aiayn.data.model_dir import LoadedModel, load_model
from aiayn.decoding.common import decoder_length_cap
from aiayn.decoding.search import decoding_defaults
from aiayn.errors import UserError


@dataclass
class EnsembleCache:
    """One decoding state per member (a `KVCache` for a Transformer), reordered together: row i
    of every member's state is the same hypothesis."""

    members: list[Any]

    def reorder(self, index: Tensor, cross_index: Tensor | None | bool = True) -> None:
        for cache in self.members:
            cache.reorder(index, cross_index=cross_index)

    def extend(self, other: "EnsembleCache") -> "EnsembleCache":
        """Sentences joining later: each member's state extended by theirs."""
        self.members = [mine.extend(theirs) for mine, theirs in zip(self.members, other.members)]
        return self


class Ensemble:
    """`members` (models with the decoding API, in eval mode for search) decoded as one model
    whose next-token probabilities are the mean of theirs. `cfg` is the first member's config;
    where a member has learned positions, its `max_positions` caps the ensemble's too."""

    def __init__(self, members: Sequence[Any]):
        if not members:
            raise ValueError("an ensemble needs at least one model")
        self.members = list(members)
        cfg = decoding_defaults(self.members[0])
        caps = [c for c in map(decoder_length_cap, self.members) if c is not None]
        if caps:
            cfg = replace(cfg, positions="learned", max_positions=min(caps))
        self.cfg = cfg

    def __len__(self) -> int:
        return len(self.members)

    # --- what the search and the Translator use of an nn.Module ---------------------------------
    @property
    def training(self) -> bool:
        return any(getattr(m, "training", False) for m in self.members)

    def eval(self) -> "Ensemble":
        return self.train(False)

    def train(self, mode: bool = True) -> "Ensemble":
        for m in self.members:
            if hasattr(m, "train"):
                m.train(mode)
        return self

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        for m in self.members:
            if hasattr(m, "parameters"):
                yield from m.parameters()

    # --- the decoding API -------------------------------------------------------------------
    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> list[Tensor]:
        """src: (B, S) -> one memory per member, each (B, S, d_model of that member)."""
        return [m.encode(src, src_mask) for m in self.members]

    def new_cache(self, memory: Sequence[Tensor], src_mask: Tensor) -> EnsembleCache:
        return EnsembleCache([m.new_cache(mem, src_mask) for m, mem in zip(self.members, memory)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache, return_attention: bool = False
                    ) -> Tensor:
        """tokens: (B, 1) -> (B, V) log of the members' mean next-token probabilities (already
        normalised, so the search's log-softmax leaves them as they are); advances every
        member's cache."""
        if return_attention:
            raise ValueError("an ensemble keeps no attention weights (each model has its own); "
                             "align with one model")
        logps = []
        for m, c in zip(self.members, cache.members):
            logits = m.decode_step(tokens, c)  # (B, V)
            if logps and logits.size(-1) != logps[0].size(-1):
                raise ValueError(f"ensemble members disagree on the target vocabulary size: "
                                 f"{logps[0].size(-1)} and {logits.size(-1)}")
            logps.append(torch.log_softmax(logits.float(), dim=-1))
        stacked = torch.stack(logps)  # (M, B, V)
        return torch.logsumexp(stacked, dim=0) - math.log(len(logps))  # (B, V)


def load_models(paths: Sequence[str | os.PathLike], device: str | torch.device = "cpu") -> Any:
    """One model directory: `aiayn.data.model_dir.load_model`'s `LoadedModel`. Several: one
    `LoadedModel` whose model is their `Ensemble`, with the first's tokenizers, config and meta;
    a UserError (one line) when a model's tokenizers differ from the first's."""
    if not paths:
        raise UserError("no model directory given")
    loaded = [load_model(p, device) for p in paths]
    first = loaded[0]
    if len(loaded) == 1:
        return first
    for other in loaded[1:]:
        if other.src_tokenizer != first.src_tokenizer or other.tgt_tokenizer != first.tgt_tokenizer:
            raise UserError(f"{other.path}: its vocabulary differs from {first.path}'s; the models "
                            "of an ensemble must share their tokenizers (train them on one "
                            "`aiayn prepare` output)")
    ensemble = Ensemble([m.model for m in loaded])
    return LoadedModel(ensemble, ensemble.cfg, first.src_tokenizer, first.tgt_tokenizer,
                       first.meta, first.path)
