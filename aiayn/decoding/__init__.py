"""Decoding (§6.1): greedy and beam search over the model's incremental API, and translation.

- `common`    `Hypothesis`, the GNMT length penalty, maximum output lengths, source batches;
- `greedy`    `greedy_search`;
- `beam`      `beam_search` (length penalty, exact early stopping, n-best lists);
- `translate` `Translator`: text in, text out, batched by length, input order kept.
"""

from aiayn.decoding.beam import beam_search
from aiayn.decoding.common import Hypothesis, length_penalty, max_output_lengths, source_batch
from aiayn.decoding.greedy import greedy_search

__all__ = ["Hypothesis", "beam_search", "greedy_search", "length_penalty", "max_output_lengths",
           "source_batch"]
