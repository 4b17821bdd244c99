"""Training (§5): the paper's optimisation recipe, checkpoints, averaging and data parallelism.

- `loss`        label-smoothed cross-entropy (§5.4) with the plain NLL beside it;
- `schedule`    the learning rate of Eq. 3 and Adam(0.9, 0.98, 1e-9) (§5.3);
- `precision`   fp32 / bf16 autocast / fp16 with loss scaling;
- `distributed` torchrun / DDP set-up and the few collectives the trainer needs;
- `step`        one optimizer update: accumulation, normalisation by target tokens, clipping,
                skipping non-finite updates;
- `checkpoint`  model directories plus trainer state, written atomically, resumable bit for bit;
- `average`     checkpoint averaging (§6.1);
- `finetune`    what a run from a model's weights (`--init-from`) changes in its recipe;
- `evaluate`    dev loss, perplexity and greedy-decoding BLEU;
- `stream`      the sampler's batches as one endless stream of tensors on the device;
- `logs`        metrics.jsonl, TensorBoard, the final summary;
- `trainer`     `train(cfg, data_dir, out_dir, options) -> summary`, what `aiayn train` runs.

Import from the submodules; this package imports nothing so that importing it stays cheap.
"""

# `--precision` values (aiayn/training/precision.py), here so that the CLI need not import torch
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
