"""Which task a directory belongs to: the one place that knows every task (aiayn/training/task.py).

- A dataset made by `aiayn prepare` (it has manifest.json) trains the sequence-to-sequence
  Transformer (or the RNN baseline): `Seq2SeqTask`.
- A corpus made by `aiayn treebank` (train.gold beside the sentences) trains the chart parser:
  `ChartTask` (aiayn/parsing/chart/).
- A model directory's config.json says its task under "task" (absent: sequence-to-sequence).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiayn.checks import read_json
from aiayn.config import Config
from aiayn.data.model_dir import read_config
from aiayn.errors import UserError
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.chart.files import read_chart_config
from aiayn.parsing.chart.task import ChartTask
from aiayn.training.seq2seq import Seq2SeqTask

CONFIGS = {None: Config, ChartConfig.TASK: ChartConfig}
# Each config's reader, which also checks it against the weights beside it (before any model is built).
READERS = {None: read_config, ChartConfig.TASK: read_chart_config}


def task_for_data(data_dir: str | Path, dev_split: str | None = None) -> Any:
    """The task that trains on `data_dir`, its data read; one line when it is neither kind."""
    d = Path(data_dir)
    if not d.is_dir():
        raise UserError(f"{d}: no such directory (make a dataset with aiayn prepare, or a treebank "
                        f"corpus with aiayn treebank)")
    if (d / "manifest.json").exists():
        return Seq2SeqTask(d, dev_split)
    if (d / "train.gold").exists() or (d / "corpus.json").exists():
        return ChartTask(d, dev_split)
    raise UserError(f"{d} is neither a dataset made by aiayn prepare (no manifest.json) nor a "
                    f"treebank corpus made by aiayn treebank (no train.gold)")


def read_model_config(model_dir: str | Path) -> Any:
    """The config of any model directory (a `Config`, or a task's own by its "task")."""
    p = Path(model_dir)
    if not (p / "config.json").is_file():
        if (p / "chart.json").is_file():  # a chart parser saved before config.json existed
            return read_chart_config(p)
        raise UserError(f"{p} is not an aiayn model directory (no config.json)")
    data = read_json(p / "config.json")
    task = data.get("task") if isinstance(data, dict) else None
    if task not in CONFIGS:
        raise UserError(f"{p / 'config.json'}: unknown task {task!r}; this aiayn knows "
                        f"{', '.join(t for t in CONFIGS if t)} besides the sequence-to-sequence model")
    return READERS[task](p)
