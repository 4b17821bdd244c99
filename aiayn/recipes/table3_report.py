"""The Table 3 study's report: its rows gathered beside the paper's, the noise of the base row over
seeds, a verdict on each of the paper's conclusions, and the files of OUT/report/:

- results.json: {"format": "aiayn-study", "version": 1, "study": "table3", "updates", "base" (the
  study base config), "noise": {"seeds", "ppl_std", "bleu_std", "ppl_threshold",
  "bleu_threshold"}, "rows": [one object per run], "claims": [one object per conclusion]};
  each row has name, row, seed, params, dev_ppl, dev_bleu, tok_s, paper_ppl, paper_bleu,
  paper_params_m (null where the paper's cell is empty), change, and curve ([{step, dev_ppl}]);
- results.csv: the same rows, one line each, without the curves;
- table3.md: the markdown tables; table3.png: each row's difference from the base beside the
  paper's; curves.png: every run's dev perplexity by update.

Noise: sigma is the sample standard deviation of the base row over its seeds (seed changes the
initial weights, the dropout and the batch order). A difference of two runs has a standard
deviation of sqrt(2) sigma, so a difference counts only when it exceeds twice that,
2 sqrt(2) sigma (about 95% for normal noise); smaller ones are "within noise".
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiayn.errors import UserError
from aiayn.files import atomic_write
from aiayn.recipes.table3 import CLAIMS, PAPER_TABLE3, ROWS, Claim
from aiayn.recipes.table3_plot import plot_curves, plot_differences
from aiayn.recipes.table3_study import ROW_FILE, RUNS, STUDY_FILE, SYMBOLS, RowResult

CSV_FIELDS = ("name", "row", "seed", "params", "dev_ppl", "dev_bleu", "tok_s", "paper_ppl",
              "paper_bleu", "paper_params_m", "change")


@dataclass(frozen=True)
class Noise:
    """The base row's spread over seeds; thresholds are None with fewer than two seeds."""

    seeds: list[int]
    ppl_std: float | None
    bleu_std: float | None

    @property
    def ppl_threshold(self) -> float | None:
        return None if self.ppl_std is None else 2 * math.sqrt(2) * self.ppl_std

    @property
    def bleu_threshold(self) -> float | None:
        return None if self.bleu_std is None else 2 * math.sqrt(2) * self.bleu_std


def noise(results: list[RowResult]) -> Noise:
    base = sorted((r for r in results if r.row == "base"), key=lambda r: r.seed)
    if len(base) < 2:
        return Noise([r.seed for r in base], None, None)
    return Noise([r.seed for r in base], statistics.stdev(r.dev_ppl for r in base),
                 statistics.stdev(r.dev_bleu for r in base))


def verdict(ours: float, paper: float, threshold: float | None, same: bool = False) -> str:
    """A conclusion's verdict on one metric. `same` claims (no difference) are "reproduced" when
    our difference is within the noise, else "not reproduced"; the others are "within noise",
    else "reproduced" when ours has the paper's sign and "reversed" when it has the other.
    Without a noise estimate (one seed) every difference counts, and the verdict says so."""
    suffix = "" if threshold is not None else " (no noise estimate)"
    t = 0.0 if threshold is None else threshold
    if same:
        return ("reproduced" if abs(ours) <= t else "not reproduced") + suffix
    if abs(ours) <= t:
        return "within noise" + suffix
    return ("reproduced" if (ours > 0) == (paper > 0) else "reversed") + suffix


@dataclass(frozen=True)
class ClaimResult:
    text: str
    row: str
    against: str
    paper_d_ppl: float
    paper_d_bleu: float
    d_ppl: float
    d_bleu: float
    ppl_verdict: str
    bleu_verdict: str


def judge(claim: Claim, by_name: dict[str, RowResult], n: Noise) -> ClaimResult | None:
    """The claim's verdicts, or None when one of its rows is not done (seed 1 runs compared)."""
    a, b = by_name.get(claim.row), by_name.get(claim.against)
    if a is None or b is None:
        return None
    p_ppl, p_bleu = claim.paper()
    d_ppl, d_bleu = a.dev_ppl - b.dev_ppl, a.dev_bleu - b.dev_bleu
    return ClaimResult(claim.text, claim.row, claim.against, p_ppl, p_bleu, d_ppl, d_bleu,
                       verdict(d_ppl, p_ppl, n.ppl_threshold, claim.same),
                       verdict(d_bleu, p_bleu, n.bleu_threshold, claim.same))


def gather(out: str | Path) -> list[RowResult]:
    """Every finished run of the study in OUT, in the paper's row order (base seeds together)."""
    out = Path(out)
    if not (out / STUDY_FILE).is_file():
        raise UserError(f"{out} holds no study ({STUDY_FILE} is missing)")
    results = [RowResult.read(p) for p in sorted((out / RUNS).glob(f"*/{ROW_FILE}"))]
    return sorted(results, key=lambda r: (ROWS.index(r.row), r.seed))


def row_record(r: RowResult) -> dict[str, Any]:
    """A run as one flat object of results.json / results.csv (the paper's columns beside)."""
    paper = PAPER_TABLE3[r.row]
    change = " ".join(f"{SYMBOLS.get(k, k)}={v}" for k, v in r.config.items())
    return {"name": r.name, "row": r.row, "seed": r.seed, "params": r.params,
            "dev_ppl": r.dev_ppl, "dev_bleu": r.dev_bleu, "tok_s": r.tok_s,
            "paper_ppl": paper.ppl, "paper_bleu": paper.bleu, "paper_params_m": paper.params_m,
            "change": change or "-", "updates": r.updates, "train_seconds": r.train_seconds,
            "decode_seconds": r.decode_seconds, "curve": r.curve}


def report(out: str | Path) -> dict[str, Any]:
    """Gather the study in OUT and write OUT/report/ (see the module docstring); returns what
    results.json holds."""
    out = Path(out)
    results = gather(out)
    study = json.loads((out / STUDY_FILE).read_text(encoding="utf-8"))
    n = noise(results)
    seed1 = {r.row: r for r in results if r.seed == 1}
    claims = [c for c in (judge(c, seed1, n) for c in CLAIMS) if c is not None]
    doc = {"format": "aiayn-study", "version": 1, "study": "table3", "updates": study["updates"],
           "beam_size": study["beam_size"], "base": study["base"],
           "noise": {**asdict(n), "ppl_threshold": n.ppl_threshold,
                     "bleu_threshold": n.bleu_threshold},
           "rows": [row_record(r) for r in results], "claims": [asdict(c) for c in claims]}
    folder = out / "report"
    folder.mkdir(exist_ok=True)
    with atomic_write(folder / "results.json") as f:
        json.dump(doc, f, indent=2)
    with atomic_write(folder / "results.csv") as f:
        f.write(to_csv(doc["rows"]))
    with atomic_write(folder / "table3.md") as f:
        f.write(markdown(doc))
    if results:
        plot_differences(doc, folder / "table3.png")
        plot_curves(doc, folder / "curves.png")
    return doc


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r[k] is None else r[k]) for k in CSV_FIELDS})
    return buf.getvalue()


def _f(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def markdown(doc: dict[str, Any]) -> str:
    """The rows beside the paper's, the base row's noise and the verdicts, as markdown."""
    lines = ["| row | change (study scale) | params | paper params (M) | dev PPL | paper PPL "
             "| dev BLEU | paper BLEU | train tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        label = r["row"] if r["seed"] == 1 else f"{r['row']} (seed {r['seed']})"
        lines.append(f"| {label} | {r['change']} | {r['params'] / 1e6:.2f}M | "
                     f"{_f(r['paper_params_m'], 0)} | {r['dev_ppl']:.2f} | {r['paper_ppl']:.2f} | "
                     f"{r['dev_bleu']:.2f} | {r['paper_bleu']:.1f} | {r['tok_s']:,.0f} |")
    nz = doc["noise"]
    lines.append("")
    if nz["ppl_std"] is None:
        lines.append(f"Noise: the base row has {len(nz['seeds'])} seed(s); no spread estimated.")
    else:
        base = [r for r in doc["rows"] if r["row"] == "base"]
        lines.append(
            f"Noise: the base row over seeds {', '.join(map(str, nz['seeds']))}: dev PPL "
            f"{statistics.mean(r['dev_ppl'] for r in base):.2f} ± {nz['ppl_std']:.2f}, dev BLEU "
            f"{statistics.mean(r['dev_bleu'] for r in base):.2f} ± {nz['bleu_std']:.2f} (sample "
            f"standard deviation); a difference of two runs counts beyond "
            f"{nz['ppl_threshold']:.2f} PPL / {nz['bleu_threshold']:.2f} BLEU (2·√2·σ).")
    if doc["claims"]:
        lines += ["", "| the paper's conclusion | rows | paper ΔPPL | ΔPPL | paper ΔBLEU | ΔBLEU "
                  "| verdict (PPL) | verdict (BLEU) |", "|---|---|---|---|---|---|---|---|"]
        for c in doc["claims"]:
            lines.append(f"| {c['text']} | {c['row']} − {c['against']} | {c['paper_d_ppl']:+.2f} | "
                         f"{c['d_ppl']:+.2f} | {c['paper_d_bleu']:+.1f} | {c['d_bleu']:+.2f} | "
                         f"{c['ppl_verdict']} | {c['bleu_verdict']} |")
    return "\n".join(lines) + "\n"
