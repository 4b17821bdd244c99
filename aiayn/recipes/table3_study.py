"""Running the Table 3 study (aiayn/recipes/table3.py): every row one training run, resumable and
splittable.

Layout of a study directory OUT:

    OUT/study.json             what every run of the study shares (updates, study base, data);
                               a later invocation with other settings is refused
    OUT/runs/<run>/            one run directory of `aiayn.training.trainer.train` per row, named
                               by the row (`A1`, `C-d256`, ...; the base row's extra seeds
                               `base-seed2`, ...): checkpoints, metrics.jsonl, summary.json
    OUT/runs/<run>/row.json    the row's figures (`RowResult`), written when the row is done
    OUT/report/                the gathered table, JSON, CSV and plots (table3_report)

Resuming: a row with row.json is done and skipped; any other row resumes from its newest
checkpoint (the trainer resumes bit for bit) or starts afresh. So a killed study, run again with
the same command, continues from the row and the update it stopped at (to the last checkpoint,
`save_every` updates at most). Splitting: `rows` and `base_seeds` select runs, so rows can run
one at a time (on other machines too, into other OUT directories whose runs/ are then copied
together) and the report gathers whatever rows are done.

Figures per row, as Table 3 measured them: dev perplexity per subword token (the trainer's final
dev evaluation, `reference_perplexity`), sacreBLEU of beam-search translations of the whole dev
split from the final weights (beam 4, the config's length penalty, no checkpoint averaging), the
parameter count, and training target tokens per second (time in updates; evaluation excluded).

torch, the trainer and the dataset reader are imported inside the functions that run a row: the
report (table3_report), which reads this module's file layout, needs none of them.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from aiayn.checks import read_json
from aiayn.config import Config
from aiayn.errors import UserError
from aiayn.files import atomic_write
from aiayn.recipes.table3 import ROWS, TABLE3, paper_delta, row_config, scale_delta
from aiayn.training.options import TrainOptions

STUDY_FILE, RUNS, ROW_FILE = "study.json", "runs", "row.json"


@dataclass(frozen=True)
class Run:
    """One training run of the study: a Table 3 row with a seed (weights, dropout, batch order).
    Every row uses seed 1, so every row sees the same batches; the base row's other seeds give
    the noise."""

    row: str
    seed: int = 1

    @property
    def name(self) -> str:
        return self.row if self.seed == 1 else f"{self.row}-seed{self.seed}"


def plan(rows: list[str] | None = None, base_seeds: list[int] | None = None) -> list[Run]:
    """The runs of the study, in the paper's row order: each row with seed 1 and the base row
    with each of `base_seeds` (default 1, 2, 3). `rows` None means every row."""
    rows = list(ROWS) if rows is None else rows
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise UserError(f"unknown Table 3 row {unknown[0]!r}; the rows are: {', '.join(ROWS)}")
    seeds = [1, 2, 3] if base_seeds is None else base_seeds
    if not seeds or min(seeds) < 1:
        raise UserError(f"seeds must be >= 1, got {seeds}")
    runs = []
    for row in ROWS:
        if row in rows:
            runs += [Run(row, s) for s in (sorted(set(seeds)) if row == "base" else [1])]
    return runs


@dataclass(frozen=True)
class StudySettings:
    """What every run of a study shares; stored in OUT/study.json."""

    base: Config = TABLE3  # the study base; its max_steps is the number of updates of every row
    beam_size: int = 4  # dev BLEU's beam (Table 3: beam 4, no checkpoint averaging)
    eval_every: int = 200  # updates between dev evaluations (the learning curves)
    eval_bleu_sentences: int = 0  # greedy dev BLEU on this many sentences at each evaluation
    dev_split: str = "valid"

    @property
    def updates(self) -> int:
        return self.base.max_steps

    def record(self, data: Any) -> dict[str, Any]:
        return {"study": "table3", "updates": self.updates, "beam_size": self.beam_size,
                "eval_every": self.eval_every, "eval_bleu_sentences": self.eval_bleu_sentences,
                "dev_split": self.dev_split, "base": self.base.to_dict(),
                "data_fingerprint": data.manifest.get("fingerprint")}


@dataclass
class RowResult:
    """A finished run's figures (OUT/runs/<run>/row.json)."""

    name: str
    row: str
    seed: int
    params: int
    dev_ppl: float
    dev_nll: float
    dev_bleu: float
    tok_s: float  # training target tokens (EOS included) per second of updates
    updates: int
    tgt_tokens: int
    train_seconds: float
    decode_seconds: float
    bleu_signature: str
    config: dict[str, Any] = field(default_factory=dict)
    curve: list[dict[str, float]] = field(default_factory=list)  # the dev evaluations by update

    @classmethod
    def read(cls, path: Path) -> "RowResult":
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as e:
            raise UserError(f"{path}: not a study row result ({e})") from None


@dataclass
class RunOptions:
    """How to run (not what: that is `StudySettings`)."""

    device: str | None = None  # "cpu" or "cuda"; None: CUDA when available
    threads: int | None = None
    save_every: int = 100  # updates between checkpoints: what a kill can cost
    # training arithmetic (`aiayn train --precision`): auto is bf16 autocast where the CPU has
    # native bf16, so dev perplexities differ in the 4th digit from an fp32 evaluation
    precision: str = "auto"
    progress: bool = True
    say: Callable[[str], None] = field(default=lambda msg: print(msg, file=sys.stderr, flush=True))


def open_study(out: Path, settings: StudySettings, data: Any) -> None:
    """Create OUT/study.json, or check that the study there has these settings."""
    record = settings.record(data)
    path = out / STUDY_FILE
    if path.exists():
        old = read_json(path, dict)
        differ = [k for k in record if old.get(k) != record[k]]
        if differ:
            raise UserError(f"{out} holds a study with other settings ({differ[0]}: "
                            f"{old.get(differ[0])!r} there); rerun it with its own settings or "
                            f"give another --out")
        return
    if out.is_dir() and any(out.iterdir()):  # the study writes runs/ and report/ there
        raise UserError(f"{out} is not empty and holds no study ({STUDY_FILE}); a study starts in "
                        f"a new or empty --out")
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as f:
        json.dump(record, f, indent=2)


def run_study(data_dir: str | Path, out: str | Path, runs: list[Run],
              settings: StudySettings = StudySettings(), options: RunOptions = RunOptions()
              ) -> list[RowResult]:
    """Train and measure each run not done yet; returns the results of `runs`, in order."""
    from aiayn.data.dataset import load_dataset_dir

    out = Path(out)
    data = load_dataset_dir(data_dir)
    configs = {}
    for r in runs:  # every row's config before any training: a bad study base fails at once
        try:
            configs[r.row] = data.model_config(row_config(r.row, settings.base))
        except ValueError as e:
            raise UserError(f"row {r.row}: {e}") from None
    open_study(out, settings, data)
    results = []
    for i, r in enumerate(runs, 1):
        path = out / RUNS / r.name / ROW_FILE
        if path.exists():
            options.say(f"[{i}/{len(runs)}] {r.name}: done")
            results.append(RowResult.read(path))
            continue
        options.say(f"[{i}/{len(runs)}] {r.name}: {describe_change(r.row, settings.base)}")
        result = run_row(r, configs[r.row], data_dir, out / RUNS / r.name, settings, options)
        options.say(f"[{i}/{len(runs)}] {r.name}: dev PPL {result.dev_ppl:.2f}, BLEU "
                    f"{result.dev_bleu:.2f}, {result.tok_s:,.0f} tok/s")
        results.append(result)
    return results


def run_row(run: Run, cfg: Config, data_dir: str | Path, run_dir: Path,
            settings: StudySettings, options: RunOptions) -> RowResult:
    """Train one run to `settings.updates` (resuming what is there), then measure it and write
    its row.json."""
    from aiayn.training.trainer import train

    summary = _finished_summary(run_dir, settings.updates)
    if summary is None:
        summary = train(cfg, data_dir, run_dir, TrainOptions(
            max_steps=settings.updates, resume=True, seed=run.seed, eval_every=settings.eval_every,
            eval_bleu_sentences=settings.eval_bleu_sentences, save_every=options.save_every,
            save_minutes=None, keep=1, device=options.device, threads=options.threads,
            precision=options.precision, progress=options.progress, tensorboard=False,
            dev_split=settings.dev_split))
    result = measure(run, run_dir, summary, data_dir, settings, options.device)
    with atomic_write(run_dir / ROW_FILE) as f:
        json.dump(asdict(result), f, indent=2)
    return result


def _finished_summary(run_dir: Path, updates: int) -> dict[str, Any] | None:
    """The summary of a run that has trained all its updates, or None."""
    try:
        s = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return s if s.get("steps") == updates and s.get("final_dev") else None


def measure(run: Run, run_dir: Path, summary: dict[str, Any], data_dir: str | Path,
            settings: StudySettings, device: str | None) -> RowResult:
    """The row's figures from the run's summary, its dev records, and a beam search of the dev
    split with the final weights."""
    import torch

    from aiayn.data.dataset import load_dataset_dir
    from aiayn.data.model_dir import load_model
    from aiayn.model.counting import count_parameters
    from aiayn.training.evaluate import dev_bleu

    dev_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded = load_model(run_dir / "last", dev_device)
    dev = load_dataset_dir(data_dir).split(settings.dev_split)
    t0 = time.perf_counter()
    bleu = dev_bleu(loaded.model, dev, -1, dev_device, nullcontext, beam_size=settings.beam_size)
    decode_seconds = time.perf_counter() - t0
    if not bleu:
        raise UserError(f"{settings.dev_split} split of {data_dir} keeps no reference text for BLEU")
    final = summary["final_dev"]
    base = settings.base
    changed = {k: v for k, v in loaded.cfg.to_dict().items()
               if k not in ("vocab_size", "tgt_vocab_size") and getattr(base, k) != v}
    return RowResult(
        name=run.name, row=run.row, seed=run.seed, params=count_parameters(loaded.cfg),
        dev_ppl=final["dev_ppl"], dev_nll=final["dev_nll"], dev_bleu=bleu["dev_bleu"],
        tok_s=summary["tgt_tokens_per_s"], updates=summary["steps"],
        tgt_tokens=summary["tgt_tokens"], train_seconds=summary["train_seconds"],
        decode_seconds=decode_seconds, bleu_signature=bleu["bleu_signature"], config=changed,
        curve=dev_curve(run_dir))


def dev_curve(run_dir: Path) -> list[dict[str, float]]:
    """The run's dev evaluations from metrics.jsonl: update, dev perplexity (and greedy BLEU
    where it was computed)."""
    out = []
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "dev":
            out.append({k: rec[k] for k in ("step", "dev_ppl", "dev_bleu") if k in rec})
    return out


def describe_change(row: str, base: Config) -> str:
    """The row's change to the study base in the paper's symbols, e.g. 'h=1 d_k=128 d_v=128'."""
    delta = scale_delta(paper_delta(row), base)
    return " ".join(f"{SYMBOLS.get(k, k)}={v}" for k, v in delta.items()) or "the study base"


# The paper's symbols for the config fields Table 3 varies.
SYMBOLS = {"n_layers": "N", "d_model": "d_model", "d_ff": "d_ff", "n_heads": "h", "d_k": "d_k",
           "d_v": "d_v", "p_drop": "P_drop", "eps_ls": "eps_ls", "positions": "positions"}
