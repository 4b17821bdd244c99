"""`train(cfg, data_dir, out_dir, options) -> summary`: the training loop of §5 on a prepared
dataset, single-process or under torchrun (DDP), resumable bit for bit from its checkpoints.

Batch size: `Config.max_tokens` is the size of one *update* in tokens per side (§5.1: about 25,000
source and 25,000 target tokens), summed over gradient-accumulation micro-batches and ranks. A
micro-batch holds at most `batch_tokens` tokens per side on one rank; `accum` micro-batches per
rank make an update. Give either (or neither: one micro-batch per update per rank) and the other
follows: accum = ceil(max_tokens / (batch_tokens * world_size)).

Stopping: after `cfg.max_steps` updates (`--max-steps` sets it), or after `max_epochs` passes over
the data, or after `time_budget` minutes, whichever comes first; when an epoch limit or a time
budget is given without a step limit, the step limit is off. Like the step count, the minutes
count the whole run: a resumed run trains for what is left of its budget. With
`Config.lr_cooldown` the rate falls to 0 towards whichever of those limits is nearest
(`schedule.cooldown_factor`; in minutes it depends on the clock, so such a resume is not bit-exact).

What a run writes into RUN_DIR (rank 0 only): checkpoints (see aiayn.training.checkpoint),
run.json (config and options), metrics.jsonl (one JSON record per line: "train", "dev", "skip"
kinds), tb/ (TensorBoard scalars) and summary.json (what `train` returns).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aiayn.config import Config
from aiayn.errors import UserError
from aiayn.io import atomic_write
from aiayn.training import checkpoint as ckpt
from aiayn.training import distributed as dist_
from aiayn.training.average import ARCH_FIELDS
from aiayn.training.logs import RunLog, format_summary
from aiayn.training.stream import BatchStream
from aiayn.training.precision import Precision
from aiayn.training.schedule import build_optimizer, cooldown_factor
from aiayn.training.step import Updater, UpdateResult


class TrainingDiverged(UserError):
    """The loss stayed non-finite for too many updates in a row, or the weights became non-finite."""


@dataclass
class TrainOptions:
    """Everything about a run that is not the model and recipe (`Config`)."""

    max_steps: int | None = None  # sets cfg.max_steps (also on resume)
    max_epochs: int | None = None
    time_budget: float | None = None  # minutes of training, the whole run (evaluation, saving included)
    eval_every: int = 1000  # updates between dev evaluations; 0: only at the end
    eval_bleu_sentences: int = 200  # greedy-decoded dev sentences for BLEU; 0: no BLEU; -1: all
    save_every: int | None = None  # updates between checkpoints
    save_minutes: float | None = 10.0  # minutes between checkpoints (§6.1: 10-minute intervals)
    keep: int | None = None  # newest checkpoints kept; default max(cfg.n_average, 1)
    seed: int | None = None  # weights, dropout and batch order; default 1, on resume the run's
    resume: bool = False
    overwrite: bool = False
    precision: str = "auto"
    # torch.compile the training forward/backward (inductor fuses dropout, residual, LayerNorm and
    # dtype casts). Same mathematics; dropout draws from inductor's RNG, so the random stream
    # differs from eager mode. Costs about a minute of compiling at the start of each process.
    compile: bool = False
    accum: int | None = None  # micro-batches per update per rank
    batch_tokens: int | None = None  # tokens per side in one micro-batch on one rank
    device: str | None = None  # "cpu" or "cuda"; None: CUDA when available
    threads: int | None = None  # torch intra-op threads on CPU
    log_every: int = 10  # updates between "train" records in metrics.jsonl and TensorBoard
    peak_tflops: float | None = None  # per device, for MFU
    max_nonfinite: int = 5  # consecutive skipped (non-finite) updates before giving up
    tensorboard: bool = True
    progress: bool = True
    dev_split: str | None = None  # default: "valid", else the first non-train split

    def check(self) -> None:
        for name in ("max_steps", "max_epochs", "accum", "batch_tokens", "save_every", "keep", "threads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
        for name in ("time_budget", "save_minutes", "peak_tflops"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be > 0, got {v}")
        if self.eval_every < 0 or self.log_every < 1 or self.max_nonfinite < 1:
            raise UserError("--eval-every must be >= 0, --log-every and max_nonfinite >= 1")
        if self.resume and self.overwrite:
            raise UserError("--resume and --overwrite contradict each other; pass one")


def batch_plan(max_tokens: int, world_size: int, accum: int | None, batch_tokens: int | None
               ) -> tuple[int, int]:
    """(micro-batch tokens per rank, micro-batches per update per rank) from the update size
    `max_tokens` and whichever of `accum` / `batch_tokens` is given."""
    if accum is None and batch_tokens is None:
        return math.ceil(max_tokens / world_size), 1
    if accum is None:
        return batch_tokens, max(1, math.ceil(max_tokens / (batch_tokens * world_size)))
    if batch_tokens is None:
        return math.ceil(max_tokens / (accum * world_size)), accum
    return batch_tokens, accum


def _dataset_config(cfg: Config, info: Any) -> Config:
    """Fill in the vocabulary sizes from the dataset's tokenizer(s)."""
    if info.shared_vocab:
        return replace(cfg, vocab_size=info.src_tokenizer.vocab_size, tgt_vocab_size=0)
    return replace(cfg, vocab_size=info.src_tokenizer.vocab_size,
                   tgt_vocab_size=info.tgt_tokenizer.vocab_size, tie_embeddings=False)


def _reconcile(saved: Config, wanted: Config | None, where: Path) -> tuple[Config, list[str]]:
    """On resume: the checkpoint's config, with the caller's non-architecture changes applied
    (e.g. a larger max_steps). Architecture changes are refused."""
    if wanted is None:
        return saved, []
    for f in ARCH_FIELDS:
        if getattr(saved, f) != getattr(wanted, f):
            raise UserError(f"cannot resume {where}: {f} is {getattr(saved, f)!r} in the checkpoint "
                            f"but {getattr(wanted, f)!r} now")
    changed = [f"{k}: {v} -> {getattr(wanted, k)}" for k, v in saved.to_dict().items()
               if getattr(wanted, k) != v]
    return wanted, changed


def _rss_gb() -> float | None:
    """This process's resident memory now, in GB (Linux; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _rank_seed(seed: int, rank: int) -> int:
    """Dropout seed of a rank: independent streams per rank, derived from the run's seed."""
    return int(np.random.SeedSequence([seed, rank, 17]).generate_state(1, np.uint64)[0] >> 1)


class Trainer:
    """One training run. Build it, then `run()`; see the module docstring."""

    def __init__(self, cfg: Config | None, data_dir: str | os.PathLike, out_dir: str | os.PathLike,
                 options: TrainOptions, env: dist_.DistEnv):
        from aiayn.data.batching import TokenBatchSampler
        from aiayn.data.dataset import ParallelDataset, load_dataset_dir
        from aiayn.model.io import load_state_checked, read_config, read_weights, tokenizer_files
        from aiayn.model.transformer import Transformer

        options.check()
        self.options, self.env = options, env
        self.run_dir = Path(out_dir)
        if options.threads:
            torch.set_num_threads(options.threads)
        self.info = load_dataset_dir(data_dir)
        self.tokenizers = tokenizer_files(self.info.directory)
        wanted = _dataset_config(cfg, self.info) if cfg is not None else None
        if wanted is not None and options.max_steps is not None:
            wanted = replace(wanted, max_steps=options.max_steps)

        # --- a new run, or a resumed one --------------------------------------------------------
        resume_from = self._check_run_dir()
        state: dict[str, Any] | None = None
        if resume_from is not None:
            state = ckpt.load_trainer_state(resume_from)
            saved = read_config(resume_from)
            if wanted is None and options.max_steps is not None:
                wanted = replace(saved, max_steps=options.max_steps)
            cfg, changed = _reconcile(saved, wanted, resume_from)
            self.changed = changed
        elif wanted is None:
            raise UserError(f"{self.run_dir} has no checkpoint to resume; give a --preset or --config")
        else:
            cfg, self.changed = wanted, []
        self.cfg: Config = cfg
        self.resume_from = resume_from
        self.state = state

        # --- data: seed and batch layout carry over on resume unless given again ---------------
        run = state["run"] if state is not None else {}
        self.seed = options.seed if options.seed is not None else run.get("seed", 1)
        if state is not None:
            if self.seed != run["seed"]:
                raise UserError(f"cannot resume {resume_from}: it was trained with --seed {run['seed']}, "
                                f"not {self.seed}")
            if run["world_size"] != env.world_size:
                raise UserError(f"cannot resume {resume_from}: it was written by {run['world_size']} "
                                f"process(es), this run has {env.world_size}")
        self.train_set = ParallelDataset(self.info.directory, "train", info=self.info)
        self.dev_set = self._dev_split()
        if state is not None and options.accum is None and options.batch_tokens is None:
            self.batch_tokens, self.accum = run["batch_tokens"], run["accum"]
        else:
            self.batch_tokens, self.accum = batch_plan(cfg.max_tokens, env.world_size, options.accum,
                                                       options.batch_tokens)
        if cfg.p_bpe_drop > 0:
            self.sampler = self._bpe_dropout_sampler()
        else:
            self.sampler = TokenBatchSampler(self.train_set.src_lengths, self.train_set.tgt_lengths,
                                             self.batch_tokens, seed=self.seed, rank=env.rank,
                                             world_size=env.world_size)

        # --- model, optimizer, precision ---------------------------------------------------------
        import random

        random.seed(self.seed)
        np.random.seed(self.seed % 2**32)
        torch.manual_seed(self.seed)  # the same initial weights on every rank
        self.model = Transformer(cfg).to(env.device)
        torch.manual_seed(_rank_seed(self.seed, env.rank))  # dropout streams per rank
        self.precision = Precision(options.precision, env.device)
        self.step = 0  # completed updates
        self.saved_step = -1  # the step of the newest checkpoint (known to every rank)
        self.metrics: dict[str, Any] = {"history": [], "best": None, "tgt_tokens": 0, "src_tokens": 0,
                                        "train_seconds": 0.0, "skipped": 0}
        if state is not None:
            load_state_checked(self.model, read_weights(resume_from), str(resume_from))
        self.optimizer = build_optimizer(self.model.parameters(), cfg)
        if state is not None:
            self._restore(state)
        # what the step runs: the model, or its bf16 working copy (precision bf16-weights); either
        # way evaluation and checkpoints use `self.model`, which holds the float32 weights
        self.ddp = self.precision.training_model(self.model)
        if options.compile:
            # dynamic: batches change shape every step; one graph with symbolic (B, T) instead of a
            # recompile per shape. Evaluation and saving use the eager `self.model` (same weights).
            self.ddp = torch.compile(self.ddp, dynamic=True)
        if env.distributed:
            self.ddp = dist_.wrap_ddp(self.ddp, env)
        self.updater = Updater(self.ddp, self.optimizer, cfg, self.precision, env)

    # --- set-up helpers ----------------------------------------------------------------------

    def _check_run_dir(self) -> Path | None:
        run, o = self.run_dir, self.options
        if run.exists() and not run.is_dir():
            raise UserError(f"{run} exists and is not a directory")
        if o.resume:
            latest = ckpt.latest_resumable(run)
            if latest is not None:
                return latest
            if ckpt.has_run_outputs(run):
                raise UserError(f"--resume: {run} has checkpoints but none with trainer state")
            # nothing written yet (e.g. killed before the first checkpoint): start afresh
        elif ckpt.has_run_outputs(run):
            if not o.overwrite:
                raise UserError(f"{run} already holds checkpoints; pass --resume to continue that run "
                                f"or --overwrite to start over")
            dist_.barrier(self.env)
            if self.env.is_main:
                ckpt.clear_run(run)
            dist_.barrier(self.env)
        return None

    def _bpe_dropout_sampler(self) -> Any:
        """Batches over a new BPE-dropout segmentation of the training text every epoch."""
        from aiayn.data.resegment import Resegmenter, ResegmentingSampler

        opts = self.info.manifest.get("options", {})
        types = {opts.get("model_type"), opts.get("tgt_model_type") or opts.get("model_type")}
        if types != {"bpe"}:
            raise UserError(f"p_bpe_drop={self.cfg.p_bpe_drop} needs a BPE vocabulary; "
                            f"{self.info.directory} was prepared with {' and '.join(sorted(map(str, types)))}")
        reseg = Resegmenter(self.train_set, self.cfg.p_bpe_drop, self.seed,
                            max_pieces=min(int(opts.get("max_len") or 10**9), self.batch_tokens - 1))
        return ResegmentingSampler(reseg, self.batch_tokens, seed=self.seed, rank=self.env.rank,
                                   world_size=self.env.world_size)

    def _dev_split(self) -> Any:
        from aiayn.data.dataset import ParallelDataset

        splits = [s for s in self.info.splits if s != "train"]
        name = self.options.dev_split
        if name is None:
            name = "valid" if "valid" in splits else (splits[0] if splits else None)
        if name is None:
            return None
        if name not in self.info.splits:
            raise UserError(f"{self.info.directory}: no split {name!r} to evaluate on; it has "
                            f"{', '.join(self.info.splits)}")
        return ParallelDataset(self.info.directory, name, info=self.info)

    def _restore(self, state: dict[str, Any]) -> None:
        self.step = self.saved_step = int(state["step"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.load_state_dict(state.get("scaler", {}))
        self.sampler.load_state_dict(state["sampler"])
        self.metrics = state["metrics"]
        ckpt.restore_rng(ckpt.rng_from_state(state["ranks"][self.env.rank]), self.env.device)

    # --- the loop ----------------------------------------------------------------------------

    @property
    def max_steps(self) -> int | None:
        """The step limit: cfg.max_steps, unless only an epoch limit or time budget was given."""
        o = self.options
        if o.max_steps is None and (o.max_epochs is not None or o.time_budget is not None):
            return None
        return self.cfg.max_steps

    def run(self) -> dict[str, Any]:
        o, env = self.options, self.env
        if env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            ckpt.remove_stale_temporaries(self.run_dir)
        self.log = RunLog(self.run_dir, env, o.tensorboard, self.step if self.state else 0)
        try:
            return self._loop()
        finally:
            self.log.close()

    def _describe(self) -> None:
        from aiayn.memory import allocator_in_use
        from aiayn.model.counting import count_parameters

        o, env, cfg = self.options, self.env, self.cfg
        if self.resume_from is not None:
            self.log.say(f"resuming {self.resume_from} at step {self.step}")
            for c in self.changed:
                self.log.say(f"  config change on resume: {c}")
        self.log.say(
            f"training {count_parameters(cfg):,} parameters on {env.world_size} x {env.device.type}, "
            f"{self.precision.name}{', compiled' if o.compile else ''}, {allocator_in_use()}; "
            f"update = {self.accum} x {self.batch_tokens} tokens x {env.world_size} rank(s) "
            f"(target {cfg.max_tokens}); {len(self.sampler)} micro-batches per epoch per rank")
        if cfg.p_bpe_drop > 0:
            pairs, prepared = self.sampler.epoch_data(), self.sampler.resegmenter.prepared
            ratio = (len(pairs.src_ids) + len(pairs.tgt_ids)) / (len(prepared.src_ids) + len(prepared.tgt_ids))
            self.log.say(f"BPE-dropout {cfg.p_bpe_drop}: training text re-segmented every epoch "
                         f"(this epoch {ratio:.2f}x the prepared pieces)")
        if env.is_main:
            run = {"config": cfg.to_dict(), "options": asdict(o), "data": str(self.info.directory),
                   "seed": self.seed, "world_size": env.world_size, "batch_tokens": self.batch_tokens,
                   "accum": self.accum, "torch": torch.__version__}
            with atomic_write(self.run_dir / "run.json") as f:
                json.dump(run, f, indent=2)

    def _loop(self) -> dict[str, Any]:
        from tqdm import tqdm

        o, env = self.options, self.env
        self._describe()
        stream = BatchStream(self.sampler, self.train_set, env.device, o.max_epochs)
        t_start = self._t_start = time.monotonic()
        self._wall_before = float(self.metrics.get("wall_seconds", 0.0))  # earlier sessions of this run
        last_save_time = t_start
        window: list[UpdateResult] = []
        streak = 0
        stopped_by = "max_steps"
        total = self.max_steps if self.max_steps is not None else (
            o.max_epochs * math.ceil(len(self.sampler) / self.accum) if o.max_epochs else None)
        bar = tqdm(total=total, initial=self.step, desc="train", unit="step", file=sys.stderr,
                   disable=not (o.progress and env.is_main), dynamic_ncols=True)
        win_secs, win_tokens = 0.0, 0  # time in updates (batching included) and tokens since the last log
        win_data = 0.0  # of which building batches
        try:
            while True:
                if self.max_steps is not None and self.step >= self.max_steps:
                    break
                flags = self._agree(last_save_time, stream.epochs_done)
                if flags["stop"]:
                    stopped_by = "time_budget"
                    break
                t0 = time.monotonic()
                micro = [b for b in (stream.next() for _ in range(self.accum)) if b is not None]
                win_data += time.monotonic() - t0
                if not micro:
                    stopped_by = "max_epochs"
                    break
                r = self.updater.update(micro, self.step + 1,
                                        cooldown_factor(flags["progress"], self.cfg.lr_cooldown))
                dt = time.monotonic() - t0
                self.metrics["train_seconds"] += dt
                win_secs += dt
                self.metrics["tgt_tokens"] += r.tgt_tokens
                self.metrics["src_tokens"] += r.src_tokens
                if not r.applied:
                    self.metrics["skipped"] += 1
                    counts = r.reason != "fp16 overflow"
                    streak = streak + 1 if counts else 0
                    self.log.say(f"warning: skipped update {self.step + 1}: {r.reason} "
                                 f"(loss {r.loss:.4g}, grad norm {r.grad_norm:.4g})")
                    self.log.record("skip", self.step + 1, reason=r.reason, loss=r.loss,
                                    grad_norm=r.grad_norm)
                    if streak >= o.max_nonfinite:
                        raise TrainingDiverged(
                            f"the loss was not finite for {streak} updates in a row (at step "
                            f"{self.step}); the last checkpoint is kept; try a lower lr_scale, "
                            f"clip_norm, or --precision fp32")
                    continue
                streak = 0
                self.step += 1
                window.append(r)
                win_tokens += r.tgt_tokens
                bar.update(1)
                if self.step % o.log_every == 0 or self.step == 1:
                    self._log_train(window, win_tokens / max(win_secs, 1e-9), stream.epochs_done, bar,
                                    data_share=win_data / max(win_secs, 1e-9))
                    window, win_secs, win_tokens, win_data = [], 0.0, 0, 0.0
                done = self.max_steps is not None and self.step >= self.max_steps
                if o.eval_every and self.step % o.eval_every == 0 and not done:
                    self._evaluate()
                step_due = o.save_every is not None and self.step % o.save_every == 0
                if (step_due or flags["save"]) and not done:
                    self._save()
                    last_save_time = time.monotonic()
        finally:
            bar.close()
        return self._finish(stopped_by, time.monotonic() - t_start)

    def _elapsed(self) -> float:
        """Seconds of this run's training so far, earlier sessions of a resumed run included."""
        return self._wall_before + time.monotonic() - self._t_start

    def _progress(self, elapsed: float, epochs: float) -> float:
        """How far the run is (0 to 1) towards the nearest of its limits: steps, epochs, minutes."""
        o, parts = self.options, [0.0]
        if self.max_steps is not None:
            parts.append(self.step / self.max_steps)
        if o.max_epochs is not None:
            parts.append(epochs / o.max_epochs)
        if o.time_budget is not None:
            parts.append(elapsed / (o.time_budget * 60))
        return max(parts)

    def _agree(self, last_save: float, epochs: float) -> dict[str, Any]:
        """Rank 0's clock decides time-based stops, saves and the run's progress (which sets the
        cooldown's rate); every rank learns the decision."""
        o = self.options
        elapsed = self._elapsed()
        stop = o.time_budget is not None and elapsed >= o.time_budget * 60
        save = (o.save_minutes is not None and time.monotonic() - last_save >= o.save_minutes * 60
                and self.step > 0)
        progress = self._progress(elapsed, epochs)
        if self.env.distributed and (o.time_budget is not None or o.save_minutes is not None
                                     or self.cfg.lr_cooldown > 0):
            mine = [float(stop), float(save), progress] if self.env.is_main else [0.0, 0.0, 0.0]
            flags = torch.tensor(mine, dtype=torch.float64, device=self.env.device)
            dist_.all_reduce(flags, self.env, "max")
            stop, save, progress = bool(flags[0]), bool(flags[1]), float(flags[2])
        return {"stop": stop, "save": save, "progress": progress}

    def _log_train(self, window: list[UpdateResult], tok_per_s: float, epochs: float, bar,
                   data_share: float) -> None:
        n = sum(r.tgt_tokens for r in window)
        loss = sum(r.loss * r.tgt_tokens for r in window) / max(n, 1)
        nll = sum(r.nll * r.tgt_tokens for r in window) / max(n, 1)
        last = window[-1]
        values = {"loss": loss, "nll": nll, "ppl": math.exp(min(nll, 700)), "lr": last.lr,
                  "grad_norm": last.grad_norm, "tgt_tokens_per_s": tok_per_s, "epoch": epochs,
                  # where the time and memory go: seconds since this process started training,
                  # the share of update time spent building batches, resident memory
                  "elapsed": self._elapsed(), "data_share": data_share}
        rss = _rss_gb()
        if rss is not None:
            values["rss_gb"] = rss
        self.log.record("train", self.step, **values)
        post = dict(loss=f"{loss:.3f}", lr=f"{last.lr:.2e}", tok_s=f"{tok_per_s:.0f}", ep=f"{epochs:.2f}")
        if self.options.time_budget is not None:  # the bar's own ETA counts steps, not minutes
            left = max(0.0, self.options.time_budget * 60 - self._elapsed())
            post["left"] = f"{int(left // 60)}:{int(left % 60):02d}"
        bar.set_postfix(post, refresh=False)

    # --- evaluation and checkpoints ----------------------------------------------------------

    def _evaluate(self) -> dict[str, Any]:
        """Dev figures on rank 0 (others go on and wait in the next update's all-reduce); keeps
        RUN_DIR/best up to date by dev NLL."""
        if not self.env.is_main or self.dev_set is None:
            return {}
        from aiayn.training.evaluate import evaluate

        res = evaluate(self.model, self.dev_set, self.batch_tokens, self.cfg.eps_ls,
                       self.options.eval_bleu_sentences, self.env.device, self.precision.autocast)
        if not res:
            return {}
        example = res.pop("example", None)
        signature = res.pop("bleu_signature", None)
        record = {"step": self.step, **res}
        self.metrics["history"].append(record)
        self.log.record("dev", self.step, **res)
        msg = (f"step {self.step}: dev loss {res['dev_loss']:.4f}, nll {res['dev_nll']:.4f}, "
               f"ppl {res['dev_ppl']:.2f}")
        if "dev_bleu" in res:
            msg += f", BLEU {res['dev_bleu']:.2f} ({res['bleu_sentences']} sentences, greedy)"
        self.log.say(msg)
        if example:
            self.log.say(f"  ref: {example['ref']}\n  hyp: {example['hyp']}")
        best = self.metrics["best"]
        if math.isfinite(res["dev_nll"]) and (best is None or res["dev_nll"] < best["dev_nll"]):
            self.metrics["best"] = record
            meta = self._meta({"dev": record, "bleu_signature": signature})
            ckpt.save_best(self.run_dir, self.model.state_dict(), self.cfg, self.tokenizers, meta)
        return record

    def _meta(self, extra: dict | None = None) -> dict[str, Any]:
        m = self.info.manifest
        return {"step": self.step, "src_lang": m.get("src_lang"), "tgt_lang": m.get("tgt_lang"),
                "dataset": str(self.info.directory), "dataset_fingerprint": m.get("fingerprint"),
                "epoch": self.sampler.epoch + self.sampler.position / max(len(self.sampler), 1),
                **(extra or {})}

    def _save(self) -> Path | None:
        """Checkpoint at the current update boundary. Collective: every rank calls it."""
        weights = self.model.state_dict()
        # every rank holds the same weights, so every rank reaches the same verdict
        if not ckpt.all_finite(weights):
            raise TrainingDiverged(f"parameters are not finite at step {self.step}; not writing a "
                                   f"checkpoint (the last one is kept)")
        rng = dist_.gather_to_main({"rng": ckpt.capture_rng(self.env.device)}, self.env)
        self.saved_step = self.step
        self.metrics["wall_seconds"] = self._elapsed()  # a resumed run's budget goes on from here
        if not self.env.is_main:
            return None
        state = ckpt.new_trainer_state(
            step=self.step, optimizer=self.optimizer.state_dict(), scaler=self.precision.state_dict(),
            sampler=self.sampler.state_dict(), ranks=rng, metrics=self.metrics,
            run={"seed": self.seed, "world_size": self.env.world_size,
                 "batch_tokens": self.batch_tokens, "accum": self.accum})
        keep = self.options.keep or max(self.cfg.n_average, 1)
        history = self.metrics["history"]
        meta = self._meta({"dev": history[-1] if history else None})
        return ckpt.save_checkpoint(self.run_dir, self.step, weights, self.cfg, self.tokenizers,
                                    meta, state, keep)

    def _finish(self, stopped_by: str, wall: float) -> dict[str, Any]:
        from aiayn.model.counting import flops_per_target_token

        last_eval = self.metrics["history"][-1] if self.metrics["history"] else None
        if self.step > 0 and (last_eval is None or last_eval["step"] != self.step):
            self._evaluate()
        path = None
        if self.step > 0 and self.saved_step != self.step:
            path = self._save()
        elif self.env.is_main and self.step > 0:
            path = ckpt.step_dir(self.run_dir, self.step)
        summary: dict[str, Any] = {}
        if self.env.is_main:
            split = self.info.manifest["splits"]["train"]
            pairs = max(split["pairs"], 1)
            src_len = split["src_tokens"] / pairs + 1  # + EOS
            tgt_len = split["tgt_tokens"] / pairs + 1
            per_tok = flops_per_target_token(self.cfg, src_len, tgt_len)
            flops = per_tok * self.metrics["tgt_tokens"]
            secs = max(self.metrics["train_seconds"], 1e-9)
            tflops = flops / secs / 1e12
            peak = self.options.peak_tflops
            summary = {
                "steps": self.step, "stopped_by": stopped_by, "epochs": self._meta()["epoch"],
                "wall_seconds_this_session": wall, "train_seconds": self.metrics["train_seconds"],
                "tgt_tokens": self.metrics["tgt_tokens"], "src_tokens": self.metrics["src_tokens"],
                "tgt_tokens_per_s": self.metrics["tgt_tokens"] / secs,
                "flops_per_target_token": per_tok, "train_flops": flops,
                "achieved_tflops": tflops,
                "mfu": tflops / (peak * self.env.world_size) if peak else None,
                "skipped_updates": self.metrics["skipped"],
                "final_dev": self.metrics["history"][-1] if self.metrics["history"] else None,
                "best_dev": self.metrics["best"],
                "checkpoint": str(path) if path else None, "run_dir": str(self.run_dir),
                "world_size": self.env.world_size, "precision": self.precision.name,
            }
            with atomic_write(self.run_dir / "summary.json") as f:
                json.dump(summary, f, indent=2, default=str)
            self.log.say(format_summary(summary))
        return summary


def train(cfg: Config | None, data_dir: str | os.PathLike, out_dir: str | os.PathLike,
          options: TrainOptions | None = None) -> dict[str, Any]:
    """Train on the prepared dataset `data_dir` into `out_dir`; returns the summary (on rank 0;
    {} on other ranks). `cfg` may be None when resuming (the checkpoint's config is used);
    its vocabulary sizes are always taken from the dataset. Under torchrun, each process calls
    this and the process group is set up (and torn down) here."""
    options = options or TrainOptions()
    options.check()
    env = dist_.setup(options.device)
    try:
        return Trainer(cfg, data_dir, out_dir, options, env).run()
    finally:
        if env.owns_group:
            dist_.teardown()
