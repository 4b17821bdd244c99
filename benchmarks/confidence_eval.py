"""How well the search's own confidence ranks translation quality: each sentence's score,
log-probability and token probabilities against its sentence chrF.

Translates every source (best hypothesis, the Translator's default search: the model's beam and
alpha) and takes, per sentence, what `aiayn translate --format jsonl` reports
(`aiayn.decoding.translate.confidence`):
- `score`: logprob / lp(|Y|), the length-normalised score the beam ranked by;
- `logprob`: log P(Y | X);
- `mean_token_prob` and `min_token_prob`: of p(y_t | y_<t, X) over the output's pieces and EOS;
and the sentence's chrF against its reference (sacrebleu's, as `sentence_chrf` computes it). Reported: Pearson
and Spearman correlation of each signal with chrF (ranks with ties averaged, numpy), and a
threshold table: keeping the sentences of the top 100/90/80/70/50% of scores, the mean sentence
chrF and corpus sacreBLEU of what is kept and of what is dropped. Blank source lines are left
out (nothing was translated).

    .venv/bin/python benchmarks/confidence_eval.py --model runs/m30k/model \\
        --src runs/m30k/data/test.src.txt --ref runs/m30k/data/test.tgt.txt \\
        --out runs/confidence_eval.json --plot runs/confidence_eval.png

`--plot` draws score against chrF, one point a sentence.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiayn.decoding import DECODE_PRECISIONS  # noqa: E402
from aiayn.decoding.common import model_device  # noqa: E402
from aiayn.files import atomic_write  # noqa: E402

from provenance import stamp, stamp_line  # noqa: E402

SIGNALS = ("score", "logprob", "mean_token_prob", "min_token_prob")
KEEP_PCT = (100, 90, 80, 70, 50)


def ranks(x):
    """1-based ranks of `x`, tied values sharing the mean of their ranks (numpy float64)."""
    import numpy as np

    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    # runs of equal values: each gets the mean of the ranks its run spans
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(x)]  # exclusive
    mean_rank = (starts + ends + 1) / 2.0  # mean of starts+1 .. ends
    out = np.empty(len(x))
    out[order] = np.repeat(mean_rank, ends - starts)
    return out


def pearson(x, y) -> float | None:
    """Pearson's r; None where either side is constant (or there are fewer than 2 points)."""
    import numpy as np

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    den = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    if den == 0:
        return None
    return float(np.clip((dx * dy).sum() / den, -1.0, 1.0))


def spearman(x, y) -> float | None:
    """Spearman's rho: Pearson's r of the ranks."""
    return pearson(ranks(x), ranks(y)) if len(x) >= 2 else None


def signals(hyp) -> dict[str, float]:
    from aiayn.decoding.translate import confidence

    c = confidence(hyp)
    probs = c["token_probs"] or [0.0]
    return {"score": c["score"], "logprob": c["logprob"],
            "mean_token_prob": sum(probs) / len(probs), "min_token_prob": min(probs)}


def thresholds(rows: list[dict]) -> list[dict]:
    """Per kept share, best scores first: the mean sentence chrF and corpus sacreBLEU of the
    sentences kept and of those dropped (None where none are)."""
    from aiayn.evaluation.sacre import sacre_bleu

    ranked = sorted(rows, key=lambda r: -r["score"])
    out = []
    for pct in KEEP_PCT:
        n = max(1, round(len(ranked) * pct / 100))
        entry: dict = {"keep_pct": pct, "kept": n, "dropped": len(ranked) - n}
        for side, part in (("kept", ranked[:n]), ("dropped", ranked[n:])):
            entry[f"{side}_mean_chrf"] = (round(sum(r["chrf"] for r in part) / len(part), 2)
                                          if part else None)
            entry[f"{side}_bleu"] = (round(sacre_bleu([r["hyp"] for r in part],
                                                      [r["ref"] for r in part]).score, 2)
                                     if part else None)
        out.append(entry)
    return out


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter([r["score"] for r in rows], [r["chrf"] for r in rows], s=8, alpha=0.5,
               color="#2f5fd0", edgecolors="none")
    ax.set(xlabel="sentence score, logprob / length penalty", ylabel="sentence chrF",
           title=f"Search score against quality, {len(rows)} sentences")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_write(path, "wb", encoding=None) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def fmt(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def eval_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a script that translates a test set with a model: --model, --src, --ref,
    --precision and --device (this script's and glossary_eval.py's); `doc` its module doc."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--src", required=True, help="source sentences, one a line")
    p.add_argument("--ref", required=True, help="their reference translations")
    p.add_argument("--precision", choices=DECODE_PRECISIONS, default="auto",
                   help="decoding arithmetic (default auto, as aiayn translate)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU if there is one)")
    return p


def translator(args: argparse.Namespace):
    """The `Translator` `eval_parser`'s options ask for (--model, --precision, --device), or
    one line and exit when they cannot be met."""
    from aiayn.commands.common import torch_device
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator
    from aiayn.errors import UserError

    try:
        return Translator(load_model(args.model, torch_device(args.device)),
                          precision=args.precision)
    except UserError as e:
        raise SystemExit(str(e)) from None


def main() -> int:
    p = eval_parser(__doc__)
    p.add_argument("--out", required=True, type=Path, help="results JSON (refuses to overwrite)")
    p.add_argument("--plot", type=Path, help="scatter of score against chrF here (PNG)")
    a = p.parse_args()
    for path in (a.out, a.plot):
        if path is not None and path.exists():
            raise SystemExit(f"{path} exists; choose another path")
    srcs, refs = (Path(f).read_text(encoding="utf-8").splitlines() for f in (a.src, a.ref))
    if len(srcs) != len(refs):
        raise SystemExit(f"{a.src} has {len(srcs)} lines but {a.ref} has {len(refs)}")

    from sacrebleu.metrics import CHRF

    tr = translator(a)
    sources = tr.prepare(srcs)
    found = tr.search(sources, progress=True)
    metric = CHRF()  # sacrebleu.sentence_chrf's defaults, one object: it then has a signature
    rows = []
    for i, (src, ref, hyps) in enumerate(zip(sources, refs, found)):
        if not src or not hyps:
            continue
        hyp = tr.detokenize(hyps[0].tokens)
        rows.append({"line": i + 1, **signals(hyps[0]), "chrf": metric.sentence_score(hyp, [ref]).score,
                     "hyp": hyp, "ref": ref})
    if len(rows) < 2:
        raise SystemExit("fewer than 2 translated sentences: nothing to correlate")
    chrf = [r["chrf"] for r in rows]
    corr = {s: {"pearson": pearson([r[s] for r in rows], chrf),
                "spearman": spearman([r[s] for r in rows], chrf)} for s in SIGNALS}
    table = thresholds(rows)
    results = {**stamp(), "model": a.model, "src": a.src, "ref": a.ref, "precision": tr.precision,
               "device": str(model_device(tr.model)), "beam_size": tr.settings.beam_size,
               "alpha": tr.settings.alpha, "sentences": len(rows),
               "chrf_signature": str(metric.get_signature()), "correlation_with_chrf": corr,
               "thresholds": table,
               "rows": [{k: r[k] for k in ("line", *SIGNALS, "chrf", "hyp")} for r in rows]}
    with atomic_write(a.out) as f:
        json.dump(results, f, indent=2)
    if a.plot:
        plot(results, str(a.plot))

    print(f"\nConfidence against sentence chrF: {len(rows)} sentences; {tr.precision}, beam "
          f"{tr.settings.beam_size}, alpha {tr.settings.alpha}\n")
    print("| signal | Pearson r | Spearman rho |")
    print("|---|---:|---:|")
    for s in SIGNALS:
        print(f"| {s} | {fmt(corr[s]['pearson'])} | {fmt(corr[s]['spearman'])} |")
    print("\n| kept by score | sentences | mean chrF kept | sacreBLEU kept | mean chrF dropped "
          "| sacreBLEU dropped |")
    print("|---:|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| top {t['keep_pct']}% | {t['kept']} | {t['kept_mean_chrf']:.2f} | "
              f"{t['kept_bleu']:.2f} | {fmt(t['dropped_mean_chrf'], 2)} | {fmt(t['dropped_bleu'], 2)} |")
    print(f"\nchrF signature: {results['chrf_signature']}")
    print(stamp_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
