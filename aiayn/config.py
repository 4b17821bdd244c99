"""The one configuration of a Transformer and its training recipe, and the paper's presets.

Field names follow the paper (§3, §5, Table 3). Every default is the paper's setting for the base
model; every deviation from the paper is an option that is off by default and says so below.

Presets are small named deltas of `BASE`, each reading like its Table 3 row. A preset name never
changes meaning: new variants get new names.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from aiayn.errors import UserError


@dataclass(frozen=True)
class Config:
    """Architecture (§3), optimisation (§5) and decoding (§6.1) settings.

    `vocab_size` is the shared source/target vocabulary (§3.4); presets leave it 0 and the data
    fills it in (`replace(cfg, vocab_size=V)`).
    """

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
    # "pre" applies LayerNorm before each sub-layer, x + Sublayer(LN(x)), plus a final LayerNorm on
    # each stack (Wang et al. 2019); trains more stably deep, but is not the paper's post-norm.
    norm: Literal["post", "pre"] = "post"
    # Restricted self-attention (Table 1): each position attends only to positions within r of it
    # (encoder: |i - j| <= r; decoder: i - r <= j <= i). None means unrestricted, as the paper trained.
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

    # BPE-dropout (Provilkov et al. 2020), not in the paper: every epoch re-segments the training
    # text, dropping each applicable BPE merge at each merge step with this probability
    # (aiayn.data.resegment), so words are seen in many segmentations; dev/test and decoding keep
    # the fixed one. Needs a BPE vocabulary.
    p_bpe_drop: float = 0.0

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

        for name in ("n_layers", "d_model", "d_ff", "n_heads", "max_positions", "warmup_steps",
                     "max_steps", "max_tokens", "beam_size", "n_average"):
            if getattr(self, name) < 1:
                raise bad(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 0 or self.tgt_vocab_size < 0:
            raise bad("vocab_size and tgt_vocab_size must be >= 0")
        for name in ("d_k", "d_v", "attn_window"):
            v = getattr(self, name)
            if v is not None and v < (0 if name == "attn_window" else 1):
                raise bad(f"{name} must be positive, got {v}")
        if (self.d_k is None or self.d_v is None) and self.d_model % self.n_heads:
            raise bad(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                      "give d_k and d_v explicitly")
        for name in ("p_drop", "p_attn_drop", "p_ffn_drop", "p_bpe_drop", "eps_ls", "lr_cooldown"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise bad(f"{name} must be in [0, 1), got {v}")
        if self.norm not in ("post", "pre"):
            raise bad(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.positions not in ("sinusoidal", "learned"):
            raise bad(f"positions must be 'sinusoidal' or 'learned', got {self.positions!r}")
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

    # Serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        _check_known(d, "invalid config")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def with_overrides(self, overrides: dict[str, str] | list[str]) -> "Config":
        """Apply `name=value` strings (from the command line), parsed to each field's type."""
        if isinstance(overrides, list):
            pairs = {}
            for item in overrides:
                if "=" not in item:
                    raise UserError(f"invalid override {item!r}: expected name=value")
                k, v = item.split("=", 1)
                pairs[k.strip()] = v.strip()
            overrides = pairs
        types = {f.name: f.type for f in fields(self)}
        parsed: dict[str, Any] = {}
        for k, v in overrides.items():
            if k not in types:
                raise UserError(f"invalid override: unknown config field {k!r}")
            parsed[k] = _parse_value(k, v, types[k], getattr(self, k))
        return replace(self, **parsed)


def _check_known(d: dict[str, Any], where: str) -> None:
    unknown = sorted(set(d) - {f.name for f in fields(Config)})
    if unknown:
        raise UserError(f"{where}: unknown config field(s) {', '.join(unknown)}")


def _parse_value(name: str, text: str, type_str: Any, current: Any) -> Any:
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


# --- presets: Table 3 ---------------------------------------------------------------------------
BASE = Config()

# `multi30k`: Multi30k translation (29K caption pairs, ~13 words) in an hour on 2 CPU cores: the
# TINY size of PEERS.md, more dropout for the small corpus, a shorter warmup for a run of a few
# thousand updates. The first choice (sessions 1-2); experiments on val are in the README.
MULTI30K = replace(BASE, n_layers=3, d_model=256, d_ff=1024, n_heads=4, p_drop=0.3, warmup_steps=1000,
                   max_tokens=4096, max_steps=100_000)

MULTI30K_V2 = replace(MULTI30K, p_attn_drop=0.1, p_ffn_drop=0.1, alpha=1.5)
G2P = replace(BASE, n_layers=3, d_model=128, d_ff=512, n_heads=4, warmup_steps=400, max_tokens=4000,
              max_steps=100_000, max_len_b=10)

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
    # big: EN-DE settings (P_drop 0.3; the paper used 0.1 for EN-FR), 300K steps, average 20
    "big": replace(BASE, d_model=1024, d_ff=4096, n_heads=16, p_drop=0.3, max_steps=300_000,
                   n_average=20),
    # §6.3 constituency parsing: 4 layers, d_model 1024, beam 21, alpha 0.3, max length +300
    # ("everything else as the EN-DE base model": d_ff 2048, h 8, so d_k = d_v = 128)
    "parsing": replace(BASE, n_layers=4, d_model=1024, beam_size=21, alpha=0.3, max_len_b=300),
    # --- small presets for CPU recipes (not in the paper) ---
    # `tiny`: the size peers are benchmarked at (PEERS.md TINY); trains in minutes on 2 cores.
    "tiny": replace(BASE, n_layers=3, d_model=256, d_ff=1024, n_heads=4, warmup_steps=1000,
                    max_tokens=4096, max_steps=20_000),
    # `g2p`: grapheme-to-phoneme on CMUdict within minutes on 2 CPU cores (the demo's first preset).
    # Chosen by 3-minute runs scored on the validation words (README, "The demo"): at this budget
    # d_model 128 beats 256 (more epochs), and p_drop 0.1 beats 0.0. A pronunciation is rarely
    # more than a few symbols longer than its spelling, so outputs stop at +10, not +50.
    "g2p": G2P,
    # `g2p-v2`, the demo's default and the 30-minute G2P recipe: `g2p` with the rate falling
    # linearly to 0 over the last 20% of the run. Chosen on the validation words (README): WER
    # 26.65% -> 26.25% in 30 minutes (AMX, bf16), 45.6% -> 44.4% in the demo's 7.5 (AVX2, fp32).
    "g2p-v2": replace(G2P, lr_cooldown=0.2),
    "multi30k": MULTI30K,
    # `multi30k-v2` (scripts/multi30k.sh until run 6): `multi30k` plus dropout 0.1 on the attention
    # weights and on the FFN's ReLU output (`multi30k`'s dev loss stalled after ~3,500 updates),
    # and length penalty alpha 1.5 (at 0.6 the val outputs were 7% short). Chosen on val (README):
    # val sacreBLEU 39.61 (`multi30k`) -> 40.37 (+ the two dropouts) -> 41.15 (+ alpha 1.5).
    "multi30k-v2": MULTI30K_V2,
    # `multi30k-v3`, what scripts/multi30k.sh runs: `multi30k-v2` with the rate falling linearly to
    # 0 over the last 20% of the run (Eq. 3 alone ends an hour at 43% of its peak). Chosen on val
    # (README, run 6): val sacreBLEU 41.14 -> 41.36, final dev NLL 1.623 -> 1.587.
    "multi30k-v3": replace(MULTI30K_V2, lr_cooldown=0.2),
    # `micro`: for tests and the smallest demo; trains in seconds.
    "micro": replace(BASE, n_layers=2, d_model=64, d_ff=256, n_heads=4, warmup_steps=200,
                     max_tokens=2048, max_steps=2000),
}


def get_preset(name: str) -> Config:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown preset {name!r}; choose from: {', '.join(PRESETS)}") from None


def load_config(preset: str | None = None, config_file: str | None = None,
                overrides: list[str] | None = None, **fixed: Any) -> Config:
    """Build a config the way the CLI does: preset (default base), then a JSON config file's fields,
    then `name=value` overrides, then `fixed` fields set by the caller (e.g. vocab_size from data)."""
    cfg = get_preset(preset or "base")
    if config_file:
        try:
            with open(config_file, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise UserError(f"config file not found: {config_file}") from None
        except json.JSONDecodeError as e:
            raise UserError(f"{config_file}:{e.lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise UserError(f"{config_file}: expected a JSON object of config fields")
        _check_known(data, config_file)
        cfg = replace(cfg, **data)
    if overrides:
        cfg = cfg.with_overrides(overrides)
    if fixed:
        cfg = replace(cfg, **fixed)
    return cfg


__all__ = ["Config", "BASE", "PRESETS", "get_preset", "load_config"]
