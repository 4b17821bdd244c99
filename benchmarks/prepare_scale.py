"""`aiayn prepare` and training start-up at WMT scale, in bounded memory.

Builds parallel corpora of growing size by resampling Multi30k's training pairs (0.3M, 3M, 10M
pairs by default; WMT 2014 EN-DE has 4.5M), outside the repository, then for each size:
- `aiayn prepare` (this tree), as a user runs it: wall time, the peak memory of the whole process
  tree (PSS, so pages shared by the forked workers count once) and of the main process (RSS),
  and the time of each stage (checking + sampling, vocabulary, encoding, read off its log);
- the peer: the same command from another revision (`--peer-ref`, default `PEER_REF`, the last
  one whose prepare held the whole corpus in memory) on the sizes given by `--peer-sizes`;
- training start-up on the prepared dataset: `aiayn train` of a one-layer model for one update,
  wall time, peak RSS and peak anonymous RSS (RSS less the mapped dataset files), and, in a
  probe process, what opening the dataset and the sampler's first batch cost (seconds, and peak
  bytes traced by tracemalloc), this tree's `TokenBatchSampler` against the peer revision's.
- with `--zipf-pairs N` (default 500,000, the default `--vocab-sample`): the vocabulary stage alone
  on N synthetic pairs whose words follow Zipf's law over a million word types (WMT 2014 EN-DE
  has about that many per language), 37,000 pieces: what learning the vocabulary costs on text
  as varied as WMT's, which resampled Multi30k is not.
Prints a table and writes JSON; deletes the corpora and datasets at the end unless `--keep`.

    .venv/bin/pip install -e '.[bench]'     # psutil, for the memory of the process tree
    .venv/bin/python benchmarks/prepare_scale.py
    .venv/bin/python benchmarks/prepare_scale.py --sizes 20000 50000 --peer-sizes 20000  # a quick look

Resampled Multi30k repeats 29,000 distinct pairs: the vocabulary stage learns from a sample whose
distinct words are Multi30k's, far fewer than WMT's, so that stage is faster here than on WMT (its
cost does not grow with the corpus either way); checking, encoding and writing see every pair
and scale as they would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the shared data beside the repository (its checkout, or a worktree one level further down)
MULTI30K = next((p / "shared" / "data" / "multi30k" for p in (ROOT.parent, ROOT.parent.parent)
                 if (p / "shared" / "data" / "multi30k").is_dir()), ROOT.parent / "shared" / "data" / "multi30k")
# the revision before the streamed, sharded prepare (d385998): the whole corpus in memory
PEER_REF = "0c7c2c6"
# log line prefix -> the stage it starts ("prepared" is the summary: the end)
STAGES = (("checking", "check"), ("learning a", "vocab"), ("encoding", "encode"), ("prepared", "end"))


def make_corpus(root: Path, n: int, source: Path, seed: int = 0) -> Path:
    """root/train.{en,de}: n pairs drawn with replacement from Multi30k's training pairs."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from aiayn.data.corpus import read_lines

    prefix = root / "train"
    if (root / "train.de").exists():
        return prefix
    root.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        lines = read_lines(source / f"train.{lang}.gz")
        rng = np.random.default_rng(seed)  # the same draw for both sides
        tmp = root / f".train.{lang}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for start in range(0, n, 1_000_000):
                idx = rng.integers(0, len(lines), min(1_000_000, n - start))
                f.write("".join(lines[i] + "\n" for i in idx))
        tmp.rename(root / f"train.{lang}")
    return prefix


def anonymous_rss(pid: int) -> int:
    """Bytes of anonymous memory resident for `pid` (RssAnon in /proc/PID/status; 0 if unread)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory:
    """Samples a process tree every `interval` seconds: peak total PSS, and peak RSS and peak
    anonymous RSS of the root. The anonymous part is what the process allocated; the rest of its
    RSS is file pages it maps (a dataset's memory-mapped shards), which the kernel can drop."""

    def __init__(self, pid: int, interval: float = 0.25):
        import psutil

        self.root = psutil.Process(pid)
        self.peak_pss = self.peak_rss = self.peak_anon = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
                pss = 0
                for p in procs:
                    try:
                        pss += p.memory_full_info().pss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
                self.peak_pss = max(self.peak_pss, pss)
                self.peak_rss = max(self.peak_rss, self.root.memory_info().rss)
                self.peak_anon = max(self.peak_anon, anonymous_rss(self.root.pid))
            except psutil.NoSuchProcess:
                return
            self._stop.wait(interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_measured(cmd: list[str], env: dict, log: Path) -> dict:
    """Run `cmd`, timestamping its stderr lines; wall seconds, peak tree PSS / root RSS (GB)."""
    t0 = time.perf_counter()
    stamped = []
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        mem = TreeMemory(proc.pid)
        for line in proc.stdout:
            stamped.append((time.perf_counter() - t0, line.rstrip("\n")))
            f.write(f"{stamped[-1][0]:9.2f}  {line}")
        proc.wait()
        mem.stop()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}; see {log}")
    return {"seconds": wall, "peak_tree_pss_gb": mem.peak_pss / 1e9, "peak_main_rss_gb": mem.peak_rss / 1e9,
            "peak_main_anon_gb": mem.peak_anon / 1e9, "log": stamped}


def stage_times(stamped: list[tuple[float, str]], wall: float) -> dict:
    """Seconds of each stage, from the first log line of each to the next."""
    marks = {}
    for t, line in stamped:
        for prefix, name in STAGES:
            if line.startswith(prefix) and name not in marks:
                marks[name] = t
    names = [n for _, n in STAGES if n in marks]
    out = {}
    for a, b in zip(names, names[1:] + [None]):
        if a != "end":
            out[a] = (marks[b] if b else wall) - marks[a]
    return out


def prepare_cmd(tree: Path, prefix: Path, out: Path, workers: int | None) -> list[str]:
    val = MULTI30K / "val"
    cmd = [sys.executable, "-m", "aiayn", "prepare", "--src-lang", "en", "--tgt-lang", "de",
           "--train", str(prefix), "--valid", str(val), "--vocab-size", "8000", "--out", str(out)]
    if workers is not None and tree == ROOT:
        cmd += ["--workers", str(workers)]
    return cmd


PROBE = r"""
import json, sys, time, tracemalloc
import importlib.util
sys.path.insert(0, sys.argv[1])
from aiayn.data.dataset import ParallelDataset
t0 = time.perf_counter()
tracemalloc.start()
ds = ParallelDataset(sys.argv[2], "train")
t1 = time.perf_counter()
open_peak = tracemalloc.get_traced_memory()[1]
out = {"pairs": len(ds), "open_s": t1 - t0, "open_peak_mb": open_peak / 1e6}
for name, path in (("this", sys.argv[1]), ("peer", sys.argv[3])):
    spec = importlib.util.spec_from_file_location(f"batching_{name}", f"{path}/aiayn/data/batching.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t = time.perf_counter()
    s = mod.TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, 4096, seed=1)
    first = next(iter(s))  # what training waits for before its first update
    out[name] = {"sampler_s": time.perf_counter() - t, "sampler_peak_mb": (tracemalloc.get_traced_memory()[1] - base) / 1e6,
                 "held_mb": (tracemalloc.get_traced_memory()[0] - base) / 1e6, "batches": len(s)}
    del s, first
print(json.dumps(out))
"""


def train_startup(ds: Path, run: Path, env: dict, log: Path) -> dict:
    cmd = [sys.executable, "-m", "aiayn", "train", "--data", str(ds), "--out", str(run), "--preset", "base",
           "--set", "n_layers=1", "d_model=64", "d_ff=128", "n_heads=2", "--batch-tokens", "4096",
           "--max-steps", "1", "--eval-every", "0", "--eval-bleu-sentences", "0", "--save-minutes", "1000",
           "--no-tensorboard", "--no-progress", "--threads", "2", "--overwrite"]
    r = run_measured(cmd, env, log)
    return {k: v for k, v in r.items() if k != "log"}


ZIPF_PROBE = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from aiayn.data.tokenizer import train_tokenizers
n, types = int(sys.argv[2]), 1_000_000
rng = np.random.default_rng(0)
letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöüéèàç"))
# word types: frequent ones short, as in natural text; ranks drawn with p ~ 1/rank
lengths = np.clip((np.log(np.arange(1, types + 1)) / 1.3).astype(int) + rng.integers(1, 4, types), 1, 18)
words = ["".join(rng.choice(letters, k)) for k in lengths]
cdf = np.cumsum(1.0 / np.arange(1, types + 1)); cdf /= cdf[-1]
def sentences(m):
    out = []
    for lens in np.array_split(rng.integers(5, 45, m), max(1, m // 100_000)):
        ids = np.searchsorted(cdf, rng.random(int(lens.sum())))
        pos = 0
        for k in lens:
            out.append(" ".join(words[i] for i in ids[pos:pos + k])); pos += k
    return out
src, tgt = sentences(n), sentences(n)
distinct = len(set(w for s in src[:200_000] for w in s.split()))
t = time.perf_counter()
tok, _ = train_tokenizers(src, tgt, 37000)
print(json.dumps({"pairs": n, "seconds": time.perf_counter() - t, "pieces": tok.vocab_size,
                  "distinct_words_in_200k_sentences": distinct}))
"""


def zipf_vocab(n: int, env: dict, log: Path) -> dict:
    """The vocabulary stage on n synthetic Zipfian pairs, in its own process (peak memory)."""
    r = run_measured([sys.executable, "-c", ZIPF_PROBE, str(ROOT), str(n)], env, log)
    out = json.loads(r["log"][-1][1])
    return {**out, "process_seconds": r["seconds"], "peak_main_rss_gb": r["peak_main_rss_gb"]}


def peer_tree(ref: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT.parent / "aiayn-prepare-scale"),
                    help="where corpora and datasets go, outside the repository (default: beside it)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[300_000, 3_000_000, 10_000_000])
    ap.add_argument("--peer-sizes", type=int, nargs="*", default=[300_000, 3_000_000])
    ap.add_argument("--peer-ref", default=PEER_REF,
                    help=f"git revision of the peer (default {PEER_REF}, the in-memory prepare)")
    ap.add_argument("--workers", type=int, default=None, help="--workers for this tree's prepare")
    ap.add_argument("--multi30k", default=None, help="directory with train.{en,de}.gz, val.* "
                    "(default: the shared data beside the repository)")
    ap.add_argument("--zipf-pairs", type=int, default=500_000,
                    help="pairs for the vocabulary stage on Zipfian text (0: skip)")
    ap.add_argument("--json", default=None, help="write the results here too")
    ap.add_argument("--keep", action="store_true", help="keep the corpora and datasets")
    args = ap.parse_args()
    global MULTI30K
    MULTI30K = Path(args.multi30k) if args.multi30k else MULTI30K
    root = Path(args.root)
    if ROOT in root.resolve().parents or root.resolve() == ROOT:
        raise SystemExit("--root must be outside the repository")
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    from provenance import stamp

    results = {**stamp(), "sizes": {}}
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        peer = peer_tree(args.peer_ref, Path(tmp) / "peer")
        peer_env = {**os.environ, "PYTHONPATH": str(peer)}
        try:
            for n in args.sizes:
                prefix = make_corpus(root / f"corpus-{n}", n, MULTI30K)
                row: dict = {}
                ds = root / f"ds-{n}"
                shutil.rmtree(ds, ignore_errors=True)
                r = run_measured(prepare_cmd(ROOT, prefix, ds, args.workers), env, root / f"prepare-{n}.log")
                row["prepare"] = {k: v for k, v in r.items() if k != "log"}
                row["prepare"]["stages"] = stage_times(r["log"], r["seconds"])
                print(f"{n:>10,} pairs: prepare {r['seconds']:.0f} s, tree {r['peak_tree_pss_gb']:.2f} GB "
                      f"(main {r['peak_main_rss_gb']:.2f} GB) {row['prepare']['stages']}", flush=True)
                if n in args.peer_sizes:
                    pds = root / f"peer-ds-{n}"
                    shutil.rmtree(pds, ignore_errors=True)
                    r = run_measured(prepare_cmd(peer, prefix, pds, None), peer_env, root / f"peer-prepare-{n}.log")
                    row["peer_prepare"] = {k: v for k, v in r.items() if k != "log"}
                    shutil.rmtree(pds, ignore_errors=True)
                    print(f"{'':>10}  peer ({args.peer_ref}): {r['seconds']:.0f} s, tree {r['peak_tree_pss_gb']:.2f} GB",
                          flush=True)
                row["train_startup"] = train_startup(ds, root / f"run-{n}", env, root / f"train-{n}.log")
                probe = subprocess.run([sys.executable, "-c", PROBE, str(ROOT), str(ds), str(peer)],
                                       capture_output=True, text=True, env=env)
                if probe.returncode != 0:
                    raise SystemExit(f"the start-up probe failed:\n{probe.stderr}")
                row["probe"] = json.loads(probe.stdout)
                print(f"{'':>10}  train start-up {row['train_startup']['seconds']:.1f} s, peak RSS "
                      f"{row['train_startup']['peak_main_rss_gb']:.2f} GB (anonymous "
                      f"{row['train_startup']['peak_main_anon_gb']:.2f}); probe {row['probe']}", flush=True)
                results["sizes"][n] = row
                shutil.rmtree(root / f"run-{n}", ignore_errors=True)
            if args.zipf_pairs:
                results["zipf_vocab"] = zipf_vocab(args.zipf_pairs, env, root / "zipf-vocab.log")
                print(f"vocabulary on {args.zipf_pairs:,} Zipfian pairs: {results['zipf_vocab']}", flush=True)
        finally:
            if not args.keep:
                for n in args.sizes:
                    shutil.rmtree(root / f"corpus-{n}", ignore_errors=True)
                    shutil.rmtree(root / f"ds-{n}", ignore_errors=True)
    report(results, args.peer_ref)
    if "zipf_vocab" in results:
        z = results["zipf_vocab"]
        print(f"vocabulary stage, {z['pairs']:,} Zipfian pairs, {z['pieces']} pieces: {z['seconds']:.0f} s "
              f"(process peak RSS {z['peak_main_rss_gb']:.2f} GB)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def report(results: dict, peer_ref: str) -> None:
    from provenance import stamp_line

    print(f"\n{stamp_line(results)}")
    print("| pairs | prepare s | s per M pairs | check / vocab / encode s | tree PSS GB | main RSS GB | "
          f"peer ({peer_ref}) s / GB | train start-up s / RSS GB / anonymous GB | sampler s / peak MB (peer) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, row in results["sizes"].items():
        p, st = row["prepare"], row["prepare"]["stages"]
        peer = row.get("peer_prepare")
        ps = f"{peer['seconds']:.0f} / {peer['peak_tree_pss_gb']:.2f}" if peer else "-"
        pr = row["probe"]
        print(f"| {int(n):,} | {p['seconds']:.0f} | {p['seconds'] / (int(n) / 1e6):.0f} | "
              f"{st.get('check', 0):.0f} / {st.get('vocab', 0):.0f} / {st.get('encode', 0):.0f} | "
              f"{p['peak_tree_pss_gb']:.2f} | {p['peak_main_rss_gb']:.2f} | {ps} | "
              f"{row['train_startup']['seconds']:.1f} / {row['train_startup']['peak_main_rss_gb']:.2f} / "
              f"{row['train_startup']['peak_main_anon_gb']:.2f} | "
              f"{pr['this']['sampler_s']:.2f} / {pr['this']['sampler_peak_mb']:.0f} "
              f"({pr['peer']['sampler_s']:.2f} / {pr['peer']['sampler_peak_mb']:.0f}) |")


if __name__ == "__main__":
    sys.exit(main())
