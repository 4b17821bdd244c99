"""Lexically constrained decoding measured as Post & Vilar (2018) measure it: reference words the
unconstrained translation missed, forced in; how many land, what BLEU does, what it costs.

1. Translate every source with the Translator's default search (no constraint).
2. Per sentence, choose up to `--terms` words of its reference that the translation misses:
   whitespace words stripped of surrounding punctuation, at least 3 letters, not among the
   translation's words (whole words, case-sensitive), chosen at random (`--seed`, each sentence
   its own generator). A sentence with none is left out of the constrained set; a term is
   dropped when the sentence's terms would not fit its maximum output length.
3. Decode the constrained set with those words as phrases (target pieces:
   `tgt_tokenizer.encode(word)`, the word-initial form a word inside a sentence takes) and
   without, alternating which goes first, `--repeats` times each, timing each
   `Translator.search` (perf_counter; same sources, same settings, same process).

Reported: sentences and terms constrained; % of terms present as whole words in the constrained
output (and in the unconstrained one: 0 by construction when the search is deterministic);
sacreBLEU (sacrebleu, 13a, with its signature) unconstrained against constrained on the
constrained set and on the whole test set (the constrained outputs substituted); the median
seconds of each search and their ratio constrained / unconstrained.

    .venv/bin/python benchmarks/glossary_eval.py --model runs/m30k/model \\
        --src runs/m30k/data/test.src.txt --ref runs/m30k/data/test.tgt.txt \\
        --terms 2 --seed 0 --repeats 3 --out runs/glossary_eval.json

The reference words are an oracle's terms (as in the paper): the BLEU gain is an upper bound
of what a glossary buys, and the timing is the price of constraints that the model did not
want to write.
"""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from confidence_eval import eval_parser, translator  # noqa: E402

from aiayn.decoding.common import model_device  # noqa: E402
from aiayn.files import atomic_write  # noqa: E402

from provenance import stamp, stamp_line  # noqa: E402

EDGES = re.compile(r"^\W+|\W+$")


def words(text: str) -> list[str]:
    """The whitespace words of `text`, each stripped of the punctuation around it (empty ones
    dropped): "Ein Hund, der läuft." -> ["Ein", "Hund", "der", "läuft"]."""
    return [w for w in (EDGES.sub("", t) for t in text.split()) if w]


def eligible(word: str) -> bool:
    """A word worth constraining: at least 3 letters."""
    return sum(ch.isalpha() for ch in word) >= 3


def choose_terms(reference: str, output: str, k: int, rng: random.Random) -> list[str]:
    """Up to `k` distinct eligible words of `reference` that are not words of `output`, chosen
    at random by `rng`, in the reference's order."""
    have = set(words(output))
    candidates = list(dict.fromkeys(w for w in words(reference) if eligible(w) and w not in have))
    chosen = set(rng.sample(candidates, min(k, len(candidates))))
    return [w for w in candidates if w in chosen]


def present(terms: list[str], output: str) -> int:
    """How many of `terms` are words of `output`."""
    have = set(words(output))
    return sum(t in have for t in terms)


def room(tr, src: list[int]) -> int:
    """The most target tokens (EOS included) the search may write for source ids `src`."""
    import torch

    from aiayn.decoding.common import decoder_length_cap, max_output_lengths

    mask = torch.ones(1, len(src) + 1, dtype=torch.bool)  # pieces + EOS
    return int(max_output_lengths(mask, tr.settings.max_len_a, tr.settings.max_len_b,
                                  decoder_length_cap(tr.model))[0])


def fit(tr, src: list[int], terms: list[str]) -> tuple[list[str], list[list[int]]]:
    """`terms` with their target pieces, the last ones dropped until they fit `src`'s maximum
    output length (with EOS); terms that encode to nothing are dropped."""
    kept = [(t, list(tr.tgt_tokenizer.encode(t))) for t in terms]
    kept = [(t, p) for t, p in kept if p]
    while kept and sum(len(p) for _, p in kept) + 1 > room(tr, src):
        kept.pop()
    return [t for t, _ in kept], [p for _, p in kept]


def read_pair(src: str, ref: str) -> tuple[list[str], list[str]]:
    lines = [Path(f).read_text(encoding="utf-8").splitlines() for f in (src, ref)]
    if len(lines[0]) != len(lines[1]):
        raise SystemExit(f"{src} has {len(lines[0])} lines but {ref} has {len(lines[1])}")
    return lines[0], lines[1]


def bleu(hyps: list[str], refs: list[str]) -> tuple[float, str]:
    from aiayn.evaluation.sacre import sacre_bleu

    r = sacre_bleu(hyps, refs)
    return round(r.score, 2), r.signature


def main() -> int:
    p = eval_parser(__doc__)
    p.add_argument("--terms", type=int, default=2, help="most reference words per sentence (2)")
    p.add_argument("--seed", type=int, default=0, help="the words' random choice (0)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each search (3)")
    p.add_argument("--out", required=True, type=Path, help="results JSON (refuses to overwrite)")
    a = p.parse_args()
    if a.terms < 1 or a.repeats < 1:
        p.error("--terms and --repeats must be at least 1")
    if a.out.exists():
        raise SystemExit(f"{a.out} exists; choose another --out")
    srcs, refs = read_pair(a.src, a.ref)

    tr = translator(a)
    sources = tr.prepare(srcs)
    print(f"translating {len(srcs)} sentences, unconstrained ...", file=sys.stderr)
    base = [tr.detokenize(h[0].tokens) if h else "" for h in tr.search(sources, progress=True)]

    chosen, dropped = [], 0  # (line index, terms, phrases)
    for i, (src, ref, out) in enumerate(zip(sources, refs, base)):
        if not src:
            continue
        terms = choose_terms(ref, out, a.terms, random.Random(f"{a.seed}:{i}"))
        kept, phrases = fit(tr, src, terms)
        dropped += len(terms) - len(kept)
        if kept:
            chosen.append((i, kept, phrases))
    if not chosen:
        raise SystemExit("no sentence misses a reference word: nothing to constrain")
    subset = [sources[i] for i, _, _ in chosen]
    phrases = [ps for _, _, ps in chosen]

    runs: dict[str, list] = {"unconstrained": [], "constrained": []}
    seconds: dict[str, list[float]] = {"unconstrained": [], "constrained": []}
    for r in range(a.repeats):
        order = ("unconstrained", "constrained")[:: 1 if r % 2 == 0 else -1]
        for kind in order:
            start = time.perf_counter()
            found = tr.search(subset, phrases=phrases if kind == "constrained" else None)
            seconds[kind].append(time.perf_counter() - start)
            runs[kind].append(found)
            print(f"repeat {r + 1}/{a.repeats} {kind:13s} {seconds[kind][-1]:8.3f} s",
                  file=sys.stderr)

    def texts(found: list) -> list[str]:
        return [tr.detokenize(h[0].tokens) if h else "" for h in found]

    con = texts(runs["constrained"][0])
    unc = texts(runs["unconstrained"][0])
    n_terms = sum(len(t) for _, t, _ in chosen)
    hit_con = sum(present(t, o) for (_, t, _), o in zip(chosen, con))
    hit_unc = sum(present(t, o) for (_, t, _), o in zip(chosen, unc))
    set_refs = [refs[i] for i, _, _ in chosen]
    set_base = [base[i] for i, _, _ in chosen]
    whole_con = list(base)
    for (i, _, _), o in zip(chosen, con):
        whole_con[i] = o
    b = {"set_unconstrained": bleu(set_base, set_refs), "set_constrained": bleu(con, set_refs),
         "whole_unconstrained": bleu(base, refs), "whole_constrained": bleu(whole_con, refs)}
    med = {k: statistics.median(v) for k, v in seconds.items()}
    same = {k: all(texts(f) == texts(v[0]) for f in v) for k, v in runs.items()}
    results = {
        **stamp(), "model": a.model, "src": a.src, "ref": a.ref, "terms_per_sentence": a.terms,
        "seed": a.seed, "precision": tr.precision, "device": str(model_device(tr.model)),
        "beam_size": tr.settings.beam_size, "alpha": tr.settings.alpha, "repeats": a.repeats,
        "sentences": len(srcs), "sentences_constrained": len(chosen), "terms_constrained": n_terms,
        "terms_dropped_for_length": dropped,
        "term_coverage_pct": round(100 * hit_con / n_terms, 2),
        "term_coverage_unconstrained_pct": round(100 * hit_unc / n_terms, 2),
        "constrained_cut_off": sum(not h[0].complete for h in runs["constrained"][0] if h),
        "unconstrained_rerun_differs": sum(x != y for x, y in zip(unc, set_base)),
        "repeats_identical": same["unconstrained"] and same["constrained"],
        "bleu_signature": b["set_unconstrained"][1],
        "bleu": {"constrained_set": {"unconstrained": b["set_unconstrained"][0],
                                     "constrained": b["set_constrained"][0]},
                 "whole_test_set": {"unconstrained": b["whole_unconstrained"][0],
                                    "constrained": b["whole_constrained"][0]}},
        "seconds": {k: [round(s, 4) for s in v] for k, v in seconds.items()},
        "median_seconds": {k: round(v, 4) for k, v in med.items()},
        "time_ratio_constrained": round(med["constrained"] / med["unconstrained"], 3),
        "constrained": [{"line": i + 1, "terms": t, "unconstrained": base[i], "constrained": o}
                        for (i, t, _), o in zip(chosen, con)],
    }
    with atomic_write(a.out) as f:
        json.dump(results, f, indent=2, ensure_ascii=False)

    print(f"\nConstrained decoding (Post & Vilar's reference-word terms): {len(chosen)} of "
          f"{len(srcs)} sentences, {n_terms} terms (up to {a.terms} each, seed {a.seed}); "
          f"{tr.precision}, beam {tr.settings.beam_size}\n")
    print("| | unconstrained | constrained |")
    print("|---|---:|---:|")
    print(f"| terms present (whole words) | {results['term_coverage_unconstrained_pct']:.1f}% "
          f"| {results['term_coverage_pct']:.1f}% |")
    print(f"| sacreBLEU, constrained set ({len(chosen)}) | {b['set_unconstrained'][0]:.2f} "
          f"| {b['set_constrained'][0]:.2f} |")
    print(f"| sacreBLEU, whole test set ({len(srcs)}) | {b['whole_unconstrained'][0]:.2f} "
          f"| {b['whole_constrained'][0]:.2f} |")
    print(f"| median seconds, constrained set ({a.repeats} runs) | {med['unconstrained']:.3f} "
          f"| {med['constrained']:.3f} |")
    print(f"\ntime ratio constrained / unconstrained: {results['time_ratio_constrained']:.2f}x")
    print(f"sacreBLEU signature: {results['bleu_signature']}")
    print(stamp_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
