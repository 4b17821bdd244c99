"""What a run reports: RUN_DIR/metrics.jsonl (one JSON record a line, of kind "train", "dev" or
"skip", each with the update count `step`), TensorBoard scalars in RUN_DIR/tb, progress messages on
stderr, and the final summary. Only rank 0 writes.

On resume, records and TensorBoard events after the resumed checkpoint's step are dropped (a
killed run may have logged updates that are now recomputed), so every step appears once.

TensorBoard's writer is imported only when a run writes TensorBoard scalars: its import costs a
quarter of a second more than torch's, which a run with `--no-tensorboard` or a test need not pay.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from aiayn.files import atomic_write
from aiayn.training.distributed import DistEnv


@dataclass
class RunProgress:
    """What a run has done so far, whole-run totals across resumes (saved in the trainer state).

    `dev` holds one record per dev evaluation ({"step", "dev_loss", "dev_nll", "dev_ppl", ...}),
    `best` the one with the lowest dev NLL; `train_seconds` counts time in updates (batching
    included), `wall_seconds` the run's wall time up to its last checkpoint."""

    dev: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    tgt_tokens: int = 0
    src_tokens: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    skipped: int = 0


def rss_gb() -> float | None:
    """This process's resident memory now, in GB (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class LogWindow:
    """The updates since the last "train" record: their results (`step.UpdateResult`), seconds
    spent in updates (batching included) and, of those, building batches."""

    results: list[Any] = field(default_factory=list)
    seconds: float = 0.0
    data_seconds: float = 0.0

    def values(self) -> dict[str, float]:
        """Per-target-token loss and NLL over the window, perplexity, the last learning rate and
        gradient norm, target tokens/s and the share of time spent building batches."""
        n = sum(r.tgt_tokens for r in self.results)
        nll = sum(r.nll * r.tgt_tokens for r in self.results) / max(n, 1)
        last = self.results[-1]
        return {"loss": sum(r.loss * r.tgt_tokens for r in self.results) / max(n, 1), "nll": nll,
                "ppl": math.exp(min(nll, 700)), "lr": last.lr, "grad_norm": last.grad_norm,
                "tgt_tokens_per_s": n / max(self.seconds, 1e-9),
                "data_share": self.data_seconds / max(self.seconds, 1e-9)}


class RunLog:
    """metrics.jsonl, TensorBoard and stderr messages; silent except on rank 0."""

    def __init__(self, run_dir: Path, env: DistEnv, tensorboard: bool, resume_step: int):
        self.active = env.is_main
        self.path = run_dir / "metrics.jsonl"
        self.tb = None
        if not self.active:
            return
        if resume_step:
            self._truncate(resume_step)
        else:  # a fresh run: drop what a run killed before its first checkpoint left
            self.path.unlink(missing_ok=True)
            shutil.rmtree(run_dir / "tb", ignore_errors=True)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a killed run wrote after its last checkpoint
            self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=resume_step + 1 if resume_step else None)
        self._file = open(self.path, "a", encoding="utf-8")

    def _truncate(self, step: int) -> None:
        """Keep the records of the steps the resumed checkpoint covers."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:
                pass  # a line torn by the kill
        with atomic_write(self.path) as f:
            f.write("".join(line + "\n" for line in keep))

    def record(self, kind: str, step: int, **values: Any) -> None:
        """One metrics.jsonl line; numbers also go to TensorBoard as `kind/name` at `step`."""
        if not self.active:
            return
        plain = {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in values.items()}  # strict JSON has no NaN or Infinity
        self._file.write(json.dumps({"kind": kind, "step": step, **plain}, default=float) + "\n")
        self._file.flush()
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(f"{kind}/{k}", v, step)

    def say(self, msg: str) -> None:
        if self.active:
            tqdm.write(msg, file=sys.stderr)

    def close(self) -> None:
        if self.active:
            self._file.close()
            if self.tb is not None:
                self.tb.close()


def build_summary(progress: RunProgress, flops_per_token: float, steps: int, stopped_by: str,
                  epochs: float, wall_this_session: float, peak_tflops: float | None,
                  world_size: int, **extra: Any) -> dict[str, Any]:
    """The run's summary (summary.json, what `train` returns): totals, throughput, compute and
    MFU against `peak_tflops` per device, and the dev figures; `extra` fields are added as given."""
    secs = max(progress.train_seconds, 1e-9)
    flops = flops_per_token * progress.tgt_tokens
    tflops = flops / secs / 1e12
    return {
        "steps": steps, "stopped_by": stopped_by, "epochs": epochs,
        "wall_seconds_this_session": wall_this_session, "train_seconds": progress.train_seconds,
        "tgt_tokens": progress.tgt_tokens, "src_tokens": progress.src_tokens,
        "tgt_tokens_per_s": progress.tgt_tokens / secs,
        "flops_per_target_token": flops_per_token, "train_flops": flops, "achieved_tflops": tflops,
        "mfu": tflops / (peak_tflops * world_size) if peak_tflops else None,
        "skipped_updates": progress.skipped,
        "final_dev": progress.dev[-1] if progress.dev else None, "best_dev": progress.best,
        "world_size": world_size, **extra,
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"done: {s['steps']} steps ({s['stopped_by']}), {s['epochs']:.2f} epochs, "
             f"{s['tgt_tokens']:,} target tokens in {s['train_seconds']:.1f}s of updates "
             f"({s['tgt_tokens_per_s']:.0f} tok/s)",
             f"training compute: {s['train_flops']:.3g} FLOPs ({s['flops_per_target_token'] / 1e6:.1f}M "
             f"per target token), {s['achieved_tflops']:.3f} TFLOP/s achieved"
             + (f", MFU {100 * s['mfu']:.1f}%" if s["mfu"] is not None else "")]
    if s["final_dev"]:
        d = s["final_dev"]
        lines.append(f"final dev: loss {d['dev_loss']:.4f}, ppl {d['dev_ppl']:.2f}"
                     + (f", BLEU {d['dev_bleu']:.2f}" if "dev_bleu" in d else ""))
    if s["skipped_updates"]:
        lines.append(f"skipped updates (non-finite): {s['skipped_updates']}")
    if s["checkpoint"]:
        lines.append(f"last checkpoint: {s['checkpoint']}")
    return "\n".join(lines)
