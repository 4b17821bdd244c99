"""Kill aiayn's commands with SIGKILL at random moments and check that nothing is lost.

For each command (train; train-chart, `aiayn train` of the chart parser on a treebank corpus;
prepare, average, translate) one uninterrupted reference run, then N
trials on tiny fixtures. A trial starts the command in a fresh process and kills it (SIGKILL),
alternately at a uniformly random moment of the reference run's duration and just as the command
starts writing its output (the moment a temporary appears). A kill that comes after the command
has finished tests nothing: that command must have left the complete output and nothing else, and
the trial starts it again with an earlier kill (an earlier write, or a random moment before the
finish it saw), up to ATTEMPTS times. Then it checks:

1. right after the kill, nothing is lost or torn: the output is absent (a fresh output), the
   previous one (half of the trials replace an existing output), or the complete new one; every
   checkpoint a killed training run lists loads and equals the reference run's at that step;
2. after a rerun (train: `--resume`; the others: the same command with `--overwrite`) the result
   is the reference's exactly (train: bit-identical final weights; prepare: identical arrays,
   vocabulary and manifest; average: identical model files; translate: identical text);
3. no temporary and no lock file is left behind.

Prints a tally per command (kills, those that hit a live process, those that came after the
finish) and exits 1 if any trial failed. The documented run
(docs/experiments/chaos.md):

    .venv/bin/python tools/chaos.py --trials 50
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test suite's fixtures, at the documented sizes
sys.path.insert(0, str(REPO / "benchmarks"))  # provenance: the CPU and the commit, as benchmarks say them

from aiayn.files import is_temporary  # noqa: E402

from helpers import SMALL, SMALL_CHART, pair, tiny_treebank_corpus  # noqa: E402
from provenance import commit, cpu_names  # noqa: E402

COMMANDS = ("train", "train-chart", "prepare", "average", "translate")
TRAINS = ("train", "train-chart")  # the training runs: killed, resumed, compared step by step
ATTEMPTS = 4  # starts of a trial's command, each killed earlier than the last, until one is live


@dataclass
class Sizes:
    """Fixture sizes: the documented run's, or the quick ones the test suite uses."""

    train_steps: int = 40
    corpus_pairs: int = 3000
    translate_lines: int = 200

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(train_steps=12, corpus_pairs=400, translate_lines=30)


@dataclass
class Tally:
    trials: int = 0
    ok: int = 0
    kills: int = 0  # kills sent or due, retries included
    live: int = 0  # kills that hit a live process
    killed_while_writing: int = 0  # a temporary of the output existed at the kill
    finished_before_kill: int = 0  # kills due after the command had finished (then retried)
    failures: list[str] = field(default_factory=list)

    def count(self, result: "KillResult") -> None:
        self.kills += 1
        self.live += not result.finished
        self.finished_before_kill += result.finished
        self.killed_while_writing += result.writing


@dataclass
class Kill:
    """When to kill: `delay` seconds after the start, or, with `at_write` = k > 0, `extra` seconds
    after the k-th temporary appears (`delay` is then only a deadline)."""

    delay: float
    at_write: int = 0
    extra: float = 0.0


@dataclass
class KillResult:
    finished: bool  # the command finished before its kill
    writing: bool  # a temporary of the output existed at the kill
    seen: int  # distinct temporaries seen (watched for at-write kills only)
    elapsed: float  # seconds from the start to the kill, or to the finish


def earlier(kill: Kill, result: KillResult, rng: random.Random) -> Kill:
    """A kill before the moment the command finished in `result`: at the last write it was seen to
    start, or, with none earlier than `kill`'s, at a random moment of the run it was seen to make."""
    if kill.at_write > 1 and result.seen:
        return Kill(kill.delay, min(kill.at_write - 1, result.seen))
    return Kill(result.elapsed * rng.uniform(0.2, 0.8))


def aiayn(*args: str) -> list[str]:
    return [sys.executable, "-m", "aiayn", *args]


ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "AIAYN_ALLOCATOR": "system"}


def run(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    return r, time.monotonic() - t0


def check_ok(r: subprocess.CompletedProcess, what: str) -> str | None:
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"{what} exited {r.returncode}: {tail}"
    return None


def temporaries(*dirs: Path) -> list[Path]:
    found = []
    for d in dirs:
        if d.is_dir():
            # .NAME.partial: prepare's resumable work directory, a temporary as far as a kill goes
            found += [p for p in d.iterdir() if is_temporary(p.name) or p.name.endswith((".tmp", ".partial"))]
    return found


def leftovers(*dirs: Path) -> list[Path]:
    """Temporaries and lock files (a lock file is deleted by its holder on release)."""
    return temporaries(*dirs) + [p for d in dirs if d.is_dir() for p in d.iterdir()
                                 if p.name.endswith(".lock")]


def first_kill(rng: random.Random, at_write: int, duration: float) -> Kill:
    """A trial's kill: at a random moment of `duration` seconds, or, with `at_write` = k > 0, in
    the first 20 ms of the k-th write (waiting for it at most 3 durations and 30 s)."""
    if at_write:
        return Kill(duration * 3 + 30, at_write, rng.uniform(0, 0.02))
    return Kill(rng.uniform(0, duration))


def kill_at(argv: list[str], kill: Kill, watch: list[Path]) -> KillResult:
    """Start `argv` and SIGKILL it as `kill` says, watching the `watch` directories for
    temporaries."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = t0 + kill.delay
    seen: set[str] = set()
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if kill.at_write:
                seen.update(p.name for p in temporaries(*watch))
                if len(seen) >= kill.at_write:
                    time.sleep(kill.extra)
                    break
            time.sleep(0.001)
        finished = proc.poll() is not None
        elapsed = time.monotonic() - t0
        writing = bool(temporaries(*watch))
        if not finished:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    return KillResult(finished, writing and not finished, len(seen), elapsed)


def delete(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def digest(path: Path) -> str | None:
    """sha256 of a file, or of a directory's files (names and bytes; a manifest's creation time
    left out); None when absent."""
    if not path.exists():
        return None
    h = hashlib.sha256()
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    for f in files:
        data = f.read_bytes()
        if f.name == "manifest.json":
            m = json.loads(data)
            m.pop("created", None)
            data = json.dumps(m, sort_keys=True).encode()
        h.update(f.name.encode() + b"\0" + data)
    return h.hexdigest()


# --- fixtures ------------------------------------------------------------------------------------

def write_corpus(root: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    pairs = [pair(rng) for _ in range(n)]
    (root / "c.xx").write_text("".join(p[0] + "\n" for p in pairs), encoding="utf-8")
    (root / "c.yy").write_text("".join(p[1] + "\n" for p in pairs), encoding="utf-8")
    return root / "c"


class Fixtures:
    """Corpora, a prepared dataset and a finished reference training run, built once."""

    def __init__(self, root: Path, sizes: Sizes):
        self.root, self.sizes = root, sizes
        for name, n, seed in (("train", sizes.corpus_pairs, 0), ("valid", 60, 1), ("old", 300, 2)):
            (root / name).mkdir(parents=True)
            write_corpus(root / name, n, seed)
        self.prepare_args = ["--src-lang", "xx", "--tgt-lang", "yy", "--train", str(root / "train/c"),
                             "--valid", str(root / "valid/c"), "--model-type", "bpe",
                             "--vocab-size", "320"]
        self.data = root / "data"
        r, _ = run(aiayn("prepare", *self.prepare_args, "--out", str(self.data)))
        assert r.returncode == 0, r.stderr
        self.corpus = tiny_treebank_corpus(root / "corpus", copies=8)
        lines = (root / "valid/c.xx").read_text(encoding="utf-8").splitlines()
        self.src = root / "src.txt"
        self.src.write_text("\n".join((lines * 10)[: sizes.translate_lines]) + "\n", encoding="utf-8")
        self._refs: dict[str, tuple[Path, float]] = {}

    def train_args(self, kind: str = "train") -> list[str]:
        common = ["--max-steps", str(self.sizes.train_steps), "--save-every", "3", "--eval-every", "4",
                  "--threads", "1", "--no-tensorboard", "--no-progress", "--seed", "3",
                  "--save-minutes", "1000"]
        if kind == "train-chart":  # dropout on: the resumed run must draw the same masks
            return ["--data", str(self.corpus), "--preset", "parsing-chart-small", "--set",
                    *SMALL_CHART, "p_drop=0.2", "p_word_drop=0.1", *common]
        return ["--data", str(self.data), "--preset", "base", "--set", *SMALL,
                "--eval-bleu-sentences", "2", *common]

    def train_ref(self, kind: str = "train") -> tuple[Path, float]:
        """The reference run of `kind` (made once; it keeps every checkpoint, to compare a killed
        run's step by step) and its duration."""
        if kind not in self._refs:
            ref = self.root / f"{kind}-ref"
            r, seconds = run(aiayn("train", *self.train_args(kind), "--keep", "1000", "--out", str(ref)))
            assert r.returncode == 0, r.stderr
            self._refs[kind] = (ref, seconds)
        return self._refs[kind]


# --- one scenario per command ---------------------------------------------------------------------

@dataclass
class Scenario:
    """How to run a command into `out`, what an older output there looks like, and how to check
    an output (a problem, or None)."""

    argv: Callable[[Path, bool], list[str]]  # (out, overwrite) -> command line
    make_old: Callable[[Path], None]  # writes a previous, different output at `out`
    check: Callable[[Path], str | None]  # the output at `out` is whole and loads
    out_name: str
    old: Path | None = None  # that previous output, made once and copied into each trial

    def put_old(self, out: Path, cache: Path) -> None:
        if self.old is None:
            cache.mkdir(parents=True, exist_ok=True)
            self.make_old(cache / self.out_name)
            self.old = cache / self.out_name
        if self.old.is_dir():
            shutil.copytree(self.old, out)
        else:
            shutil.copy2(self.old, out)


def model_check(out: Path) -> str | None:
    from aiayn.data.model_dir import load_model
    from aiayn.parsing.chart.files import is_chart_model, load_chart

    try:
        (load_chart if is_chart_model(out) else load_model)(out)
    except Exception as e:  # noqa: BLE001 - any failure to load is what we report
        return f"{out} does not load: {e}"
    return None


def dataset_check(out: Path) -> str | None:
    from aiayn.data.dataset import load_dataset_dir

    try:
        info = load_dataset_dir(out)
        for split in info.splits:
            info.split(split)
    except Exception as e:  # noqa: BLE001
        return f"{out} does not load: {e}"
    return None


def scenarios(fx: Fixtures) -> dict[str, Scenario]:
    ref, _ = fx.train_ref()

    def prepare_argv(out: Path, overwrite: bool) -> list[str]:
        return aiayn("prepare", *fx.prepare_args, "--out", str(out), *(["--overwrite"] * overwrite))

    def prepare_old(out: Path) -> None:
        args = [*fx.prepare_args, "--out", str(out)]
        args[args.index("--train") + 1] = str(fx.root / "old/c")
        r, _ = run(aiayn("prepare", *args))
        assert r.returncode == 0, r.stderr

    def average_argv(out: Path, overwrite: bool) -> list[str]:
        return aiayn("average", "--run", str(ref), "--last", "3", "--out", str(out),
                     *(["--overwrite"] * overwrite))

    def average_old(out: Path) -> None:
        r, _ = run(aiayn("average", "--run", str(ref), "--last", "1", "--out", str(out)))
        assert r.returncode == 0, r.stderr

    def translate_argv(out: Path, overwrite: bool) -> list[str]:
        return aiayn("translate", "--model", str(ref / "last"), "--input", str(fx.src),
                     "--output", str(out), *(["--overwrite"] * overwrite))

    def translate_old(out: Path) -> None:
        out.write_text("an older translation\n", encoding="utf-8")

    def translate_check(out: Path) -> str | None:
        n = len(out.read_text(encoding="utf-8").splitlines())
        want = len(fx.src.read_text(encoding="utf-8").splitlines())
        return None if n == want else f"{out} has {n} lines, expected {want}"

    return {
        "prepare": Scenario(prepare_argv, prepare_old, dataset_check, "data"),
        "average": Scenario(average_argv, average_old, model_check, "avg"),
        "translate": Scenario(translate_argv, translate_old, translate_check, "out.txt"),
    }


def file_trial(sc: Scenario, trial_dir: Path, rng: random.Random, at_write: bool, replace: bool,
               duration: float, reference: str, cache: Path, tally: Tally) -> str | None:
    """One trial of prepare, average or translate; a problem, or None. `cache`: where the previous
    output that half the trials replace is made once."""
    out = trial_dir / sc.out_name
    old = None
    kill = first_kill(rng, int(at_write), duration)
    for _ in range(ATTEMPTS):
        if replace:
            sc.put_old(out, cache)
            old = digest(out)
        result = kill_at(sc.argv(out, replace), kill, [trial_dir])
        tally.count(result)
        if not result.finished:
            break
        # finished before its kill: whole and clean, then again with an earlier kill
        if digest(out) != reference:
            return "WRONG: a run that finished before its kill left another output"
        if left := leftovers(trial_dir):
            return f"LEFTOVER after a run that finished: {', '.join(p.name for p in left)}"
        delete(out)
        kill = earlier(kill, result, rng)
    now = digest(out)
    if now is None and replace:
        return "LOST: the previous output is gone after the kill"
    if now is not None and now not in (old, reference):
        return f"TORN: after the kill the output is neither the old one nor the new one ({sc.check(out)})"
    if now == reference and (problem := sc.check(out)):
        return problem
    r, _ = run(sc.argv(out, True))
    if problem := check_ok(r, "the rerun"):
        return problem
    if digest(out) != reference:
        return "WRONG: the rerun's output differs from the reference"
    if left := leftovers(trial_dir):
        return f"LEFTOVER: {', '.join(p.name for p in left)}"
    return None


def train_trial(fx: Fixtures, kind: str, trial_dir: Path, rng: random.Random, at_write: bool,
                tally: Tally) -> str | None:
    """One trial of a training run (`kind`: train or train-chart): kill, check every checkpoint
    left, resume, compare with the reference."""
    from safetensors.torch import load_file

    from aiayn.training.checkpoint import latest_resumable, list_checkpoints, load_trainer_state

    run_dir = trial_dir / "run"
    reference, seconds = fx.train_ref(kind)
    argv = aiayn("train", *fx.train_args(kind), "--keep", "3", "--out", str(run_dir))
    # at a write: the k-th of the run's writes (run.json, checkpoints, best/, summary.json)
    nth = rng.randint(1, 2 + 2 * fx.sizes.train_steps // 3) if at_write else 0
    kill = first_kill(rng, nth, seconds)
    watch = [trial_dir, run_dir, run_dir / "checkpoints"]
    for _ in range(ATTEMPTS):
        result = kill_at(argv, kill, watch)
        tally.count(result)
        if not result.finished:
            break
        # finished before its kill: clean, then again from scratch with an earlier kill
        if left := leftovers(*watch):
            return f"LEFTOVER after a run that finished: {', '.join(p.name for p in left)}"
        shutil.rmtree(run_dir)
        kill = earlier(kill, result, rng)
    ref = dict(list_checkpoints(reference))
    for step, d in list_checkpoints(run_dir):
        if problem := model_check(d):
            return f"TORN: checkpoint {d.name}: {problem}"
        a, b = load_file(str(d / "model.safetensors")), load_file(str(ref[step] / "model.safetensors"))
        if any(not (a[k] == b[k]).all() for k in b):
            return f"WRONG: checkpoint {d.name} differs from the reference's"
    if (run_dir / "best").exists() and (problem := model_check(run_dir / "best")):
        return f"TORN: best: {problem}"
    if (latest := latest_resumable(run_dir)) is not None:
        try:
            load_trainer_state(latest)
        except Exception as e:  # noqa: BLE001
            return f"TORN: {latest.name}/trainer_state.pt: {e}"
    r, _ = run(aiayn("train", *fx.train_args(kind), "--keep", "3", "--out", str(run_dir), "--resume"))
    if problem := check_ok(r, "the resumed run"):
        return problem
    a = load_file(str(run_dir / "last" / "model.safetensors"))
    b = load_file(str(reference / "last" / "model.safetensors"))
    if a.keys() != b.keys() or any(not (a[k] == b[k]).all() for k in b):
        return "WRONG: the resumed run's final weights differ from the uninterrupted run's"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"train"' in line]
    if steps != sorted(set(steps)):
        return "WRONG: metrics.jsonl repeats or reorders steps"
    if left := leftovers(trial_dir, run_dir, run_dir / "checkpoints"):
        return f"LEFTOVER: {', '.join(p.name for p in left)}"
    return None


def chaos(commands: list[str], trials: int, seed: int = 0, quick: bool = False,
          workdir: Path | None = None, log: Callable[[str], None] = print) -> dict[str, Tally]:
    """Run `trials` kill trials of each command; the tallies by command."""
    root = Path(tempfile.mkdtemp(prefix="aiayn-chaos-", dir=workdir))
    rng = random.Random(seed)
    tallies = {c: Tally() for c in commands}
    try:
        fx = Fixtures(root / "fixtures", Sizes.quick() if quick else Sizes())
        scs = scenarios(fx)
        for command in commands:
            tally = tallies[command]
            if command in TRAINS:
                reference, duration = None, 0.0
            else:  # the uninterrupted reference output and its duration
                ref_out = root / f"{command}-ref" / scs[command].out_name
                ref_out.parent.mkdir()
                r, duration = run(scs[command].argv(ref_out, False))
                assert r.returncode == 0, r.stderr
                reference = digest(ref_out)
            for i in range(trials):
                trial_dir = root / f"{command}-{i}"
                trial_dir.mkdir()
                at_write = i % 2 == 1
                if command in TRAINS:
                    problem = train_trial(fx, command, trial_dir, rng, at_write, tally)
                else:
                    problem = file_trial(scs[command], trial_dir, rng, at_write, i % 4 in (1, 2),
                                         duration, reference, root / f"{command}-old", tally)
                tally.trials += 1
                if problem is None:
                    tally.ok += 1
                    shutil.rmtree(trial_dir, ignore_errors=True)
                else:
                    tally.failures.append(f"trial {i}: {problem} (kept in {trial_dir})")
                    log(f"{command} trial {i}: {problem}")
            log(f"{command}: {tally.ok}/{tally.trials} ok")
    finally:
        if all(not t.failures for t in tallies.values()):
            shutil.rmtree(root, ignore_errors=True)
    return tallies


def format_tallies(tallies: dict[str, Tally]) -> str:
    lines = ["| command | trials | ok | kills | hit a live process | killed while writing | "
             "finished before the kill | failures |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for c, t in tallies.items():
        lines.append(f"| {c} | {t.trials} | {t.ok}/{t.trials} | {t.kills} | {t.live} | "
                     f"{t.killed_while_writing} | {t.finished_before_kill} | "
                     f"{'; '.join(t.failures) or 'none'} |")
    return "\n".join(lines)


def machine() -> str:
    names = cpu_names()
    return f"{names[0]} ({len(names)} cores)" if names else "an unknown machine"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50, help="trials per command (default 50)")
    ap.add_argument("--commands", nargs="+", default=list(COMMANDS), choices=COMMANDS)
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--quick", action="store_true", help="the test suite's smaller fixtures")
    ap.add_argument("--workdir", type=Path, help="where to make the temporary directory")
    a = ap.parse_args()
    t0 = time.monotonic()
    tallies = chaos(a.commands, a.trials, a.seed, a.quick, a.workdir,
                    log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_tallies(tallies))
    print(f"\n{a.trials} trials per command, seed {a.seed}, {time.monotonic() - t0:.0f} s on "
          f"{machine()}, commit {commit()}")
    return 0 if all(not t.failures for t in tallies.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
