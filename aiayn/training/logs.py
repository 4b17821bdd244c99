"""What a run reports: RUN_DIR/metrics.jsonl (one JSON record a line, of kind "train", "dev" or
"skip", each with the update count `step`), TensorBoard scalars in RUN_DIR/tb, progress messages on
stderr, and the final summary. Only rank 0 writes.

On resume, records and TensorBoard events after the resumed checkpoint's step are dropped (a
killed run may have logged updates that are now recomputed), so every step appears once.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

from aiayn.io import atomic_write
from aiayn.training.distributed import DistEnv


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
            from tqdm import tqdm

            tqdm.write(msg, file=sys.stderr)

    def close(self) -> None:
        if self.active:
            self._file.close()
            if self.tb is not None:
                self.tb.close()


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
