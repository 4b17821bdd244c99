"""How to search: the options asked for, and the settings decided from them once.

- `SearchOptions`: what a caller asks (`aiayn translate --beam ...`, `Translator(beam_size=...)`);
  None means "the model config's value" (§6.1, the paper's: k = 4, alpha = 0.6, L = S + 50).
- `SearchSettings`: every setting decided, checked once when made and read as they are by
  `aiayn.decoding.beam.BeamSearch` and `aiayn.decoding.engine.SearchEngine`. Greedy search is
  decided here too: the beam of one, alpha 0, stopped at its first EOS ("current"), which gives
  exactly greedy search's hypotheses (aiayn/decoding/engine.py).
- `resolve_search(model, options)`: the options against the model's own config; the one place a
  search reads its defaults from a model.

A command resolves its options against the model directory's config before it reads any weights
(`aiayn.commands.common.search_settings`), so an impossible setting costs one line and no
loading.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from aiayn.config import Config
from aiayn.decoding import EARLY_STOP_RULES, MAX_BEAM_SIZE, ROOM_TOKENS

if TYPE_CHECKING:
    from aiayn.decoding.common import AttentionRequest

# When a sentence's beam search ends (aiayn/decoding/beam.py): the user's rules, and "never",
# every sentence run to its maximum length (the tests' check that stopping early changes nothing)
STOP_RULES = (*EARLY_STOP_RULES, "never")


@dataclass(frozen=True)
class SearchSettings:
    """A search with every setting decided (`SearchOptions.resolve`), checked when made: a
    ValueError (one line) for an impossible one.

    beam_size k (1 to `MAX_BEAM_SIZE`, 64), alpha (the GNMT length penalty), the maximum output
    length L = floor(max_len_a * S + max_len_b) (aiayn/decoding/common.py), 1 <= `nbest` <= k
    hypotheses per sentence, the stopping rule (`STOP_RULES`), `min_len` (not in the paper, 0 =
    off: no EOS before that output length), `attention` (keep the cross-attention behind each
    hypothesis; None: off), and the engine's room: `batch_tokens` (sentences decoded at once x
    their widest source, padded) and at most `batch_size` sentences when given."""

    beam_size: int
    alpha: float
    max_len_a: float
    max_len_b: float
    nbest: int = 1
    early_stop: str = "exact"
    min_len: int = 0
    attention: AttentionRequest | None = None
    batch_tokens: int = ROOM_TOKENS
    batch_size: int | None = None

    def __post_init__(self) -> None:
        k = self.beam_size
        if k < 1:
            raise ValueError(f"beam size must be >= 1, got {k}")
        if k > MAX_BEAM_SIZE:  # why this bound: aiayn/config.py, MAX_BEAM
            raise ValueError(f"beam size {k} is above the limit of {MAX_BEAM_SIZE} (a search's "
                             f"time and memory grow with it)")
        if self.nbest < 1:
            raise ValueError(f"nbest must be >= 1 (the best hypothesis at least), got "
                             f"{self.nbest}")
        if self.nbest > k:
            raise ValueError(f"nbest ({self.nbest}) cannot exceed the beam size ({k})")
        if self.alpha < 0:
            # the early-stopping bound divides by the largest length penalty (beam.py, 3.)
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        for name in ("max_len_a", "max_len_b"):
            v = getattr(self, name)
            if v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        if self.min_len < 0:
            raise ValueError(f"min_len must be >= 0, got {self.min_len}")
        if self.early_stop not in STOP_RULES:
            raise ValueError(f"early_stop must be one of {', '.join(STOP_RULES)}, got "
                             f"{self.early_stop!r}")
        if self.batch_tokens < 1 or (self.batch_size is not None and self.batch_size < 1):
            raise ValueError("batch tokens and batch size must be >= 1")


@dataclass(frozen=True)
class SearchOptions:
    """How to search, as asked. None means "the model config's value" (the paper's: k=4,
    alpha=0.6, L = S + 50). `greedy` ignores beam_size, alpha and early_stop; nbest > 1 is
    refused. `resolve` decides and checks them."""

    greedy: bool = False
    beam_size: int | None = None
    alpha: float | None = None
    max_len_a: float | None = None
    max_len_b: float | None = None
    nbest: int = 1
    batch_tokens: int = ROOM_TOKENS  # sentences x longest source (EOS, padding) decoded at once
    batch_size: int | None = None  # at most this many sentences per batch, when given
    # Not in the paper (0 = off): no EOS before decoding step min_len, so a complete output has
    # |Y| >= min_len, EOS counted. With max_len_a=0, max_len_b=min_len every sentence decodes
    # exactly min_len steps: benchmarks use it so that every system does the same work.
    min_len: int = 0
    # Not in the paper: "exact" (default) stops a sentence only when no live beam can still win;
    # "current" when none could win by ending at the next step (aiayn/decoding/beam.py)
    early_stop: str = "exact"
    # Keep the cross-attention weights behind each hypothesis (`Hypothesis.attention`); None: off.
    attention: AttentionRequest | None = None

    def resolve(self, cfg: Config) -> SearchSettings:
        """The settings these options ask of a model with config `cfg` (its decoding defaults
        fill what is None); ValueError (one line) for impossible ones (the CLI turns it into a
        UserError)."""
        if self.greedy and self.nbest > 1:
            raise ValueError("greedy search gives one hypothesis; drop --nbest or use beam search")
        if self.early_stop not in EARLY_STOP_RULES:
            raise ValueError(f"early_stop must be exact or current, got {self.early_stop!r}")
        asked = SearchSettings(
            beam_size=cfg.beam_size if self.beam_size is None else int(self.beam_size),
            alpha=cfg.alpha if self.alpha is None else float(self.alpha),
            max_len_a=cfg.max_len_a if self.max_len_a is None else self.max_len_a,
            max_len_b=cfg.max_len_b if self.max_len_b is None else self.max_len_b,
            nbest=self.nbest, early_stop=self.early_stop, min_len=self.min_len,
            attention=self.attention, batch_tokens=self.batch_tokens, batch_size=self.batch_size)
        if self.greedy:  # one beam, stopped at its first EOS: greedy search (module doc)
            return replace(asked, beam_size=1, alpha=0.0, early_stop="current")
        return asked

    def validate(self, cfg: Config | None = None) -> "SearchOptions":
        """These options, after `resolve` found them possible (for `cfg`, or the paper's
        defaults); ValueError otherwise."""
        self.resolve(cfg if cfg is not None else Config())
        return self


def decoding_defaults(model: Any) -> Config:
    """The decoding settings of the model's config (the paper's when the model has none)."""
    cfg = getattr(model, "cfg", None)
    return cfg if isinstance(cfg, Config) else Config()


def resolve_search(model: Any, options: SearchOptions) -> SearchSettings:
    """`options` decided against `model`'s config: the one place a search reads its defaults
    from a model (a model without a config gets the paper's)."""
    return options.resolve(decoding_defaults(model))
