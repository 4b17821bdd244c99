"""The one configuration of a Transformer and its training recipe, and the paper's presets.

Field names follow the paper (§3, §5, Table 3). Every default is the paper's setting for the base
model; every deviation from the paper is an option that is off by default and says so below.

The paper's presets are small named deltas of `BASE`, each reading like its Table 3 row; the
recipes' presets live beside their recipes (aiayn/recipes/), and aiayn/presets.py finds a preset
by name. A task with a model of its own (the chart parser, aiayn/parsing/chart/) keeps its config
in its package, built on `ConfigFields` below so that it reads, checks, prints and takes
`--set NAME=VALUE` as `Config` does.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Literal

from aiayn.checks import check_schema
from aiayn.errors import UserError


class ConfigFields:
    """What every config shares, for frozen dataclasses of typed fields: each field checked
    against its annotation (`check_fields`, first thing in `__post_init__`: a config.json may hold
    anything), `--set NAME=VALUE` strings parsed to the field's type (`with_overrides`), JSON both
    ways, and `architecture_changes`, the `ARCH_FIELDS` (those that shape the network or what its
    weights mean) in which two configs differ: checkpoints that differ there cannot be averaged or
    resumed into one another.

    `TASK` names a task whose model is not the sequence-to-sequence Transformer (None for
    `Config`): its config.json carries it as "task", and aiayn/tasks.py reads a model directory
    by it."""

    ARCH_FIELDS: ClassVar[tuple[str, ...]] = ()
    TASK: ClassVar[str | None] = None
    # Fields of earlier versions that `from_dict` ignores when a saved config.json still has them.
    RETIRED_FIELDS: ClassVar[tuple[str, ...]] = ()

    def check_fields(self) -> None:
        """Every field against its annotation; floats finite, and stored as floats."""
        for name, kind in _field_kinds(type(self)).items():
            v = getattr(self, name)
            check_schema(v, kind, "invalid config", name)
            if _admits_float(kind) and v is not None:
                if not math.isfinite(v):
                    raise UserError(f"invalid config: {name} must be finite, got {v}")
                object.__setattr__(self, name, float(v))  # JSON writes 0.0 as 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        """config.json's text: the fields, after "task" for a task's own config."""
        return json.dumps({**({"task": self.TASK} if self.TASK else {}), **self.to_dict()}, indent=2)

    @classmethod
    def from_dict(cls, d: Any, where: str = "config"):
        """A config from parsed JSON (a config.json); every error names `where` and the field."""
        if not isinstance(d, dict):
            raise UserError(f"{where}: expected a JSON object of config fields")
        if d.get("task") != cls.TASK:
            what = f"a {d['task']} model" if d.get("task") else "a sequence-to-sequence Transformer"
            raise UserError(f"{where}: {what}, not a {cls.TASK or 'sequence-to-sequence Transformer'}")
        d = {k: v for k, v in d.items() if k != "task" and k not in cls.RETIRED_FIELDS}
        unknown = sorted(set(d) - {f.name for f in fields(cls)})  # type: ignore[arg-type]
        if unknown:
            raise UserError(f"{where}: invalid config: unknown config field(s) {', '.join(unknown)}")
        try:
            return cls(**d)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None

    def architecture_changes(self, other: Any) -> list[str]:
        """The `ARCH_FIELDS` in which `other` differs from this config, as 'name: a -> b'."""
        if type(other) is not type(self):
            return [f"model kind: {type(self).__name__} -> {type(other).__name__}"]
        return [f"{f}: {getattr(self, f)!r} -> {getattr(other, f)!r}" for f in self.ARCH_FIELDS
                if getattr(self, f) != getattr(other, f)]

    def with_overrides(self, overrides: dict[str, str] | list[str]):
        """Apply `name=value` strings (from the command line), parsed to each field's type."""
        if isinstance(overrides, list):
            pairs = {}
            for item in overrides:
                if "=" not in item:
                    raise UserError(f"invalid override {item!r}: expected name=value")
                k, v = item.split("=", 1)
                pairs[k.strip()] = v.strip()
            overrides = pairs
        kinds = {f.name: f.type for f in fields(self)}  # type: ignore[arg-type]
        parsed: dict[str, Any] = {}
        for k, v in overrides.items():
            if k not in kinds:
                raise UserError(f"invalid override: unknown config field {k!r}; the fields: "
                                f"{', '.join(kinds)}")
            parsed[k] = _parse_value(k, v, kinds[k])
        return replace(self, **parsed)  # type: ignore[type-var]


# Upper bounds on the sizes that no weight bounds: a model directory's weights fix its widths,
# layers and vocabularies (aiayn.data.model_dir.read_config checks them), but not how far a search
# may run, nor a config without weights (a preset with --set). Each bound lies far beyond any
# realistic model, so that only an absurd value (a hostile config.json) is refused, in one line,
# before anything is allocated: sequences here are at most thousands of tokens, and a learned
# position table of 2**20 rows at d_model 1024 is already 4 GiB.
MAX_SEQUENCE = 2**20  # tokens: max_positions, max_len_b, pad_multiple
MAX_LENGTH_RATIO = 1024  # max_len_a: output tokens per source token
# beam_size, and every search (`aiayn translate --beam`, `Translator(beam_size=...)`, `aiayn serve
# --max-beam`): a search's time and memory grow linearly with k, and the decoding room counts
# sentences, not their k hypotheses each, so a typo such as --beam 10000 would take gigabytes for
# one sentence. The paper searches with k = 4 (§6.1) and 21 (§6.3); 64 leaves those, and a study
# of wider beams, room.
MAX_BEAM = 64


@dataclass(frozen=True)
class Config(ConfigFields):
    """Architecture (§3), optimisation (§5) and decoding (§6.1) settings.

    `vocab_size` is the shared source/target vocabulary (§3.4); presets leave it 0 and the data
    fills it in (`replace(cfg, vocab_size=V)`).
    """

    # Fields that shape the network or what its weights mean (`architecture_changes`); the rest
    # (recipe, decoding) may differ between checkpoints of one model.
    ARCH_FIELDS: ClassVar[tuple[str, ...]] = (
        "vocab_size", "tgt_vocab_size", "n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v",
        "positions", "max_positions", "norm", "attn_window", "attn_bias", "tie_embeddings",
        "tie_output", "layer_norm_eps", "arch", "rnn_emb", "rnn_hidden", "rnn_attn")
    # Fields of earlier versions, ignored when a saved config.json still has them: training-only
    # ones (they never shaped the network, so such a model loads and decodes as it did), and
    # `pointer` at its default, false (`from_dict` refuses a model that set it).
    RETIRED_FIELDS: ClassVar[tuple[str, ...]] = ("p_bpe_drop", "rdrop_alpha", "pointer")

    # --- model, §3 -------------------------------------------------------------------------
    vocab_size: int = 0
    n_layers: int = 6  # N, identical layers in each stack (§3.1)
    d_model: int = 512
    d_ff: int = 2048  # inner size of the position-wise FFN (§3.3)
    n_heads: int = 8  # h (§3.2.2)
    d_k: int | None = None  # per-head query/key size; None means d_model // n_heads
    d_v: int | None = None  # per-head value size; None means d_model // n_heads
    p_drop: float = 0.1  # residual dropout on sub-layer outputs and embedding sums (§5.4)
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"  # "learned" is Table 3 row (E)
    max_positions: int = 1024  # table size of learned positions; sinusoidal ones are unbounded

    # --- deviations from the paper: all off by default ---------------------------------------
    # Dropout on the attention weights (Tensor2Tensor's attention_dropout), not in the paper.
    p_attn_drop: float = 0.0
    # Dropout on the FFN's hidden ReLU activations (Tensor2Tensor's relu_dropout), not in the paper.
    p_ffn_drop: float = 0.0
    # Source word dropout, not in the paper: in training each source token (PAD, BOS and EOS
    # excepted) is read as UNK with this probability, so the model learns to parse or translate
    # around words it does not know (Sennrich et al. 2016's word dropout; aiayn.model.dropout).
    p_word_drop: float = 0.0
    # "pre" applies LayerNorm before each sub-layer, x + Sublayer(LN(x)), plus a final LayerNorm on
    # each stack (Wang et al. 2019); trains more stably deep, but is not the paper's post-norm.
    norm: Literal["post", "pre"] = "post"
    # Restricted self-attention (Table 1): each position attends only to positions within r of it.
    # r counts the keys on ONE side: an encoder query i sees |i - j| <= r, a neighbourhood of 2r + 1
    # positions; a decoder query sees i - r <= j <= i, r + 1 positions. Computed banded (only each
    # query's window, O(r n d) time and memory; aiayn.model.banded), and the decoding cache keeps
    # only the last r + 1 keys. None means unrestricted, as the paper trained.
    attn_window: int | None = None
    # Biases on the Q/K/V/O projections. The paper writes them as bias-free matrices W^Q, W^K, W^V,
    # W^O (§3.2.2); fairseq and Marian add biases.
    attn_bias: bool = False
    # A separate target vocabulary: 0 means shared with the source (§3.4). When set, the source
    # and target embeddings cannot be tied and `tie_embeddings` must be False.
    tgt_vocab_size: int = 0
    # One matrix for source embedding, target embedding and pre-softmax projection (§3.4).
    tie_embeddings: bool = True
    # With untied source/target embeddings, still tie the target embedding to the output layer.
    tie_output: bool = True
    layer_norm_eps: float = 1e-6  # the paper gives none; Tensor2Tensor's value

    # --- another architecture, not the paper's: off by default ----------------------------------
    # "rnn" is the attention-based RNN encoder-decoder the paper compares against (Bahdanau et al.
    # 2015, aiayn.model.rnn): a bidirectional GRU encoder, additive attention, a GRU decoder. It
    # reads only the rnn_* sizes below (plus vocabularies, p_drop and the tying flags); the
    # Transformer's sizes are ignored. Defaults are Bahdanau et al.'s RNNsearch sizes.
    arch: Literal["transformer", "rnn"] = "transformer"
    rnn_emb: int = 620  # word embedding size (also the maxout readout's output size)
    rnn_hidden: int = 1000  # GRU units: per encoder direction, and the decoder's state
    rnn_attn: int = 1000  # hidden size of the additive alignment model

    # --- training, §5 ------------------------------------------------------------------------
    eps_ls: float = 0.1  # label smoothing (§5.4)
    warmup_steps: int = 4000  # Eq. 3
    max_steps: int = 100_000  # base 100K, big 300K (§5.2)
    lr_scale: float = 1.0  # multiplier on Eq. 3; 1.0 is the paper
    # Not in the paper (off by default): over this last fraction of the run the rate of Eq. 3 falls
    # linearly to 0 (the "cooldown" of warmup-stable-decay schedules, Hägele et al. 2024), so a
    # short run ends at a low rate instead of Eq. 3's still-high one. The run's length is
    # max_steps, or the time budget when a run is given minutes (aiayn.training.schedule).
    lr_cooldown: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    max_tokens: int = 25_000  # source and target tokens per (accumulated) batch (§5.1)
    # Batch widths rounded up to a multiple of this, the padding counted against max_tokens: far
    # fewer distinct tensor shapes, so kernels and freed memory are reused. 1: no rounding.
    pad_multiple: int = 1
    clip_norm: float = 0.0  # gradient clipping; 0 (off) as in the paper
    n_average: int = 5  # checkpoints averaged for the final model: base 5, big 20 (§6.1)

    # --- decoding, §6.1 ----------------------------------------------------------------------
    beam_size: int = 4
    alpha: float = 0.6  # GNMT length penalty ((5 + |Y|) / 6) ** alpha
    max_len_a: float = 1.0  # maximum output length = a * source length + b
    max_len_b: int = 50

    def __post_init__(self) -> None:
        def bad(msg: str) -> UserError:
            return UserError(f"invalid config: {msg}")

        self.check_fields()
        for name in ("n_layers", "d_model", "d_ff", "n_heads", "max_positions", "warmup_steps",
                     "max_steps", "max_tokens", "beam_size", "n_average", "pad_multiple", "rnn_emb",
                     "rnn_hidden", "rnn_attn"):
            if getattr(self, name) < 1:
                raise bad(f"{name} must be >= 1, got {getattr(self, name)}")
        for name, bound in (("max_positions", MAX_SEQUENCE), ("max_len_b", MAX_SEQUENCE),
                            ("pad_multiple", MAX_SEQUENCE), ("max_len_a", MAX_LENGTH_RATIO),
                            ("beam_size", MAX_BEAM)):
            if getattr(self, name) > bound:
                raise bad(f"{name}={getattr(self, name)} is beyond any realistic model (at most "
                          f"{bound})")
        if self.vocab_size < 0 or self.tgt_vocab_size < 0:
            raise bad("vocab_size and tgt_vocab_size must be >= 0")
        for name in ("d_k", "d_v", "attn_window"):
            v = getattr(self, name)
            if v is not None and v < (0 if name == "attn_window" else 1):
                raise bad(f"{name} must be positive, got {v}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            raise bad(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                      "give d_k and d_v explicitly")
        for name in ("p_drop", "p_attn_drop", "p_ffn_drop", "p_word_drop", "eps_ls", "lr_cooldown"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise bad(f"{name} must be in [0, 1), got {v}")
        if self.arch == "rnn" and self.p_word_drop:
            raise bad("p_word_drop is a Transformer option; the rnn architecture does not read it")
        if self.tgt_vocab_size and self.tgt_vocab_size != self.vocab_size and self.tie_embeddings:
            raise bad("separate source and target vocabularies need tie_embeddings=False")
        if not (0.0 < self.adam_beta1 < 1.0 and 0.0 < self.adam_beta2 < 1.0):
            raise bad("adam betas must be in (0, 1)")
        if self.lr_scale <= 0 or self.adam_eps <= 0 or self.clip_norm < 0:
            raise bad("lr_scale and adam_eps must be > 0, clip_norm >= 0")
        if self.alpha < 0 or self.max_len_a < 0 or self.max_len_b < 0:
            raise bad("alpha, max_len_a and max_len_b must be >= 0")

    # Derived sizes --------------------------------------------------------------------------
    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.n_heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.d_model // self.n_heads

    @property
    def src_vocab(self) -> int:
        return self.vocab_size

    @property
    def tgt_vocab(self) -> int:
        return self.tgt_vocab_size or self.vocab_size

    @classmethod
    def from_dict(cls, d: Any, where: str = "config") -> "Config":
        if isinstance(d, dict) and d.get("pointer"):
            raise UserError(f"{where}: pointer=true, an option removed from aiayn (its runs are in "
                            "docs/experiments/parsing.md); this model needs aiayn at commit 1fe4095")
        return super().from_dict(d, where)


@functools.cache
def _field_kinds(cls: type) -> dict[str, Any]:
    """Each field's annotation as an `aiayn.checks.check_schema` schema: int, float, bool, str,
    a Literal's values, and `X | None` as alternatives."""

    def kind(hint: Any) -> Any:
        origin = typing.get_origin(hint)
        if origin is Literal:
            return frozenset(typing.get_args(hint))
        if origin in (typing.Union, types.UnionType):
            return tuple(kind(a) for a in typing.get_args(hint))
        return None if hint is type(None) else hint

    hints = typing.get_type_hints(cls)
    return {f.name: kind(hints[f.name]) for f in fields(cls)}


def _admits_float(kind: Any) -> bool:
    return kind is float or (isinstance(kind, tuple) and float in kind)


def _parse_value(name: str, text: str, type_str: Any) -> Any:
    t = str(type_str)
    if text.lower() in ("none", "null") and "None" in t:
        return None
    try:
        if "bool" in t:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if "int" in t and "float" not in t:
            return int(text)
        if "float" in t:
            return float(text)
    except ValueError:
        raise UserError(f"invalid value for {name}: {text!r} ({t})") from None
    return text


# --- presets: the paper's (Table 3, §6.1, §6.3) -----------------------------------------------------
BASE = Config()
BIG = replace(BASE, d_model=1024, d_ff=4096, n_heads=16, p_drop=0.3, max_steps=300_000, n_average=20)

PRESETS: dict[str, Config] = {
    "base": BASE,
    # (A) number of heads, d_k = d_v = d_model / h, constant computation
    "A1": replace(BASE, n_heads=1, d_k=512, d_v=512),
    "A4": replace(BASE, n_heads=4, d_k=128, d_v=128),
    "A16": replace(BASE, n_heads=16, d_k=32, d_v=32),
    "A32": replace(BASE, n_heads=32, d_k=16, d_v=16),
    # (B) smaller attention key size
    "B16": replace(BASE, d_k=16),
    "B32": replace(BASE, d_k=32),
    # (C) model size
    "C-N2": replace(BASE, n_layers=2),
    "C-N4": replace(BASE, n_layers=4),
    "C-N8": replace(BASE, n_layers=8),
    "C-d256": replace(BASE, d_model=256, d_k=32, d_v=32),
    "C-d1024": replace(BASE, d_model=1024, d_k=128, d_v=128),
    "C-ff1024": replace(BASE, d_ff=1024),
    "C-ff4096": replace(BASE, d_ff=4096),
    # (D) regularisation
    "D-drop0.0": replace(BASE, p_drop=0.0),
    "D-drop0.2": replace(BASE, p_drop=0.2),
    "D-ls0.0": replace(BASE, eps_ls=0.0),
    "D-ls0.2": replace(BASE, eps_ls=0.2),
    # (E) learned positional embeddings instead of sinusoids
    "E": replace(BASE, positions="learned"),
    # big: EN-DE settings (P_drop 0.3), 300K steps, average 20
    "big": BIG,
    # big for EN-FR: "The Transformer (big) model trained for English-to-French used dropout rate
    # P_drop = 0.1, instead of 0.3" (§6.1)
    "big-enfr": replace(BIG, p_drop=0.1),
    # §6.3 constituency parsing: 4 layers, d_model 1024, beam 21, alpha 0.3, max length +300
    # ("everything else as the EN-DE base model": d_ff 2048, h 8, so d_k = d_v = 128)
    "parsing": replace(BASE, n_layers=4, d_model=1024, beam_size=21, alpha=0.3, max_len_b=300),
}


__all__ = ["Config", "ConfigFields", "BASE", "BIG", "PRESETS", "MAX_SEQUENCE", "MAX_LENGTH_RATIO",
           "MAX_BEAM"]
