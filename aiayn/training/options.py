"""`TrainOptions`: everything about a training run that is not the model and recipe (`Config`):
how long, how often to evaluate and save, resuming, precision, devices, logging. `aiayn train`
fills each field from its option of the same name (`train_options` in aiayn/commands/train.py; an
option not given leaves the default here), and derives `fit_saves_to_budget`, `set_fields`,
`tensorboard` and `progress` from others: a new field needs an option of its name, or a line there."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.errors import UserError


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
    # When the time budget holds fewer than n_average + 1 checkpoints at `save_minutes`, save every
    # budget / (n_average + 1) minutes instead, so that averaging finds its checkpoints (what
    # `aiayn train` does when --save-minutes is not given).
    fit_saves_to_budget: bool = False
    keep: int | None = None  # newest checkpoints kept; default max(cfg.n_average, 1)
    seed: int | None = None  # weights, dropout and batch order; default 1, on resume the run's
    resume: bool = False
    # Start a new run from the weights of this model directory (an averaged model or a
    # checkpoint): same architecture and vocabulary, a fresh optimizer and learning-rate
    # schedule (Eq. 3's warmup again; warmup_steps and lr_scale as the config says). Fine-tuning,
    # domain adaptation. A resumed run continues from its own checkpoint instead.
    init_from: str | None = None
    # Config fields the user gave (`--set`, `--config`'s keys): the fine-tuning defaults of
    # --init-from (aiayn/training/finetune.py) never replace them, on a new run or a resumed one.
    set_fields: tuple[str, ...] = ()
    overwrite: bool = False
    precision: str = "auto"
    # torch.compile each encoder and decoder layer (`step.compile_for_training`: inductor fuses
    # dropout, residual, LayerNorm and dtype casts). Same mathematics; dropout draws from
    # inductor's RNG, so the random stream differs from eager mode. Costs about a minute of
    # compiling at the start of each process.
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
