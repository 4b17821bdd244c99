"""Checkpoints of a training run, and resuming from them bit for bit.

Layout of a run directory:

    RUN_DIR/
      checkpoints/step_000500/   a model directory (config.json, model.safetensors, spm.model,
                                 meta.json: see aiayn.data.model_dir) plus trainer_state.pt
      checkpoints/step_001000/   ...the newest `keep`; only the newest keeps its trainer_state.pt
                                 (older ones are kept for averaging, §6.1, which needs weights only)
      best/                      model directory of the checkpoint with the lowest dev loss
      last -> checkpoints/step_001000   symlink to the newest checkpoint (a model directory too)
      metrics.jsonl, tb/, run.json      logs (see aiayn.training.trainer)

Each checkpoint directory is written to a temporary sibling, fsynced and renamed into place
(`write_dir_atomically`), then `last` is repointed, then old checkpoints are pruned: a kill at any
instant leaves the previous checkpoint complete and loadable. Resuming picks the newest complete
checkpoint that has trainer state, whatever `last` says.

trainer_state.pt (torch.save, loaded with weights_only=True): the completed update count, the
optimizer and loss-scaler states, and per rank the RNG states (python, numpy, torch, CUDA) and the
batch sampler's position, plus the run's totals so far (`logs.RunProgress`, as a dict). Restoring all of them makes a resumed run
compute exactly what the uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from aiayn.checks import check_schema
from aiayn.data.model_dir import MODEL_DIR_FILES
from aiayn.errors import UserError
from aiayn.files import (
    atomic_write,
    delete_atomically,
    foreign_entry,
    fsync_dir,
    is_temporary,
    temp_path,
    write_dir_atomically,
)
from aiayn.files import remove_stale_temporaries as remove_dead_temporaries

CHECKPOINTS, BEST, LAST, TRAINER_STATE = "checkpoints", "best", "last", "trainer_state.pt"
# `write(directory, weights)`: a model directory's files (the task's, aiayn/training/task.py)
ModelWriter = Callable[[Path, dict[str, torch.Tensor]], None]
STATE_FORMAT, STATE_VERSION = "aiayn-trainer-state", 2
_STEP_DIR = re.compile(r"^step_(\d+)$")

def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"

def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first, as (step, directory). Temporary directories
    of an interrupted write (hidden names) are never listed."""
    root = Path(run_dir) / CHECKPOINTS
    found = []
    if root.is_dir():
        for d in root.iterdir():
            m = _STEP_DIR.match(d.name)
            if m and d.is_dir() and (d / "config.json").is_file() and (d / "model.safetensors").is_file():
                found.append((int(m.group(1)), d))
    return sorted(found)

def latest_resumable(run_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint that holds trainer state, or None."""
    for _, d in reversed(list_checkpoints(run_dir)):
        if (d / TRAINER_STATE).is_file():
            return d
    return None

def has_run_outputs(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir` holds checkpoints from an earlier run."""
    r = Path(run_dir)
    return bool(list_checkpoints(r)) or (r / BEST).exists() or os.path.lexists(r / LAST)

def remove_stale_temporaries(run_dir: str | os.PathLike) -> None:
    """Delete what writes a kill interrupted left in a run (temporary checkpoint directories,
    never listed as checkpoints but taking space; half-written logs). The caller holds the run's
    lock, so no other process is writing there: hidden `.step_*` directories of any age go too."""
    root = Path(run_dir) / CHECKPOINTS
    remove_dead_temporaries(run_dir)
    remove_dead_temporaries(root)
    if root.is_dir():
        for d in root.iterdir():
            if d.name.startswith(".step_") and d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)


# What a run writes into its directory (the layout above), all of which --overwrite replaces.
RUN_OUTPUTS = (CHECKPOINTS, BEST, "tb", LAST, "metrics.jsonl", "run.json", "summary.json")
TB_FILES = ("events.out.tfevents.*",)  # what TensorBoard's SummaryWriter writes into tb/


def foreign_run_file(run_dir: str | os.PathLike) -> Path | None:
    """The first thing among `RUN_OUTPUTS` that no run of aiayn train wrote (a user's notes in
    checkpoints/ or best/, a directory named metrics.jsonl), which clearing the run would
    delete; None when there is none."""
    r = Path(run_dir)
    for name in ("metrics.jsonl", "run.json", "summary.json", LAST):
        p = r / name
        if p.is_dir() and not p.is_symlink():
            return p
    for name, files in ((BEST, MODEL_DIR_FILES), ("tb", TB_FILES)):
        p = r / name
        if os.path.lexists(p):
            if not p.is_dir() or p.is_symlink():
                return p
            theirs = foreign_entry(p, files)
            if theirs is not None:
                return theirs
    root = r / CHECKPOINTS
    if not os.path.lexists(root):
        return None
    if not root.is_dir() or root.is_symlink():
        return root
    for d in sorted(root.iterdir()):
        if is_temporary(d.name) or (d.name.startswith(".step_") and d.is_dir() and not d.is_symlink()):
            continue  # an interrupted write's (remove_stale_temporaries)
        if not (_STEP_DIR.match(d.name) and d.is_dir() and not d.is_symlink()):
            return d
        theirs = foreign_entry(d, MODEL_DIR_FILES)
        if theirs is not None:
            return theirs
    return None


def check_run_is_ours(run_dir: str | os.PathLike) -> None:
    """Refuse (one line naming it) to replace a run that holds something no run wrote."""
    theirs = foreign_run_file(run_dir)
    if theirs is not None:
        raise UserError(f"{theirs} is not something aiayn train wrote, and starting over would "
                        f"delete it; move it out of {run_dir}, or choose another --out")


def clear_run(run_dir: str | os.PathLike) -> None:
    """Remove what a training run writes into `run_dir` (for --overwrite), and nothing else:
    refused before anything is deleted where those hold a file no run wrote (`foreign_run_file`)."""
    r = Path(run_dir)
    check_run_is_ours(r)
    for name in RUN_OUTPUTS:
        delete_atomically(r / name)  # a kill midway leaves no half-deleted checkpoint

# --- RNG states -------------------------------------------------------------------------------

def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """Python, numpy, torch (CPU) and CUDA generator states, as plain types and tensors."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state

def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["gauss"]))
    torch.set_rng_state(state["torch"])
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)

def _tupleize(x: Any) -> Any:
    """random.getstate() must get tuples back; torch.load gives them back as they were saved, but
    be lenient with lists (e.g. a state passed through JSON)."""
    return tuple(_tupleize(i) for i in x) if isinstance(x, (list, tuple)) else x

# --- writing ----------------------------------------------------------------------------------

def all_finite(state: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state.values() if v.is_floating_point())

def save_torch(obj: Any, path: Path) -> None:
    """torch.save through a Python file, so that a failed write keeps its OS error: torch's own
    file writer reports a full disk only as "unexpected pos", which no one can act on."""
    failures: list[OSError] = []

    with open(path, "wb") as f:
        class Recording:
            def write(self, data: bytes) -> int:
                try:
                    return f.write(data)
                except OSError as e:
                    failures.append(e)
                    raise

            def flush(self) -> None:
                f.flush()

        try:
            torch.save(obj, Recording())
        except RuntimeError:
            if failures:
                raise failures[0] from None
            raise

def save_checkpoint(run_dir: str | os.PathLike, step: int, weights: dict[str, torch.Tensor],
                    write_model: ModelWriter, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step` atomically (the model files by `write_model(directory, weights)`,
    the task's, then the trainer state), repoint `last`, prune to the newest `keep`, and drop
    trainer state from all but the newest. Refuses non-finite weights (a diverged run must not
    replace good checkpoints)."""
    if not all_finite(weights):
        raise UserError(f"parameters are not finite at step {step}; not writing a checkpoint")

    def fill(tmp: Path) -> None:
        write_model(tmp, weights)
        save_torch(trainer_state, tmp / TRAINER_STATE)

    path = write_dir_atomically(step_dir(run_dir, step), fill)
    point_last(run_dir, path)
    prune(run_dir, keep)
    return path

def save_best(run_dir: str | os.PathLike, weights: dict[str, torch.Tensor],
              write_model: ModelWriter) -> Path:
    """RUN_DIR/best: a plain model directory (no trainer state)."""
    if not all_finite(weights):
        raise UserError("parameters are not finite; not writing the best model")
    return write_dir_atomically(Path(run_dir) / BEST, lambda tmp: write_model(tmp, weights))

def point_last(run_dir: str | os.PathLike, target: Path) -> None:
    """Atomically (re)point the RUN_DIR/last symlink at `target` (relative, so runs can move).
    Where symlinks are not supported, `last` is a text file holding that relative path."""
    run = Path(run_dir)
    link, tmp = run / LAST, temp_path(run / LAST)
    rel = os.path.relpath(target, run)
    try:
        os.symlink(rel, tmp)
    except OSError:
        with atomic_write(link) as f:
            f.write(rel + "\n")
        return
    os.replace(tmp, link)
    fsync_dir(run)


def prune(run_dir: str | os.PathLike, keep: int) -> None:
    ckpts = list_checkpoints(run_dir)
    for _, d in ckpts[: max(0, len(ckpts) - keep)]:
        delete_atomically(d)  # never a half-deleted checkpoint that still looks complete
    for _, d in ckpts[max(0, len(ckpts) - keep): -1]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(d / TRAINER_STATE)

# --- resuming ---------------------------------------------------------------------------------

def resume_point(run_dir: Path, resume: bool, overwrite: bool) -> Path | None:
    """The checkpoint a run continues from, or None for a fresh run. Refuses to start afresh over
    an earlier run's checkpoints unless `overwrite` (the caller then clears them with `clear_run`)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} exists and is not a directory")
    if resume:
        latest = latest_resumable(run_dir)
        if latest is not None:
            return latest
        if has_run_outputs(run_dir):
            raise UserError(f"--resume: {run_dir} has checkpoints but none with trainer state")
        return None  # nothing written yet (e.g. killed before the first checkpoint): start afresh
    if has_run_outputs(run_dir) and not overwrite:
        raise UserError(f"{run_dir} already holds checkpoints; pass --resume to continue that run "
                        f"or --overwrite to start over")
    # a fresh run replaces the logs of an earlier run killed before its first checkpoint (it wrote
    # run.json first), never files of the same names that no run of aiayn train wrote
    if not has_run_outputs(run_dir) and not (run_dir / "run.json").exists():
        theirs = [n for n in ("metrics.jsonl", "tb", "summary.json") if os.path.lexists(run_dir / n)]
        if theirs:
            raise UserError(f"{run_dir} holds {', '.join(theirs)} that no aiayn train run wrote; "
                            f"choose another --out")
    if overwrite:  # clear_run deletes only what runs wrote: checked here, on every rank, first
        check_run_is_ours(run_dir)
    return None


def reconcile(saved: Any, wanted: Any | None, where: Path) -> tuple[Any, list[str]]:
    """On resume: the checkpoint's config with the caller's changes to recipe fields applied (a
    larger max_steps, say), and those changes as 'name: old -> new'. Architecture changes are
    refused: the saved weights would not fit."""
    if wanted is None:
        return saved, []
    arch = saved.architecture_changes(wanted)
    if arch:
        raise UserError(f"cannot resume {where}: the architecture would change ({arch[0]})")
    changed = [f"{k}: {v} -> {getattr(wanted, k)}" for k, v in saved.to_dict().items()
               if getattr(wanted, k) != v]
    return wanted, changed


# --- reading ----------------------------------------------------------------------------------

_RNG_SCHEMA = {
    "python": (tuple, list),
    "numpy": {"kind": str, "keys": torch.Tensor, "pos": int, "has_gauss": int, "gauss": float},
    "torch": torch.Tensor, "?cuda": torch.Tensor,
}
# What the trainer reads from trainer_state.pt (checked before any of it is used).
STATE_SCHEMA = {
    "format": frozenset({STATE_FORMAT}), "version": int, "step": int,
    "optimizer": {"state": dict, "param_groups": [dict]}, "scaler": dict,
    "sampler": {"epoch": int, "position": int},
    "ranks": [{"rng": _RNG_SCHEMA}],
    "progress": {"dev": [dict], "best": (dict, None), "tgt_tokens": int, "src_tokens": int,
                 "train_seconds": float, "wall_seconds": float, "skipped": int},
    "run": {"seed": int, "world_size": int, "batch_tokens": int, "accum": int,
            "?finetune": {str: (int, float)}},  # the fine-tuning defaults a run started with
}


def load_trainer_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    """Read and check a checkpoint's trainer state. Only tensors and plain data are unpickled
    (weights_only): a file holding other Python objects is refused, never executed."""
    path = Path(ckpt) / TRAINER_STATE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"{ckpt} has no {TRAINER_STATE}; it cannot be resumed") from None
    except pickle.UnpicklingError:
        with open(path, "rb") as f:
            head = f.read(2)
        if head[:1] != b"\x80" and head != b"PK":  # neither a pickle nor torch's zip: damaged
            raise UserError(f"{path}: cannot read trainer state (damaged or not a PyTorch file)") from None
        # PyTorch's message would advise weights_only=False: never
        raise UserError(f"{path}: refused: it holds Python objects other than tensors and plain "
                        f"data, which aiayn never writes; resume from a checkpoint aiayn wrote") from None
    except Exception as e:  # a damaged or foreign file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: cannot read trainer state ({reason[:200]})") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise UserError(f"{path}: not an aiayn trainer state")
    if state.get("version") == 1 and isinstance(state.get("metrics"), dict):
        m = state.pop("metrics")  # version 1 kept its run totals in a dict named "metrics"
        state["progress"] = {"dev": m.get("history"), "best": m.get("best"),
                             "tgt_tokens": m.get("tgt_tokens"), "src_tokens": m.get("src_tokens"),
                             "train_seconds": m.get("train_seconds"),
                             "wall_seconds": m.get("wall_seconds", 0.0), "skipped": m.get("skipped")}
    elif state.get("version") != STATE_VERSION:
        raise UserError(f"{path}: trainer state version {state.get('version')}, expected {STATE_VERSION}")
    check_schema(state, STATE_SCHEMA, str(path))
    if len(state["ranks"]) != state["run"]["world_size"]:
        raise UserError(f"{path}: field 'ranks' holds {len(state['ranks'])} entries for "
                        f"{state['run']['world_size']} process(es)")
    return state

def new_trainer_state(**fields: Any) -> dict[str, Any]:
    return {"format": STATE_FORMAT, "version": STATE_VERSION, **fields}

def rng_from_state(rank_state: dict[str, Any]) -> dict[str, Any]:
    rng = dict(rank_state["rng"])
    rng["python"] = _tupleize(rng["python"])
    return rng

