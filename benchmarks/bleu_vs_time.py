"""Validation BLEU against training wall-clock time: every checkpoint of each run translated and
scored, the runs drawn on one plot, and how soon the first run reaches the last run's final BLEU.
With --g2p, the same for the demo's word error rate (lower is better) on its validation words.
Also, with --align, the alignment picture: one sentence's attention weights of two models side by
side (the RNN's additive attention, the Transformer's cross-attention averaged over heads).

    .venv/bin/python benchmarks/bleu_vs_time.py \\
        --data runs/multi30k-en-de/data --run Transformer=RUN_A --run RNN=RUN_B \\
        --out docs/rnn-vs-transformer
    .venv/bin/python benchmarks/bleu_vs_time.py --g2p runs/g2p-demo/corpus \\
        --run Transformer=runs/g2p-demo/run --run RNN=RUN_B --out docs/x
    .venv/bin/python benchmarks/bleu_vs_time.py --data DATA --out docs/x \\
        --align RNN=MODEL_DIR --align Transformer=MODEL_DIR --sentence 3

RUN is a run directory of `aiayn train` (keep every checkpoint: `--save-minutes 2 --keep 40`;
for the demo, `aiayn demo --keep 30` keeps all of its 30), or `OLD.json#LABEL`: a curve this
script scored before (OLD.json is an earlier OUT.json), taken as it was, for a run whose
checkpoints are gone; it must have been scored on the same split with the same search (not
checked: the record does not say), and its label should say when and where it ran.
With --from-metrics nothing is translated: the points are the run's own dev evaluations
(metrics.jsonl's `dev_bleu`: greedy sacreBLEU on the first `--eval-bleu-sentences` val
sentences, every `--eval-every` updates), for runs that kept few checkpoints.
A checkpoint's time is the run's training wall-clock at its step (the "elapsed" of
metrics.jsonl, interpolated between logged steps; dev evaluations and saving included). Each is
translated by greedy search (--beam for beam search) on the whole validation split and scored
with sacreBLEU; scores are cached in OUT.json, so a re-run scores only new checkpoints. Writes
OUT.json, OUT.png (and OUT-align.png with --align).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiayn.files import atomic_write  # noqa: E402


def elapsed_at(run: Path, steps: list[int]) -> list[float]:
    """Training wall-clock seconds at each step, from metrics.jsonl's train records."""
    pts = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "train" and "elapsed" in rec:
            pts.append((rec["step"], rec["elapsed"]))
    pts.sort()
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    return [float(np.interp(s, xs, ys)) for s in steps]


def score_checkpoint(model_dir: Path, sources: list[str], refs: list, beam: int | None,
                     metric: str = "bleu") -> float:
    """sacreBLEU (refs: one string per source), or word error rate in % (refs: each word's list of
    dictionary pronunciations)."""
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator
    from aiayn.evaluation.g2p import word_error_rate
    from aiayn.evaluation.sacre import sacre_bleu

    tr = Translator(load_model(model_dir), precision="fp32", greedy=beam is None, beam_size=beam)
    hyps = tr.translate(sources)
    return 100 * word_error_rate(hyps, refs) if metric == "wer" else sacre_bleu(hyps, refs).score


def validation(data: Path | None, g2p: Path | None, limit: int | None) -> tuple[list[str], list]:
    """The validation sources and references: a prepared dataset's, or the demo corpus's words
    with all their pronunciations."""
    if g2p is not None:
        from aiayn.recipes.cmudict_data import read_refs

        sources = (g2p / "valid.src").read_text(encoding="utf-8").splitlines()
        return sources[:limit], read_refs(g2p / "valid.refs")[:limit]
    assert data is not None
    return ((data / "valid.src.txt").read_text(encoding="utf-8").splitlines()[:limit],
            (data / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()[:limit])


def score_runs(runs: dict[str, Path], sources: list[str], refs: list, cache: dict,
               beam: int | None, metric: str = "bleu") -> dict:
    from tqdm import tqdm

    from aiayn.training.checkpoint import list_checkpoints

    for label, run in runs.items():
        entry = cache.setdefault(label, {"run": str(run), "points": {}})
        if entry["run"] != str(run):
            entry.update(run=str(run), points={})
        ckpts = list_checkpoints(run)
        walls = elapsed_at(run, [s for s, _ in ckpts])
        for (step, d), wall in tqdm(list(zip(ckpts, walls)), desc=label, file=sys.stderr):
            if metric not in entry["points"].get(str(step), {}):
                entry["points"][str(step)] = {
                    "wall_s": wall, metric: score_checkpoint(d, sources, refs, beam, metric)}
    return cache


def recorded_runs(runs: dict[str, Path], metric: str = "bleu") -> tuple[dict[str, Path], dict]:
    """Split `runs` into run directories and curves of `metric` recorded in an earlier OUT.json
    (`OLD.json#LABEL`); the latter are returned as cache entries, read as they were."""
    live, recorded = {}, {}
    for label, path in runs.items():
        file, sep, key = str(path).partition("#")
        if not (sep and file.endswith(".json")):
            live[label] = path
            continue
        if not Path(file).is_file():
            raise SystemExit(f"--run {label}={path}: no such file {file}")
        old = json.loads(Path(file).read_text(encoding="utf-8"))
        curves = [k for k, v in old.items() if isinstance(v, dict) and "points" in v]
        if key not in curves:
            raise SystemExit(f"--run {label}={path}: {file} has no curve {key!r} "
                             f"(it has {', '.join(curves) or 'none'})")
        if not all(metric in p for p in old[key]["points"].values()):
            raise SystemExit(f"--run {label}={path}: the curve {key!r} has no {metric} scores")
        recorded[label] = {"run": str(path), "recorded": True, "points": old[key]["points"]}
    return live, recorded


def metrics_runs(runs: dict[str, Path]) -> dict:
    """Each run's dev evaluations as points (no translating): {label: {"run", "points"}}."""
    cache = {}
    for label, run in runs.items():
        dev = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
        dev = [r for r in dev if r.get("kind") == "dev" and "dev_bleu" in r]
        walls = elapsed_at(run, [r["step"] for r in dev])
        cache[label] = {"run": str(run), "points": {
            str(r["step"]): {"wall_s": w, "bleu": r["dev_bleu"], "sentences": r.get("bleu_sentences")}
            for r, w in zip(dev, walls)}}
    return cache


def curve(entry: dict, metric: str = "bleu") -> tuple[list[float], list[float]]:
    pts = sorted(entry["points"].values(), key=lambda p: p["wall_s"])
    return [p["wall_s"] for p in pts], [p[metric] for p in pts]


def first_reaching(walls: list[float], bleus: list[float], target: float) -> float | None:
    """The first time the curve reaches `target`, interpolated linearly between checkpoints."""
    for i, b in enumerate(bleus):
        if b >= target:
            if i == 0:
                return walls[0]
            f = (target - bleus[i - 1]) / (b - bleus[i - 1])
            return walls[i - 1] + f * (walls[i] - walls[i - 1])
    return None


def summary(cache: dict, fast: str, slow: str, metric: str = "bleu") -> dict:
    """When `fast` first reaches `slow`'s final validation score (BLEU, or a word error rate as
    low), and that time over `slow`'s."""
    sign = -1 if metric == "wer" else 1  # lower is better
    fw, fb = curve(cache[fast], metric)
    sw, sb = curve(cache[slow], metric)
    t = first_reaching(fw, [sign * b for b in fb], sign * sb[-1])
    return {f"target_{metric}": sb[-1], "slow_wall_s": sw[-1], "fast_reaches_at_s": t,
            "ratio": None if t is None else t / sw[-1]}


def plot(cache: dict, path: Path, title: str, comparison: dict | None,
         ylabel: str = "validation sacreBLEU", metric: str = "bleu") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for label, entry in cache.items():
        w, b = curve(entry, metric)
        ax.plot([x / 60 for x in w], b, marker="o", ms=3, label=label,
                ls="--" if entry.get("recorded") else "-")
    if comparison and comparison["fast_reaches_at_s"] is not None:
        ax.axhline(comparison[f"target_{metric}"], color="grey", lw=0.8, ls=":")
        ax.axvline(comparison["fast_reaches_at_s"] / 60, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("training wall-clock time (minutes)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def alignment(model_dir: Path, source: str, target: str) -> tuple[np.ndarray, list[str], list[str]]:
    """Cross-attention weights (T, S) of a model for one reference pair, teacher-forced: the
    last decoder layer's, averaged over heads (the RNN has one layer with one head)."""
    import torch

    from aiayn.data.model_dir import load_model
    from aiayn.decoding.common import source_batch
    from aiayn.special import BOS_ID

    m = load_model(model_dir)
    src_ids, tgt_ids = m.src_tokenizer.encode(source), m.tgt_tokenizer.encode(target)
    src, mask = source_batch([src_ids])
    with torch.no_grad():
        _, att = m.model(src, torch.tensor([[BOS_ID] + tgt_ids]), mask, return_attention=True)
    w = att["cross"][-1][0].mean(0)  # (T, S)
    pieces = lambda tok, ids: [tok.id_to_piece(i) for i in ids]  # noqa: E731
    return w.numpy(), pieces(m.src_tokenizer, src_ids) + ["</s>"], \
        ["<s>"] + pieces(m.tgt_tokenizer, tgt_ids)


def plot_alignments(models: dict[str, Path], source: str, target: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 6))
    for ax, (label, d) in zip(np.atleast_1d(axes), models.items()):
        w, src, tgt = alignment(d, source, target)
        ax.imshow(w, cmap="Greys", vmin=0, vmax=1)
        ax.set_xticks(range(len(src)), src, rotation=90, fontsize=8)
        ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
        ax.set_xlabel("source")
        ax.set_ylabel("target (decoder input)")
        ax.set_title(label, fontsize=10)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def _pairs(items: list[str], flag: str = "--run") -> dict[str, Path]:
    """LABEL=PATH items as {label: path}. A label may hold "=" ("lr_scale=0.7") and so may a
    path, so the split is at the last "=" followed by an existing path (before any "#KEY"), or
    at the last "=" when none is."""
    out = {}
    for item in items:
        cuts = [i for i, c in enumerate(item) if c == "="]
        if not cuts or cuts[0] == 0:
            raise SystemExit(f"{flag} {item}: expected LABEL=PATH")
        cut = next((i for i in reversed(cuts)
                    if Path(item[i + 1:].partition("#")[0]).exists()), cuts[-1])
        out[item[:cut]] = Path(item[cut + 1:])
    return out


def check_run_dirs(runs: dict[str, Path]) -> None:
    """A training run directory has metrics.jsonl; say so in one line before any scoring."""
    for label, run in runs.items():
        if not (run / "metrics.jsonl").is_file():
            raise SystemExit(f"--run {label}={run}: not a training run directory "
                             "(no metrics.jsonl there)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="prepared dataset (valid.src.txt, ...)")
    p.add_argument("--g2p", type=Path, metavar="CORPUS", help="instead of --data: the demo's corpus "
                   "directory (`aiayn demo --out D` writes D/corpus); scores word error rate on its "
                   "validation words")
    p.add_argument("--run", action="append", default=[], help="LABEL=RUN_DIR (or LABEL=OLD.json#KEY, "
                   "a curve scored before); the first is the fast one, the last the one whose "
                   "final BLEU it must reach")
    p.add_argument("--out", type=Path, required=True, help="output prefix (OUT.json, OUT.png)")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: greedy)")
    p.add_argument("--from-metrics", action="store_true",
                   help="plot each run's own dev evaluations instead of translating checkpoints")
    p.add_argument("--sentences", type=int, default=None, help="only the first N val sentences")
    p.add_argument("--title", default="")
    p.add_argument("--align", action="append", default=[], help="LABEL=MODEL_DIR")
    p.add_argument("--sentence", type=int, default=0, help="--align: the sentence's index")
    p.add_argument("--align-split", default="test", help="--align: the split it is from")
    args = p.parse_args(argv)
    if (args.data is None) == (args.g2p is None):
        p.error("give one of --data and --g2p")
    if args.g2p is not None and (args.align or args.from_metrics):
        p.error("--g2p scores checkpoints; --align and --from-metrics need --data")
    metric = "wer" if args.g2p is not None else "bleu"
    if args.align:
        split = args.align_split
        src = (args.data / f"{split}.src.txt").read_text(encoding="utf-8").splitlines()[args.sentence]
        tgt = (args.data / f"{split}.tgt.txt").read_text(encoding="utf-8").splitlines()[args.sentence]
        plot_alignments(_pairs(args.align, "--align"), src, tgt, Path(f"{args.out}-align.png"))
    if not args.run:
        return 0
    out_json = Path(f"{args.out}.json")
    cache = json.loads(out_json.read_text()) if out_json.exists() else {}
    runs = _pairs(args.run)
    live, recorded = recorded_runs(runs, metric)
    check_run_dirs(live)
    if args.from_metrics:
        cache = metrics_runs(live)
    else:
        sources, refs = validation(args.data, args.g2p, args.sentences)
        cache = score_runs(live, sources, refs, {k: v for k, v in cache.items() if k in live},
                           args.beam, metric)
    cache = {label: recorded[label] if label in recorded else cache[label] for label in runs}
    labels = list(runs)
    comparison = summary(cache, labels[0], labels[-1], metric) if len(labels) > 1 else None
    from provenance import stamp

    with atomic_write(out_json) as f:  # stamp(): this checkout's commit, not the runs'
        json.dump({**cache, **({"comparison": comparison} if comparison else {}), **stamp()}, f,
                  indent=1)
    ylabel = ("validation word error rate, %" if metric == "wer" else "validation sacreBLEU") + \
        (" (greedy)" if args.beam is None else f" (beam {args.beam})")
    if args.from_metrics:
        n = {p.get("sentences") for e in cache.values() for p in e["points"].values()}
        ylabel = f"validation sacreBLEU (greedy, first {'/'.join(map(str, sorted(n)))} sentences)"
    plot({k: cache[k] for k in labels}, Path(f"{args.out}.png"), args.title, comparison, ylabel,
         metric)
    if comparison:
        print(json.dumps(comparison, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
