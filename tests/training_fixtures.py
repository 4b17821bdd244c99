"""Shared fixtures of the training tests (imported by the other test_training_* modules): a tiny
synthetic translation task prepared through `aiayn.data.prepare.prepare_dataset`, and the
model settings that train on it in a fraction of a second."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from dataclasses import replace

from aiayn.config import BASE
from aiayn.data.corpus import ParallelSource
from aiayn.data.dataset import ParallelDataset
from aiayn.data.prepare import PrepareOptions, prepare_dataset

REPO = Path(__file__).resolve().parents[1]
LETTERS = "abcdefghij"
TABLE = str.maketrans(LETTERS, "klmnopqrst")

# A 2+2-layer model of width 64, the tests' base size (build others as deltas of it).
MICRO = replace(BASE, n_layers=2, d_model=64, d_ff=256, n_heads=4, warmup_steps=200, max_tokens=2048,
                max_steps=2000)
# As `--set` overrides: a 1+1-layer model of width 32, whose updates take milliseconds on one thread.
SMALL = ["d_model=32", "d_ff=64", "n_layers=1", "n_heads=4", "warmup_steps=30", "max_tokens=300"]


def pair(rng: random.Random) -> tuple[str, str]:
    """Source: 2-6 words of letters a-j; target: the words in reverse order, letters shifted to
    k-t. Learnable by a tiny model, so the dev loss must fall within a few dozen updates."""
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
             for _ in range(rng.randint(2, 6))]
    return " ".join(words), " ".join(reversed(words)).translate(TABLE)


def tiny_dataset(root: Path, n_train: int = 400, n_valid: int = 40, seed: int = 0, **prepare) -> Path:
    """A prepared dataset directory at root/data: a character vocabulary of 25 ids, or what the
    `PrepareOptions` fields in `prepare` ask for (e.g. model_type="bpe")."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    splits = {}
    for name, n in (("train", n_train), ("valid", n_valid)):
        pairs = [pair(rng) for _ in range(n)]
        (root / f"{name}.xx").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
        (root / f"{name}.yy").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
        splits[name] = ParallelSource(root / f"{name}.xx", root / f"{name}.yy")
    out = root / "data"
    options = {"vocab_size": 25, "model_type": "char", **prepare}
    prepare_dataset(out, splits, PrepareOptions("xx", "yy", **options))
    return out


# Four tiny trees: a chart parser of width 32 learns them by heart in ~150 updates.
TREES = [
    "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))",
    "(S (NP (NNP John)) (VP (VBD ran)))",
    "(SINV (S (VP (VB Go))) (, ,) (VP (VBD said)) (NP (PRP he)) (. .))",
    "(NP (NN Hello))",
]
# As `--set` overrides of `parsing-chart-small`: a chart parser that trains in milliseconds.
SMALL_CHART = ["d_model=32", "d_ff=64", "n_heads=4", "d_span=32", "p_drop=0", "p_word_drop=0",
               "warmup_steps=20", "max_cells=400"]


def tiny_treebank_corpus(root: Path, trees: list[str] = TREES, copies: int = 1) -> Path:
    """A corpus as `aiayn treebank` writes it (SPLIT.words, SPLIT.gold) at root: `trees` (each
    `copies` times) in train, the same trees in valid."""
    from nltk.tree import Tree

    root.mkdir(parents=True, exist_ok=True)
    gold = [Tree.fromstring(t) for t in trees]
    for split, n in (("train", copies), ("valid", 1)):
        (root / f"{split}.words").write_text("".join(" ".join(t.leaves()) + "\n" for t in gold) * n)
        (root / f"{split}.gold").write_text("".join(t.pformat(margin=1 << 30) + "\n" for t in gold) * n)
    return root


def train_until_killed(out: Path, args: list[str], step: int = 10) -> None:
    """`aiayn train --out OUT ARGS` in a fresh process, killed with SIGKILL once the checkpoint of
    `step` is written; asserts that it was killed before it finished."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "train", "--out", str(out), *args],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / "checkpoints" / f"step_{step:06d}").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m aiayn ARGS` in a fresh process, from the repository root."""
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "aiayn", *args], cwd=REPO, env=e, text=True,
                          capture_output=True, timeout=timeout)


def test_tiny_dataset_is_what_the_tests_assume(tmp_path):
    data = tiny_dataset(tmp_path)
    ds = ParallelDataset(data, "train")
    assert len(ds) == 400 and ds.src_tokenizer.vocab_size == 25
    src, tgt = ds.text(0)
    assert tgt == " ".join(reversed(src.split())).translate(TABLE)
    assert ParallelDataset(data, "valid").reference_lines()[0]


def trainer_state(step: int, world_size: int = 1) -> dict:
    """A well-formed trainer state (what `checkpoint.load_trainer_state` accepts), for tests of
    checkpoint files that need no real optimizer."""
    from dataclasses import asdict

    from aiayn.training import checkpoint as ckpt
    from aiayn.training.logs import RunProgress

    return ckpt.new_trainer_state(
        step=step, optimizer={"state": {}, "param_groups": [{"lr": 1.0, "params": [0]}]}, scaler={},
        sampler={"epoch": 0, "position": 0}, ranks=[{"rng": ckpt.capture_rng()}] * world_size,
        progress=asdict(RunProgress()),
        run={"seed": 1, "world_size": world_size, "batch_tokens": 10, "accum": 1})


def dead_pid() -> int:
    """The PID of a process that has ended (what a killed command's temporaries carry)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid
