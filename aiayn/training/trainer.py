"""`train(cfg, data, out_dir, options) -> summary`: the training loop of §5, single-process or
under torchrun (DDP), resumable bit for bit from its checkpoints. `data` is a dataset directory
made by `aiayn prepare` (the sequence-to-sequence task, aiayn/training/seq2seq.py) or a `Task`
(aiayn/training/task.py: what the trainer trains, on which data).

Batch size: `Config.max_tokens` is the size of one *update* in tokens per side (§5.1: about 25,000
source and 25,000 target tokens), summed over gradient-accumulation micro-batches and ranks
(`stream.batch_plan`); a task sizes its updates in its own units (`Task.update_size`).

Stopping: after `cfg.max_steps` updates (`--max-steps` sets it), or after `max_epochs` passes over
the data, or after `time_budget` minutes, whichever comes first; when an epoch limit or a time
budget is given without a step limit, the step limit is off. Like the step count, the minutes
count the whole run: a resumed run trains for what is left of its budget. With
`Config.lr_cooldown` the rate falls to 0 towards whichever of those limits is nearest
(`schedule.cooldown_factor`; in minutes it depends on the clock, so such a resume is not bit-exact).

What a run writes into RUN_DIR (rank 0 only): checkpoints (aiayn.training.checkpoint), run.json
(config and options), metrics.jsonl (one JSON record a line: "train", "dev", "skip"), tb/
(TensorBoard scalars) and summary.json (what `train` returns).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.data.model_dir import load_state_checked, read_weights
from aiayn.errors import OutputError, UserError
from aiayn.files import atomic_write
from aiayn.locks import exclusive_lock
from aiayn.memory import allocator_in_use
from aiayn.progress import Progress
from aiayn.training import checkpoint as ckpt
from aiayn.training import distributed as dist_
from aiayn.training import finetune
from aiayn.training.logs import LogWindow, RunLog, RunProgress, build_summary, format_summary, rss_gb
from aiayn.training.options import TrainOptions
from aiayn.training.precision import Precision
from aiayn.training.schedule import build_optimizer, cooldown_factor
from aiayn.training.seq2seq import Seq2SeqTask
from aiayn.training.step import Updater, UpdateResult, compile_for_training
from aiayn.training.stream import BatchStream, batch_plan
from aiayn.training.task import Task

# The clock of time budgets and checkpoint intervals (tests replace it with a fake one, so that a
# budget of minutes gives the same run on a loaded machine as on an idle one).
_clock = time.monotonic
# A session's first updates, left out when it times its pace for the warm-up warning
_WARM_UPDATES = 10


class TrainingDiverged(UserError):
    """The loss stayed non-finite for too many updates in a row, or the weights became non-finite."""


class Trainer:
    """One training run: `Trainer(...)` sets everything up (a fresh run or a resumed one), `run()`
    trains until a limit and returns the summary. See the module docstring."""

    def __init__(self, cfg: Any | None, task: Task, out_dir: str | os.PathLike,
                 options: TrainOptions, env: dist_.DistEnv):
        options.check()
        self.options, self.env, self.task = options, env, task
        self.run_dir = Path(out_dir)
        if options.threads:
            torch.set_num_threads(options.threads)

        # a new run, or the continuation of the one in run_dir
        self.resume_from = ckpt.resume_point(self.run_dir, options.resume, options.overwrite)
        state = ckpt.load_trainer_state(self.resume_from) if self.resume_from else None
        if self.resume_from is not None:
            task.check_checkpoint(self.resume_from)
        # --init-from: a new run from a model's weights (a resumed run has its own)
        self.init_from = Path(options.init_from) if options.init_from and not state else None
        if self.init_from is not None:
            task.check_checkpoint(self.init_from)
        # the model a run started from (--init-from), recorded in every checkpoint's meta.json
        self.started_from: str | None = (str(self.init_from) if self.init_from is not None
                                         else (state["run"].get("init_from") if state else None))
        self.capped_epochs: int | None = None  # the fine-tuning default's epoch limit
        if self.started_from is not None and finetune.max_epochs(options) != options.max_epochs:
            self.capped_epochs = finetune.max_epochs(options)
            options = self.options = replace(options, max_epochs=self.capped_epochs)
        saved_run = state["run"] if state else {}
        # the config fields the fine-tuning defaults set (aiayn/training/finetune.py), kept on resume
        self.finetune: dict[str, Any] = {}
        self.model_cfg: Any | None = None  # --init-from's model's config, on a new run
        self.cfg, self.config_changes = self._config(cfg, saved_run)
        self.seed: int = options.seed if options.seed is not None else saved_run.get("seed", 1)
        if state is not None:
            self._check_same_run(saved_run)
        if options.overwrite:
            self._clear_earlier_run()

        # data: the batch layout carries over on resume unless given again
        if state is not None and options.accum is None and options.batch_tokens is None:
            self.batch_tokens, self.accum = saved_run["batch_tokens"], saved_run["accum"]
        else:
            self.batch_tokens, self.accum = batch_plan(task.update_size(self.cfg), env.world_size,
                                                       options.accum, options.batch_tokens)
        self.sampler = task.sampler(self.cfg, self.batch_tokens, self.seed, env.rank, env.world_size)

        # model, optimizer, precision; then the saved state over them
        self.model = self._initial_model()
        self.optimizer = build_optimizer(self.model.parameters(), self.cfg)
        self.precision = Precision(options.precision, env.device)
        self.step = 0  # completed updates
        self.saved_step = -1  # the step of the newest checkpoint (known to every rank)
        self.progress = RunProgress()
        if state is not None:
            self._restore(state)
        # what the update runs: the model itself, compiled, and/or wrapped in DDP; evaluation and
        # checkpoints always use `self.model` (the same parameters)
        self.step_model: torch.nn.Module = self.model
        if options.compile:
            self.step_model = compile_for_training(self.model)
        if env.distributed:
            self.step_model = dist_.wrap_ddp(self.step_model, env)
        self.updater = Updater(self.step_model, self.optimizer, self.cfg, self.precision, env,
                               partial(task.loss, cfg=self.cfg, autocast=self.precision.autocast))

        self.save_every = options.save_every
        if self.started_from is not None:  # fine-tuning, new or resumed: enough checkpoints to average
            per_epoch = math.ceil(len(self.sampler) / self.accum)
            self.save_every = (finetune.save_every(options, self.cfg.n_average, per_epoch)
                               or options.save_every)
        self.save_minutes = options.save_minutes
        budget, n = options.time_budget, self.cfg.n_average
        if (options.fit_saves_to_budget and budget is not None and self.save_minutes is not None
                and budget / self.save_minutes < n + 1):
            self.save_minutes = budget / (n + 1)
        self.warmup_checked = False  # `_check_warmup`, once a run's first updates are timed
        self._timed_from = (0, 0.0)  # (step, train_seconds) after the session's first updates

        if env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            ckpt.remove_stale_temporaries(self.run_dir)  # safe: rank 0 holds the run's lock
            if self.resume_from is not None:  # a kill between a checkpoint and its `last` link
                ckpt.point_last(self.run_dir, self.resume_from)  # left it one behind
        self.log = RunLog(self.run_dir, env, options.tensorboard, self.step if state else 0)
        self.wall_before = self.progress.wall_seconds  # earlier sessions of a resumed run
        self.t_start = _clock()  # reset when the loop starts

    # --- set-up ------------------------------------------------------------------------------

    def _config(self, cfg: Any | None, saved_run: dict[str, Any]) -> tuple[Any, list[str]]:
        """The run's config: the caller's (what the data decides filled in, --max-steps applied,
        on --init-from the fine-tuning defaults over the fields the user did not give),
        reconciled with the checkpoint's on resume."""
        max_steps = self.options.max_steps
        given = set(self.options.set_fields)
        start = (self.task.read_config(self.init_from)  # --init-from's model, read once
                 if self.init_from is not None and self.resume_from is None else None)
        if cfg is None and start is not None:
            cfg = start  # the model's own recipe, by default
        wanted = self.task.config(cfg) if cfg is not None else None
        if self.resume_from is None:
            if wanted is None:
                raise UserError(f"{self.run_dir} has no checkpoint to resume; give a --preset or --config")
            if start is not None:
                changes = start.architecture_changes(wanted)
                if changes:
                    raise UserError(f"--init-from {self.init_from}: the run's architecture differs "
                                    f"from the model's ({changes[0]}); leave the preset out to "
                                    f"take the model's config")
                self.model_cfg = start
                self.finetune = finetune.recipe_defaults(start, wanted, given, max_steps)
                wanted = replace(wanted, **self.finetune)
            return (replace(wanted, max_steps=max_steps) if max_steps else wanted), []
        saved = self.task.read_config(self.resume_from)
        # a fine-tuning run keeps the values its defaults set (as saved), unless given again now
        self.finetune = {k: v for k, v in saved_run.get("finetune", {}).items() if hasattr(saved, k)}
        if wanted is not None and self.finetune:
            wanted = replace(wanted, **{k: getattr(saved, k) for k in self.finetune if k not in given})
        if max_steps is not None:
            wanted = replace(wanted or saved, max_steps=max_steps)
        return ckpt.reconcile(saved, wanted, self.resume_from)

    def _check_same_run(self, saved_run: dict[str, Any]) -> None:
        if self.seed != saved_run["seed"]:
            raise UserError(f"cannot resume {self.resume_from}: it was trained with --seed "
                            f"{saved_run['seed']}, not {self.seed}")
        if saved_run["world_size"] != self.env.world_size:
            raise UserError(f"cannot resume {self.resume_from}: it was written by "
                            f"{saved_run['world_size']} process(es), this run has {self.env.world_size}")

    def _clear_earlier_run(self) -> None:
        dist_.barrier(self.env)
        if self.env.is_main:
            ckpt.clear_run(self.run_dir)
        dist_.barrier(self.env)

    def _initial_model(self) -> torch.nn.Module:
        """Seeded weights, identical on every rank; then the rank's own dropout stream."""
        random.seed(self.seed)
        np.random.seed(self.seed % 2**32)
        torch.manual_seed(self.seed)
        model = self.task.build_model(self.cfg).to(self.env.device)
        if self.init_from is not None:
            load_state_checked(model, read_weights(self.init_from), str(self.init_from))
        torch.manual_seed(dist_.rank_seed(self.seed, self.env.rank))
        return model

    def _restore(self, state: dict[str, Any]) -> None:
        load_state_checked(self.model, read_weights(self.resume_from), str(self.resume_from))
        self.step = self.saved_step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        try:  # the schema is checked on loading; these catch contents that do not fit this model
            self.optimizer.load_state_dict(state["optimizer"])
            self.precision.load_state_dict(state.get("scaler", {}))
            self.progress = RunProgress(**state["progress"])
            ckpt.restore_rng(ckpt.rng_from_state(state["ranks"][self.env.rank]), self.env.device)
        except (ValueError, TypeError, KeyError, RuntimeError) as e:
            reason = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise UserError(f"{self.resume_from / ckpt.TRAINER_STATE}: does not fit this run "
                            f"({reason})") from None

    @property
    def max_steps(self) -> int | None:
        """The step limit: cfg.max_steps, unless only an epoch limit or time budget was given."""
        o = self.options
        if o.max_steps is None and (o.max_epochs is not None or o.time_budget is not None):
            return None
        return self.cfg.max_steps

    # --- the loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            return self._loop()
        finally:
            self.log.close()

    def _describe(self) -> None:
        o, env, cfg, task = self.options, self.env, self.cfg, self.task
        if self.resume_from is not None:
            self.log.say(f"resuming {self.resume_from} at step {self.step}")
            for c in self.config_changes:
                self.log.say(f"  config change on resume: {c}")
        elif self.init_from is not None:
            self.log.say(f"starting from the weights of {self.init_from}, with a fresh optimizer "
                         f"and learning-rate schedule")
            every = self.save_every if self.save_every != o.save_every else None
            if self.finetune or every is not None or self.capped_epochs is not None:
                self.log.say(finetune.describe(self.finetune, self.model_cfg, cfg, every,
                                               self.capped_epochs))
        elif o.resume:  # e.g. the run was killed before its first checkpoint: say so, then start
            self.log.say(f"warning: --resume: {self.run_dir} holds no checkpoint yet; starting a "
                         f"new run at step 0")
        self.log.say(
            f"training {task.count_parameters(cfg):,} parameters on {env.world_size} x "
            f"{env.device.type}, {self.precision.name}{', compiled' if o.compile else ''}, "
            f"{allocator_in_use()}; update = {self.accum} x {self.batch_tokens} {task.unit} x "
            f"{env.world_size} rank(s) (target {task.update_size(cfg)}); {len(self.sampler)} "
            f"micro-batches per epoch per rank")
        if self.save_minutes != o.save_minutes:
            self.log.say(f"checkpoints every {self.save_minutes:.2g} minutes: the "
                         f"{o.time_budget:g}-minute budget holds {cfg.n_average} + 1 of them "
                         f"(averaging takes the last {cfg.n_average})")
        if env.is_main:
            run = {"config": cfg.to_dict(), "task": cfg.TASK, "options": asdict(o),
                   "data": str(task.directory), "finetune": self.finetune,
                   "seed": self.seed, "world_size": env.world_size, "batch_tokens": self.batch_tokens,
                   "accum": self.accum, "torch": torch.__version__, "allocator": allocator_in_use()}
            with atomic_write(self.run_dir / "run.json") as f:
                json.dump(run, f, indent=2)

    def _loop(self) -> dict[str, Any]:
        o, env = self.options, self.env
        self._describe()
        stream = BatchStream(self.sampler, partial(self.task.collate, self.cfg), env.device,
                             o.max_epochs)
        self.t_start = _clock()
        last_save_time = self.t_start
        window = LogWindow()
        streak = 0  # consecutive skipped updates
        session_updates = 0  # this session's applied updates
        stopped_by = "max_steps"
        total = self.max_steps if self.max_steps is not None else (
            o.max_epochs * math.ceil(len(self.sampler) / self.accum) if o.max_epochs else None)
        # With no step limit the time budget is the total, counted in seconds of the whole run
        # (the bar's ETA is then the budget's end; steps go into its fields).
        self.bar_in_seconds = total is None and o.time_budget is not None
        if self.bar_in_seconds:
            total = int(o.time_budget * 60)
        bar = Progress(total, initial=int(self.wall_before) if self.bar_in_seconds else self.step,
                       desc="train", unit="s" if self.bar_in_seconds else "step",
                       enabled=o.progress and env.is_main)
        try:
            while self.max_steps is None or self.step < self.max_steps:
                stop, save_due, progress = self._agree(last_save_time, stream.epochs_done)
                if stop:
                    stopped_by = "time_budget"
                    break
                t0 = _clock()
                micro = [b for b in (stream.next() for _ in range(self.accum)) if b is not None]
                window.data_seconds += _clock() - t0
                if not micro:
                    stopped_by = "max_epochs"
                    break
                r = self.updater.update(micro, self.step + 1, cooldown_factor(progress, self.cfg.lr_cooldown))
                dt = _clock() - t0
                self.progress.train_seconds += dt
                self.progress.tgt_tokens += r.tgt_tokens
                self.progress.src_tokens += r.src_tokens
                window.seconds += dt
                if not r.applied:
                    streak = streak + 1 if r.reason != "fp16 overflow" else 0  # fp16: rescaled
                    self._skipped(r, streak)
                    continue
                streak = 0
                self.step += 1
                session_updates += 1
                if session_updates == _WARM_UPDATES:
                    self._timed_from = (self.step, self.progress.train_seconds)
                window.results.append(r)
                if self.bar_in_seconds:
                    bar.moveto(min(int(self._elapsed()), bar.total))
                else:
                    bar.update(1)
                if self.step % o.log_every == 0 or self.step == 1:
                    self._log_train(window, stream.epochs_done, bar)
                    window = LogWindow()
                if not self.warmup_checked and session_updates >= 2 * _WARM_UPDATES:
                    self._check_warmup()
                done = self.max_steps is not None and self.step >= self.max_steps
                if o.eval_every and self.step % o.eval_every == 0 and not done:
                    self._evaluate()
                if (save_due or (self.save_every and self.step % self.save_every == 0)) and not done:
                    self._save()
                    last_save_time = _clock()
        finally:
            bar.close()
        return self._finish(stopped_by, _clock() - self.t_start)

    def _check_warmup(self) -> None:
        """Once, after the first updates are timed: say in one line when the run's limit comes
        before the end of Eq. 3's warmup (the rate would never reach its peak), and what to change."""
        self.warmup_checked = True
        o, warmup = self.options, self.cfg.warmup_steps
        if self.step >= warmup:
            return
        # the pace of the updates after the session's first (those pay kernel selection, the
        # allocator's growth, compiling: on one GPU the first took 6x the later ones' time)
        step0, seconds0 = self._timed_from
        per_update = (self.progress.train_seconds - seconds0) / max(self.step - step0, 1)
        limits = []
        if self.max_steps is not None:
            limits.append((self.max_steps, f"--max-steps {self.max_steps}"))
        if o.time_budget is not None:
            left = o.time_budget * 60 - self._elapsed()
            limits.append((self.step + int(left / per_update),
                           f"the {o.time_budget:g}-minute budget (at {per_update:.2g} s an update)"))
        if limits:
            updates, what = min(limits)
            if updates < warmup:
                self.log.say(f"warning: {what} holds about {updates:,} updates, fewer than "
                             f"warmup_steps={warmup}: the learning rate never reaches its peak "
                             f"(Eq. 3); lower it with --set warmup_steps=N or train longer")

    def _skipped(self, r: UpdateResult, streak: int) -> None:
        self.progress.skipped += 1
        self.log.say(f"warning: skipped update {self.step + 1}: {r.reason} "
                     f"(loss {r.loss:.4g}, grad norm {r.grad_norm:.4g})")
        self.log.record("skip", self.step + 1, reason=r.reason, loss=r.loss, grad_norm=r.grad_norm)
        if streak >= self.options.max_nonfinite:
            raise TrainingDiverged(
                f"the loss was not finite for {streak} updates in a row (at step {self.step}); the "
                f"last checkpoint is kept; try a lower lr_scale, clip_norm, or --precision fp32")

    def _elapsed(self) -> float:
        """Seconds of this run's training so far, earlier sessions of a resumed run included."""
        return self.wall_before + _clock() - self.t_start

    def _agree(self, last_save: float, epochs: float) -> tuple[bool, bool, float]:
        """(stop now, checkpoint due, the run's progress 0..1 towards its nearest limit). Rank 0's
        clock decides the time-based ones; every rank learns the decision."""
        o = self.options
        elapsed = self._elapsed()
        stop = o.time_budget is not None and elapsed >= o.time_budget * 60
        save = (self.save_minutes is not None and _clock() - last_save >= self.save_minutes * 60
                and self.step > 0)
        parts = [0.0]
        if self.max_steps is not None:
            parts.append(self.step / self.max_steps)
        if o.max_epochs is not None:
            parts.append(epochs / o.max_epochs)
        if o.time_budget is not None:
            parts.append(elapsed / (o.time_budget * 60))
        progress = max(parts)
        if self.env.distributed and (o.time_budget is not None or self.save_minutes is not None
                                     or self.cfg.lr_cooldown > 0):
            mine = [float(stop), float(save), progress] if self.env.is_main else [0.0, 0.0, 0.0]
            flags = torch.tensor(mine, dtype=torch.float64, device=self.env.device)
            dist_.all_reduce(flags, self.env, "max")
            stop, save, progress = bool(flags[0]), bool(flags[1]), float(flags[2])
        return stop, save, progress

    def _log_train(self, window: LogWindow, epochs: float, bar) -> None:
        values = {**window.values(), "epoch": epochs, "elapsed": self._elapsed()}
        rss = rss_gb()
        if rss is not None:
            values["rss_gb"] = rss
        self.log.record("train", self.step, **values)
        post = dict(loss=f"{values['loss']:.3f}", lr=f"{values['lr']:.2e}",
                    tok_s=f"{values['tgt_tokens_per_s']:.0f}", ep=f"{epochs:.2f}")
        if self.bar_in_seconds:  # the bar counts seconds: say which update it is at
            post = {"step": self.step, **post}
        if self.options.time_budget is not None:  # the bar's own ETA counts steps, not minutes
            left = max(0.0, self.options.time_budget * 60 - self._elapsed())
            post["left"] = f"{int(left // 60)}:{int(left % 60):02d}"
        bar.set_postfix(post)

    # --- evaluation and checkpoints ----------------------------------------------------------

    def _evaluate(self) -> None:
        """Dev figures on rank 0 (the others go on and wait in the next update's all-reduce);
        keeps RUN_DIR/best up to date by dev NLL."""
        if not self.env.is_main:
            return
        res = self.task.evaluate(self.model, self.cfg, self.batch_tokens, self.env.device,
                                 self.precision.autocast, self.options.eval_bleu_sentences)
        if not res:
            return
        example = res.pop("example", None)
        signature = res.pop("bleu_signature", None)
        record = {"step": self.step, **res}
        self.progress.dev.append(record)
        self.log.record("dev", self.step, **res)
        msg = (f"step {self.step}: dev loss {res['dev_loss']:.4f}, nll {res['dev_nll']:.4f}, "
               f"ppl {res['dev_ppl']:.2f}")
        if "dev_bleu" in res:
            msg += f", BLEU {res['dev_bleu']:.2f} ({res['bleu_sentences']} sentences, greedy)"
        if "dev_f1" in res:
            msg += f", bracket F1 {res['dev_f1']:.2f}"
        self.log.say(msg)
        if example:
            self.log.say(f"  ref: {example['ref']}\n  hyp: {example['hyp']}")
        best = self.progress.best
        if math.isfinite(res["dev_nll"]) and (best is None or res["dev_nll"] < best["dev_nll"]):
            self.progress.best = record
            meta = self._meta({"dev": record, "bleu_signature": signature})
            ckpt.save_best(self.run_dir, self.model.state_dict(), self._writer(meta))

    def _meta(self, extra: dict | None = None) -> dict[str, Any]:
        start = {"init_from": self.started_from} if self.started_from else {}
        return {"step": self.step, **self.task.meta(), **start,
                "epoch": self.sampler.epoch + self.sampler.position / max(len(self.sampler), 1),
                **(extra or {})}

    def _writer(self, meta: dict[str, Any]):
        """`write(directory, weights)`: the model directory's files, by the task."""
        return lambda directory, weights: self.task.write_model(directory, weights, self.cfg, meta)

    def _save(self) -> Path | None:
        """Checkpoint at the current update boundary. Collective: every rank calls it."""
        weights = self.model.state_dict()
        # every rank holds the same weights, so every rank reaches the same verdict
        if not ckpt.all_finite(weights):
            raise TrainingDiverged(f"parameters are not finite at step {self.step}; not writing a "
                                   f"checkpoint (the last one is kept)")
        rng = dist_.gather_to_main({"rng": ckpt.capture_rng(self.env.device)}, self.env)
        self.saved_step = self.step
        self.progress.wall_seconds = self._elapsed()  # a resumed run's budget goes on from here
        path, failed = None, None
        if self.env.is_main:
            try:
                path = self._write_checkpoint(weights, rng)
            except UserError as e:
                failed = e
        # every rank learns whether the write worked, and stops with rank 0's message if not
        message = dist_.broadcast_object(None if failed is None else str(failed), self.env)
        if failed is not None:
            raise failed
        if message is not None:
            raise UserError(message)
        return path

    def _write_checkpoint(self, weights: dict[str, torch.Tensor], rng: list[Any] | None) -> Path:
        state = ckpt.new_trainer_state(
            step=self.step, optimizer=self.optimizer.state_dict(), scaler=self.precision.state_dict(),
            sampler=self.sampler.state_dict(), ranks=rng, progress=asdict(self.progress),
            run={"seed": self.seed, "world_size": self.env.world_size,
                 "batch_tokens": self.batch_tokens, "accum": self.accum,
                 "init_from": self.started_from, "finetune": self.finetune})
        keep = self.options.keep or max(self.cfg.n_average, 1)
        meta = self._meta({"dev": self.progress.dev[-1] if self.progress.dev else None})
        try:
            return ckpt.save_checkpoint(self.run_dir, self.step, weights, self._writer(meta),
                                        state, keep)
        except OutputError as e:  # the write left the previous checkpoint as it was
            kept = ckpt.latest_resumable(self.run_dir)
            then = (f"continue with --resume (from {kept.name}, which is intact)" if kept else
                    "run the command again (no checkpoint was written yet)")
            raise OutputError(e.path, e.reason, e.remedy, then) from None

    def _finish(self, stopped_by: str, wall: float) -> dict[str, Any]:
        dev = self.progress.dev
        if self.step > 0 and (not dev or dev[-1]["step"] != self.step):
            self._evaluate()
        path = None
        if self.step > 0 and self.saved_step != self.step:
            path = self._save()
        elif self.env.is_main and self.step > 0:
            path = ckpt.step_dir(self.run_dir, self.step)
        if not self.env.is_main:
            return {}
        summary = build_summary(
            self.progress, self.task.flops_per_target_token(self.cfg), self.step, stopped_by, self._meta()["epoch"], wall,
            self.options.peak_tflops, self.env.world_size, precision=self.precision.name,
            checkpoint=str(path) if path else None, run_dir=str(self.run_dir))
        with atomic_write(self.run_dir / "summary.json") as f:
            json.dump(summary, f, indent=2, default=str)
        self.log.say(format_summary(summary))
        return summary


def train(cfg: Any | None, data: str | os.PathLike | Task, out_dir: str | os.PathLike,
          options: TrainOptions | None = None) -> dict[str, Any]:
    """Train on `data` (a dataset directory made by `aiayn prepare`, or a `Task`) into `out_dir`;
    returns the summary (on rank 0; {} on other ranks). `cfg` may be None when resuming (the
    checkpoint's config is used); what the data decides (vocabulary sizes) is always taken from
    the data. Under torchrun, each process calls this and the process group is set up (and torn
    down) here. A second run on `out_dir` while this one goes on is refused (an OS lock,
    `aiayn.locks.exclusive_lock`, held by rank 0)."""
    options = options or TrainOptions()
    options.check()
    task = Seq2SeqTask(data, options.dev_split) if isinstance(data, (str, os.PathLike)) else data
    env = dist_.setup(options.device)
    try:
        # one run per directory: rank 0 holds the lock, every rank learns whether it could
        lock = partial(exclusive_lock, out_dir, "aiayn train",
                       "wait for it to finish, or choose another --out")
        with dist_.held_by_main(lock, env):
            return Trainer(cfg, task, out_dir, options, env).run()
    finally:
        if env.owns_group:
            dist_.teardown()
