"""What the plots read: a run's metrics.jsonl, and the Table 3 study's results file.

A run's RUN_DIR/metrics.jsonl (aiayn/training/logs.py) holds one JSON record a line: "train"
records carry `step`, `loss` and `elapsed` (seconds of training so far, earlier sessions of a
resumed run included); "dev" records carry `step`, `dev_ppl` and, when the run computed it,
`dev_bleu`, but no time: their wall time is read off the train records around them.

The Table 3 results file has one row per model variant, with at least these columns:

    name    the variant, e.g. "base", "A1", "C-N2"
    params  its parameter count (a plain number: 65000000 or 6.5e7)
    ppl     dev perplexity (per piece), may be empty
    bleu    dev BLEU, may be empty

either as CSV or TSV with a header line (other columns are ignored), or as JSON lines, one
object a line with those keys (.jsonl/.json).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aiayn.errors import UserError


@dataclass
class RunCurves:
    """A run's curves as float arrays: train (step, loss, seconds), dev (step, ppl, bleu,
    seconds); dev_bleu is NaN where a record has none."""

    train_step: np.ndarray
    train_loss: np.ndarray
    train_seconds: np.ndarray
    dev_step: np.ndarray
    dev_ppl: np.ndarray
    dev_bleu: np.ndarray
    dev_seconds: np.ndarray


def _number(v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return math.nan
    return x


def metrics_path(path: str | os.PathLike) -> Path:
    """A run directory or its metrics.jsonl -> the metrics.jsonl path (UserError if missing)."""
    p = Path(path)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.is_file():
        raise UserError(f"{p}: no such metrics file (give a run directory or its metrics.jsonl)")
    return p


def read_metrics(path: str | os.PathLike) -> RunCurves:
    """Parse metrics.jsonl (a torn last line, as a killed run leaves, is skipped)."""
    p = metrics_path(path)
    train, dev = [], []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(r, dict):
            raise UserError(f"{p}:{n}: not a metrics record")
        if r.get("kind") == "train":
            train.append([_number(r.get(k)) for k in ("step", "loss", "elapsed")])
        elif r.get("kind") == "dev":
            dev.append([_number(r.get(k)) for k in ("step", "dev_ppl", "dev_bleu")])
    if not train and not dev:
        raise UserError(f"{p}: no train or dev records")
    t = np.array(train, dtype=np.float64).reshape(-1, 3)
    d = np.array(dev, dtype=np.float64).reshape(-1, 3)
    return RunCurves(t[:, 0], t[:, 1], t[:, 2], d[:, 0], d[:, 1], d[:, 2],
                     dev_seconds(d[:, 0], t[:, 0], t[:, 2]))


def dev_seconds(dev_step: np.ndarray, train_step: np.ndarray, train_seconds: np.ndarray
                ) -> np.ndarray:
    """Wall time of each dev record: linear between the train records' (step, seconds) points
    around it, held at the ends; NaN when no train record has a time."""
    ok = np.isfinite(train_step) & np.isfinite(train_seconds)
    if not ok.any():
        return np.full(dev_step.shape, np.nan)
    order = np.argsort(train_step[ok], kind="stable")
    return np.interp(dev_step, train_step[ok][order], train_seconds[ok][order])


@dataclass
class StudyRow:
    name: str
    params: float
    ppl: float
    bleu: float


def read_study(path: str | os.PathLike) -> list[StudyRow]:
    """Rows of a Table 3 results file (format in the module docstring), in file order."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such results file")
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() in (".jsonl", ".json"):
        records = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{p}:{n}: not valid JSON ({e.msg})") from None
    else:
        first = text.splitlines()[0] if text.strip() else ""
        delimiter = "\t" if "\t" in first else ","
        records = list(csv.DictReader(io.StringIO(text), delimiter=delimiter))
    rows = []
    for n, r in enumerate(records, start=1):
        if not isinstance(r, dict) or "name" not in r or "params" not in r:
            raise UserError(f"{p}: row {n} lacks a name or params column")
        # `aiayn study table3` writes its results.csv with dev_ppl / dev_bleu columns
        rows.append(StudyRow(str(r["name"]), _number(r["params"]), _number(r.get("ppl", r.get("dev_ppl"))),
                             _number(r.get("bleu", r.get("dev_bleu")))))
    if not rows:
        raise UserError(f"{p}: no rows")
    return rows
