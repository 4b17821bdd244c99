"""Data parallelism: two CPU processes (gloo), launched the way torchrun launches them, train to
the same weights as one process that accumulates the same global batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from aiayn.cli import main as cli_main
from aiayn.data.batching import TokenBatchSampler
from aiayn.data.dataset import ParallelDataset
from aiayn.training.checkpoint import TRAINER_STATE, list_checkpoints

from helpers import REPO, SMALL, free_port, tiny_dataset

BATCH_TOKENS = 120  # 46 batches an epoch: 23 a rank, so update 12 straddles two epochs


def run_both(tmp_path, precision: str):
    """The same 12 updates by two processes (2 micro-batches each) and by one (4 micro-batches)."""
    data = tiny_dataset(tmp_path / "tiny")
    ds = ParallelDataset(data, "train")
    n_batches = len(TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, BATCH_TOKENS, seed=1).epoch_batches())
    # with an even batch count both layouts cut the same batches, so that rank r's k-th batch in
    # an update is the single process's (2k + r)-th
    assert n_batches % 2 == 0

    # p_drop 0: ranks draw different dropout masks than one process would. A larger Adam eps
    # keeps Adam's near-sign first steps from magnifying float rounding in near-zero gradients.
    common = ["--data", str(data), "--preset", "base", "--set", *SMALL, "p_drop=0", "adam_eps=1e-4",
              "--max-steps", "12", "--batch-tokens", str(BATCH_TOKENS), "--save-every", "5",
              "--eval-every", "6", "--eval-bleu-sentences", "2", "--threads", "1", "--precision", precision,
              "--no-tensorboard", "--no-progress", "--save-minutes", "1000"]
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "RANK": str(rank),
               "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "aiayn", "train", "--out", str(tmp_path / "ddp"), "--accum", "2",
             "--device", "cpu", *common],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]

    torch_threads = torch.get_num_threads()
    try:
        assert cli_main(["train", "--out", str(tmp_path / "one"), "--accum", "4", *common]) == 0
    finally:
        torch.set_num_threads(torch_threads)
    return tmp_path / "ddp", tmp_path / "one", outs


def losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"train"' in line]


@pytest.mark.slow
def test_two_processes_equal_one_process_accumulating(tmp_path):
    ddp, one, outs = run_both(tmp_path, "fp32")
    assert "dev loss" in outs[0][1] and "done:" in outs[0][1]
    assert "dev loss" not in outs[1][1] and "done:" not in outs[1][1]  # only rank 0 reports
    assert [s for s, _ in list_checkpoints(ddp)] == [s for s, _ in list_checkpoints(one)] == [5, 10, 12]
    state = torch.load(ddp / "last" / TRAINER_STATE, weights_only=True)
    assert state["run"]["world_size"] == 2 and len(state["ranks"]) == 2  # every rank's RNG state
    a = load_file(str(ddp / "last" / "model.safetensors"))
    b = load_file(str(one / "last" / "model.safetensors"))
    init = load_file(str(ddp / "checkpoints" / "step_000005" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5, msg=k)
    assert any(not torch.equal(a[k], init[k]) for k in a)  # it did train
    # the loss normalisation saw the same global batches: same per-token losses logged
    assert losses(ddp) == pytest.approx(losses(one), rel=1e-5)
