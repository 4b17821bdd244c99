"""Decoding (§6.1): greedy and beam search over the model's incremental API, and translation.

One way through: options -> settings (decided once) -> the engine -> `BeamSearch` -> the model.

- `search`    `SearchOptions` (asked; None = the model config's) and `SearchSettings` (decided
              and checked once: `SearchOptions.resolve`, `resolve_search`);
- `engine`    `SearchEngine`: the queue in front of the search, its admission rule and its loop
              (every command, `Translator` and the server search through it);
- `beam`      `BeamSearch` (length penalty, exact early stopping, n-best lists; greedy search is
              its beam of one);
- `common`    `Hypothesis`, the GNMT length penalty, maximum output lengths, source batches;
- `precision` the decoding arithmetic: auto, fp32, bf16, int8 (`int8`: its layers);
- `ensemble`  several models decoded as one; `alignment`: word alignments from attention;
- `translate` `Translator`: text in, text out, batched by length, input order kept;
              `search_batched`: token ids in, hypotheses out.

The names below are imported on first use, so that importing this package (the CLI does, for
`DECODE_PRECISIONS`) does not import torch.
"""

from __future__ import annotations

import importlib

from aiayn.config import MAX_BEAM

# `--precision` values of `aiayn translate` (aiayn/decoding/precision.py)
DECODE_PRECISIONS = ("auto", "fp32", "bf16", "int8")
# when a sentence's beam search ends (aiayn/decoding/beam.py): "exact", the default, or "current"
EARLY_STOP_RULES = ("exact", "current")
# The decoding engine's default room, `--batch-tokens` of translate, parse and serve: the
# sentences decoded at once x their longest source (EOS included), in the positions decoding
# holds (padded to `common.SOURCE_MULTIPLE`). 3,000 padded positions hold what 2,000 real tokens
# held before the room counted the padding, and 2,000 real tokens decoded Multi30k's test set as
# fast as 4,000 in less memory, where 1,000 took half as long again (measured per machine in
# docs/experiments/decoding.md).
ROOM_TOKENS = 3000
# The largest beam a search takes, checked once in `search.SearchSettings`: aiayn/config.py says
# why it is 64 (a config's beam_size has the same bound).
MAX_BEAM_SIZE = MAX_BEAM

_LAZY = {"BeamSearch": "beam", "Hypothesis": "common", "length_penalty": "common",
         "max_output_lengths": "common", "source_batch": "common", "SearchEngine": "engine",
         "SearchOptions": "search", "SearchSettings": "search", "resolve_search": "search",
         "Translator": "translate", "search_batched": "translate"}

__all__ = ["DECODE_PRECISIONS", "EARLY_STOP_RULES", "MAX_BEAM_SIZE", "ROOM_TOKENS", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"aiayn.decoding.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
