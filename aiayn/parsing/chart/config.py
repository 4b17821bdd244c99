"""`ChartConfig`: the chart parser's sizes and training recipe, a config as `aiayn.config.Config`
is (frozen, every field checked, `--set NAME=VALUE`, JSON both ways), with the encoder's and the
recipe's fields under the paper's names. Its preset is `parsing-chart-small`
(aiayn/recipes/parsing.py), whose settings were chosen on dev (docs/experiments/parsing.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from aiayn.config import Config, ConfigFields
from aiayn.errors import UserError


@dataclass(frozen=True)
class ChartConfig(ConfigFields):
    """The encoder (§3.1, pre-norm), the span scorer and the character CNN (not in the paper),
    and the training recipe (§5.3's Adam and Eq. 3; the trainer reads these names)."""

    TASK: ClassVar[str] = "chart-parser"
    ARCH_FIELDS: ClassVar[tuple[str, ...]] = (
        "n_layers", "d_model", "d_ff", "n_heads", "d_span", "d_char", "max_chars")

    # --- the encoder, §3.1 (pre-norm: post-norm encoders collapse on the WSJ sample) ------------
    n_layers: int = 4
    d_model: int = 128
    d_ff: int = 512
    n_heads: int = 4
    p_drop: float = 0.2
    p_word_drop: float = 0.1  # a training word's id read as UNK with this probability
    # --- spans and characters (not in the paper) -----------------------------------------------
    d_span: int = 128  # the span MLP's hidden size
    d_char: int = 32  # > 0: each word's characters also read by a CNN (`model.CharEncoder`); 0: off
    max_chars: int = 20  # a longer word is read as its first and last max_chars / 2 characters
    # --- training, §5 ---------------------------------------------------------------------------
    warmup_steps: int = 1000  # Eq. 3
    lr_scale: float = 1.0
    lr_cooldown: float = 0.2  # the rate falls linearly to 0 over this last share of the run
    clip_norm: float = 1.0  # gradient clipping (the span loss has no label smoothing to tame it)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    max_cells: int = 40_000  # an update's (fenceposts)^2 x sentences: the span tensor's size
    max_steps: int = 100_000
    n_average: int = 5  # checkpoints `aiayn average --run` averages

    def __post_init__(self) -> None:
        self.check_fields()
        for name in ("n_layers", "d_model", "d_ff", "n_heads", "d_span", "warmup_steps", "max_cells",
                     "max_chars", "max_steps", "n_average"):
            if getattr(self, name) < 1:
                raise UserError(f"invalid config: {name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads or self.d_model % 2:
            raise UserError(f"invalid config: d_model {self.d_model} must be even and divisible "
                            f"by n_heads {self.n_heads}")
        for name in ("p_drop", "p_word_drop", "lr_cooldown"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"invalid config: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.lr_scale <= 0 or self.adam_eps <= 0 or self.clip_norm < 0:
            raise UserError("invalid config: lr_scale and adam_eps must be > 0, clip_norm >= 0")
        if not (0.0 < self.adam_beta1 < 1.0 and 0.0 < self.adam_beta2 < 1.0):
            raise UserError("invalid config: adam betas must be in (0, 1)")
        if self.d_char < 0:
            raise UserError(f"invalid config: d_char must be >= 0 (0: no character encoder), got "
                            f"{self.d_char}")

    def encoder_config(self, vocab: int) -> Config:
        """The `Config` of the encoder layers (`aiayn.model.layers.EncoderLayer`): pre-norm."""
        return Config(n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_ff,
                      n_heads=self.n_heads, p_drop=self.p_drop, norm="pre", vocab_size=vocab)
