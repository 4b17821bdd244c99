"""Table 3 of the paper ("Variations on the Transformer architecture") as a study at CPU scale:
the paper's figures per row, the study's base model, and each row's config derived from the
paper's own preset (aiayn/config.py) rather than retyped.

How a row is scaled. The paper's rows are deltas of its base model (N = 6, d_model = 512,
d_ff = 2048, h = 8, d_k = d_v = 64). The study base `TABLE3` shrinks every size by a fixed factor,
and a row applies the paper's delta to it with each size multiplied by the same factor as the base
(`row_config`):

- depth: N x 3/6 (the base has 3+3 layers; C's N = 2, 4, 8 become 1, 2, 4);
- width: d_model, d_ff, d_k and d_v x 1/4 (d_model 128, d_ff 512, d_k = d_v = 16);
- h is kept as the paper has it, so the (A) rows vary h with d_k = d_v = d_model / h at constant
  computation exactly as the paper did (h = 1, 4, 16, 32 give d_k = 128, 32, 8, 4), (B) shrinks
  d_k by the paper's ratios (16 and 32 of 64 become 4 and 8 of 16), (C) varies N, d_model (with
  d_k = d_v = d_model / 8) and d_ff by the paper's ratios;
- (D) dropout and label smoothing and (E) learned positions are not sizes: the paper's values.

Every row trains the same number of updates on the same batches (seed 1); the base row is also
trained with seeds 2 and 3 for the noise. The `big` row (trained 3x longer in the paper) and
`parsing` (not a Table 3 row) are not part of the study. The runner is `table3_study`, the report
`table3_report`; docs/experiments/table3.md has the results, docs/guides/table3.md the
scaling of each row.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from aiayn.config import BASE, Config
from aiayn.config import PRESETS as PAPER_PRESETS


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper's Table 3 (EN-DE, newstest2013 dev, no checkpoint averaging): per
    word-piece perplexity, BLEU, and parameters in millions (None where the paper leaves the cell
    empty, i.e. as the base model's 65M)."""

    ppl: float
    bleu: float
    params_m: float | None = None


# Table 3 of the paper, row by row (the (E) row is "positional embedding instead of sinusoids").
PAPER_TABLE3: dict[str, PaperRow] = {
    "base": PaperRow(4.92, 25.8, 65),
    "A1": PaperRow(5.29, 24.9), "A4": PaperRow(5.00, 25.5), "A16": PaperRow(4.91, 25.8),
    "A32": PaperRow(5.01, 25.4),
    "B16": PaperRow(5.16, 25.1, 58), "B32": PaperRow(5.01, 25.4, 60),
    "C-N2": PaperRow(6.11, 23.7, 36), "C-N4": PaperRow(5.19, 25.3, 50), "C-N8": PaperRow(4.88, 25.5, 80),
    "C-d256": PaperRow(5.75, 24.5, 28), "C-d1024": PaperRow(4.66, 26.0, 168),
    "C-ff1024": PaperRow(5.12, 25.4, 53), "C-ff4096": PaperRow(4.75, 26.2, 90),
    "D-drop0.0": PaperRow(5.77, 24.6), "D-drop0.2": PaperRow(4.95, 25.5),
    "D-ls0.0": PaperRow(4.67, 25.3), "D-ls0.2": PaperRow(5.47, 25.7),
    "E": PaperRow(4.92, 25.7),
    "big": PaperRow(4.33, 26.4, 213),
}

# The rows the study trains, in the paper's order: every Table 3 preset of aiayn/config.py but
# `big` (300K steps against the others' 100K), `big-enfr` (its EN-FR variant, §6.1) and `parsing`
# (§6.3, not in Table 3).
ROWS: tuple[str, ...] = tuple(n for n in PAPER_PRESETS if n not in ("big", "big-enfr", "parsing"))

# The study base: the paper's base with N x 1/2 and every width x 1/4 (see the module docstring),
# the paper's dropout and label smoothing, and a recipe for a few minutes of CPU per row: a
# warmup and an update size fit for a run of UPDATES updates (docs/experiments/table3.md says how
# they were chosen from a learning curve).
DEPTH_SCALE, WIDTH_SCALE = 1 / 2, 1 / 4
UPDATES = 1200
TABLE3 = replace(BASE, n_layers=3, d_model=128, d_ff=512, warmup_steps=400, max_tokens=2048,
                 max_steps=UPDATES)

# The fields the scaling multiplies.
_SIZES = ("n_layers", "d_model", "d_ff", "d_k", "d_v")


def _size(cfg: Config, name: str) -> int:
    """A size of `cfg`; d_k and d_v resolved (None means d_model / h)."""
    if name in ("d_k", "d_v"):
        return cfg.head_dim_k if name == "d_k" else cfg.head_dim_v
    return getattr(cfg, name)


def paper_delta(name: str) -> dict[str, Any]:
    """The fields in which the paper's preset `name` differs from the paper's base."""
    row = PAPER_PRESETS[name]
    return {f.name: getattr(row, f.name) for f in fields(Config)
            if getattr(row, f.name) != getattr(BASE, f.name)}


def scale_delta(delta: dict[str, Any], base: Config) -> dict[str, Any]:
    """The paper's delta for a study `base`: each size multiplied by base's size / the paper
    base's (h, dropout, smoothing, positions as they are). A size that does not come out a whole
    number is an error (the study base was chosen so that every row's does)."""
    out = dict(delta)
    for name in _SIZES:
        if name in delta:
            exact = delta[name] * _size(base, name) / _size(BASE, name)
            if exact != int(exact) or exact < 1:
                raise ValueError(f"{name}={delta[name]} scales to {exact:g} for this study base, "
                                 f"not a whole number")
            out[name] = int(exact)
    return out


def row_config(name: str, base: Config = TABLE3) -> Config:
    """Table 3 row `name` (a preset of aiayn/config.py) applied to the study `base`."""
    if name not in ROWS:
        raise KeyError(name)
    return replace(base, **scale_delta(paper_delta(name), base))


@dataclass(frozen=True)
class Claim:
    """A conclusion the paper draws from Table 3 (§6.2), tested as the difference `row` minus
    `against` in dev perplexity and BLEU. `same` claims say the two rows are nearly identical;
    the others that the difference has the sign it has in the paper."""

    text: str
    row: str
    against: str
    same: bool = False

    def paper(self) -> tuple[float, float]:
        """The paper's (PPL difference, BLEU difference)."""
        a, b = PAPER_TABLE3[self.row], PAPER_TABLE3[self.against]
        return a.ppl - b.ppl, a.bleu - b.bleu


CLAIMS: tuple[Claim, ...] = (
    Claim("single-head attention is worse (0.9 BLEU below the best setting)", "A1", "base"),
    Claim("too many heads also hurt", "A32", "base"),
    Claim("reducing the key size d_k hurts (d_k 16 of 64)", "B16", "base"),
    Claim("reducing the key size d_k hurts (d_k 32 of 64)", "B32", "base"),
    Claim("bigger models are better: N 8 against 2", "C-N8", "C-N2"),
    Claim("bigger models are better: d_model 1024 against 256", "C-d1024", "C-d256"),
    Claim("bigger models are better: d_ff 4096 against 1024", "C-ff4096", "C-ff1024"),
    Claim("dropout is very helpful in avoiding over-fitting (0.1 against none)", "base", "D-drop0.0"),
    Claim("label smoothing hurts perplexity but improves BLEU (0.1 against none)", "base", "D-ls0.0"),
    Claim("learned positional embeddings give nearly identical results to sinusoids", "E", "base",
          same=True),
)

# `aiayn train --preset table3-A1` etc. trains one row of the study by hand.
PRESETS: dict[str, Config] = {"table3": TABLE3,
                              **{f"table3-{n}": row_config(n) for n in ROWS if n != "base"}}
