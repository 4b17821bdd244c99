"""Which sentence splitter should `aiayn translate --documents` use? Each one a user would pick,
measured on paragraphs whose sentence boundaries are known, in the languages at hand.

1. Paragraphs: `--paragraphs` runs of 2 to 5 consecutive lines (one sentence a line) of the
   `--splits` files (DIR/SPLIT.LANG.gz, or DIR/SPLIT.LANG), each run drawn at random (`--seed`)
   within one split, its lines' white space collapsed and joined by single spaces. The files of
   every language are parallel (Multi30k), so every language gets the same runs.
2. Each splitter importable in the running Python splits every paragraph: sentencex through
   aiayn's own `split_sentences` (what `--documents` runs), pysbd (`clean=False`), blingfire,
   syntok, NLTK's punkt where its data is already on this machine (never downloaded), and a
   regex baseline (a break after . ! or ? followed by white space and an uppercase letter).
   One that cannot be imported, or has no rules for a language, is reported "not installed".
3. A boundary is where a sentence starts inside its paragraph, counted in non-space characters
   (so a splitter that changes white space is scored on the same positions); the gold ones are
   where the joined lines start.

Reported per splitter and language: % of paragraphs split exactly right (every boundary and no
other); boundary precision, recall and F1 (%, summed over all paragraphs); sentences (gold) per
second of splitting, the fastest of `--repeats` passes over all paragraphs (perf_counter, this
process, one thread). A line without final punctuation ends with a boundary that no splitter
can see: "reachable_recall_pct" is the share of gold boundaries after . ! ? (or a closing quote
or bracket after one), the recall a splitter that finds every visible boundary gets.

    nice -n 19 .venv/bin/python benchmarks/sentence_split.py --data /work/shared/data/multi30k \\
        --langs en de fr --paragraphs 2000 --seed 0 --out results.json

Torch-free: only the standard library, the splitters and aiayn.decoding.documents.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import importlib.metadata
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(REPO))

from provenance import stamp, stamp_line  # noqa: E402

SPLITTERS = ("sentencex", "pysbd", "blingfire", "syntok", "nltk-punkt", "regex")
PUNKT_NAMES = {"en": "english", "de": "german", "fr": "french", "es": "spanish",
               "it": "italian", "nl": "dutch", "pt": "portuguese", "cs": "czech"}
TERMINAL = re.compile(r"[.!?][\"'»“”’)\]]*$")
REGEX_BREAK = re.compile(r"[.!?]\s+")

Split = Callable[[str], list[str]]


class NotInstalled(Exception):
    """A splitter, or its rules for one language, is not on this machine."""


def regex_split(text: str) -> list[str]:
    """The baseline: a break after . ! or ? followed by white space and an uppercase letter."""
    out, start = [], 0
    for m in REGEX_BREAK.finditer(text):
        if m.end() < len(text) and text[m.end()].isupper():
            out.append(text[start:m.end()])
            start = m.end()
    out.append(text[start:])
    return out


def make_splitter(name: str, lang: str) -> Split:
    """`name`'s splitting function for language `lang` (an ISO 639-1 code); NotInstalled where
    the library or its rules for `lang` are absent."""
    def need(module: str):
        try:
            return importlib.import_module(module)
        except ImportError as e:
            raise NotInstalled(f"{module} cannot be imported ({e})") from None

    if name == "regex":
        return regex_split
    if name == "sentencex":
        need("sentencex")
        from aiayn.decoding.documents import split_sentences
        return lambda text: split_sentences(text, lang)
    if name == "pysbd":
        pysbd = need("pysbd")
        try:
            seg = pysbd.Segmenter(language=lang, clean=False)
        except ValueError as e:
            raise NotInstalled(f"pysbd has no rules for {lang!r} ({e})") from None
        return seg.segment
    if name == "blingfire":
        blingfire = need("blingfire")
        return lambda text: blingfire.text_to_sentences(text).split("\n")
    if name == "syntok":
        segmenter = need("syntok.segmenter")

        def syntok_split(text: str) -> list[str]:
            starts = [s[0].offset for para in segmenter.analyze(text) for s in para if s]
            starts[:1] = [0]
            return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
        return syntok_split
    if name == "nltk-punkt":
        need("nltk")
        from nltk.tokenize import sent_tokenize
        language = PUNKT_NAMES.get(lang)
        if language is None:
            raise NotInstalled(f"no punkt model is named for {lang!r}")
        try:  # loads the local data, or raises LookupError: nltk never downloads by itself
            sent_tokenize("A test. Another one.", language=language)
        except LookupError:
            raise NotInstalled(f"nltk is installed but its punkt data for {language} is not "
                               "on this machine (not downloaded)") from None
        return lambda text: sent_tokenize(text, language=language)
    raise ValueError(f"unknown splitter {name!r}")


def version(name: str) -> str | None:
    dist = {"nltk-punkt": "nltk", "regex": None}.get(name, name)
    if dist is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def read_lines(data: Path, split: str, lang: str) -> list[str]:
    """The lines of DIR/SPLIT.LANG.gz (or DIR/SPLIT.LANG), white space collapsed."""
    gz, plain = data / f"{split}.{lang}.gz", data / f"{split}.{lang}"
    if gz.is_file():
        with gzip.open(gz, "rt", encoding="utf-8") as f:
            raw = f.read().splitlines()
    elif plain.is_file():
        raw = plain.read_text(encoding="utf-8").splitlines()
    else:
        sys.exit(f"sentence_split: neither {gz} nor {plain} exists")
    return [" ".join(line.split()) for line in raw]


def draw_runs(sizes: list[int], blank: set[tuple[int, int]], n: int, seed: int
              ) -> list[tuple[int, int, int]]:
    """`n` runs (split index, first line, length 2-5), each within one split of `sizes` lines
    and holding no line in `blank`, drawn uniformly among those of its length."""
    rng = random.Random(seed)
    starts_of = {length: [(s, i) for s, size in enumerate(sizes)
                          for i in range(size - length + 1)
                          if not any((s, i + j) in blank for j in range(length))]
                 for length in range(2, 6)}
    runs = []
    for _ in range(n):
        length = rng.randint(2, 5)
        starts = starts_of[length]
        if not starts:
            sys.exit(f"sentence_split: no run of {length} non-blank lines in the splits")
        s, i = rng.choice(starts)
        runs.append((s, i, length))
    return runs


def boundaries(sentences: list[str]) -> list[int]:
    """Where each sentence after the first starts, in non-space characters from the start."""
    out, pos = [], 0
    for s in sentences[:-1]:
        pos += sum(not ch.isspace() for ch in s)
        out.append(pos)
    return out


def score(split: Split, paragraphs: list[str], gold: list[list[int]]) -> dict:
    """Exact paragraphs, boundary precision, recall and F1 (%) of `split` on `paragraphs`."""
    exact = tp = n_pred = n_gold = altered = 0
    for text, want in zip(paragraphs, gold):
        got = [s for s in split(text) if s.strip()]
        if sum(len("".join(s.split())) for s in got) != len("".join(text.split())):
            altered += 1  # the splitter changed the text: its boundaries are scored as counted
        pred = set(boundaries(got))
        exact += pred == set(want)
        tp += len(pred & set(want))
        n_pred += len(pred)
        n_gold += len(want)
    p = 100.0 * tp / n_pred if n_pred else 0.0
    r = 100.0 * tp / n_gold if n_gold else 0.0
    return {"exact_paragraphs_pct": 100.0 * exact / len(paragraphs), "precision_pct": p,
            "recall_pct": r, "f1_pct": 2 * p * r / (p + r) if p + r else 0.0,
            "predicted_boundaries": n_pred, "correct_boundaries": tp, "text_altered": altered}


def speed(split: Split, paragraphs: list[str], sentences: int, repeats: int) -> dict:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for text in paragraphs:
            split(text)
        best = min(best, time.perf_counter() - t0)
    return {"seconds": best, "sentences_per_s": sentences / best if best > 0 else None}


def table(results: dict) -> str:
    langs = results["langs"]
    rows = ["| splitter | " + " | ".join(f"{g} exact % | {g} F1 | {g} sent/s" for g in langs)
            + " |", "|---|" + "---:|" * (3 * len(langs))]
    for name, entry in results["splitters"].items():
        cells = []
        for g in langs:
            m = entry["languages"][g]
            if m["status"] != "measured":
                cells += ["not installed", "", ""]
            else:
                cells += [f"{m['exact_paragraphs_pct']:.1f}", f"{m['f1_pct']:.1f}",
                          f"{m['sentences_per_s']:,.0f}"]
        label = name + (f" {entry['version']}" if entry["version"] else "")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    reach = ", ".join(f"{g} {results['corpus'][g]['reachable_recall_pct']:.1f}%" for g in langs)
    return "\n".join(rows) + f"\n\nGold boundaries after final punctuation: {reach}."


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="DIR with SPLIT.LANG(.gz) files")
    ap.add_argument("--langs", nargs="+", default=["en", "de", "fr"])
    ap.add_argument("--splits", nargs="+", default=["test_2016_flickr", "val"])
    ap.add_argument("--paragraphs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes; the fastest counts")
    ap.add_argument("--splitters", nargs="+", default=list(SPLITTERS), choices=SPLITTERS)
    ap.add_argument("--out", type=Path, required=True, help="results JSON (never overwritten)")
    a = ap.parse_args(argv)
    if a.out.exists():
        sys.exit(f"sentence_split: {a.out} exists; not overwriting it")
    if a.paragraphs < 1 or a.repeats < 1:
        sys.exit("sentence_split: --paragraphs and --repeats must be at least 1")

    lines = {g: [read_lines(a.data, s, g) for s in a.splits] for g in a.langs}
    sizes = [len(x) for x in lines[a.langs[0]]]
    for g in a.langs:
        if [len(x) for x in lines[g]] != sizes:
            sys.exit(f"sentence_split: the {g} files are not parallel to the {a.langs[0]} ones")
    blank = {(s, i) for g in a.langs for s, x in enumerate(lines[g]) for i, t in enumerate(x)
             if not t}
    runs = draw_runs(sizes, blank, a.paragraphs, a.seed)

    results: dict = {**stamp(), "benchmark": "sentence_split", "data": str(a.data),
                     "splits": a.splits, "langs": a.langs, "paragraphs": a.paragraphs,
                     "seed": a.seed, "repeats": a.repeats,
                     "python": sys.version.split()[0], "corpus": {}, "splitters": {}}
    corpus = {}
    for g in a.langs:
        runs_text = [lines[g][s][i:i + n] for s, i, n in runs]
        paragraphs = [" ".join(r) for r in runs_text]
        gold = [boundaries(r) for r in runs_text]
        n_gold = sum(len(b) for b in gold)
        visible = sum(bool(TERMINAL.search(t)) for r in runs_text for t in r[:-1])
        corpus[g] = (paragraphs, gold, sum(len(r) for r in runs_text))
        results["corpus"][g] = {"paragraphs": len(paragraphs), "sentences": corpus[g][2],
                                "gold_boundaries": n_gold,
                                "reachable_recall_pct": 100.0 * visible / n_gold}
    for name in a.splitters:
        entry: dict = {"version": version(name), "languages": {}}
        for g in a.langs:
            paragraphs, gold, n_sent = corpus[g]
            try:
                split = make_splitter(name, g)
            except NotInstalled as e:
                entry["languages"][g] = {"status": "not installed", "reason": str(e)}
                continue
            m = {"status": "measured", **score(split, paragraphs, gold),
                 **speed(split, paragraphs, n_sent, a.repeats)}
            entry["languages"][g] = m
            print(f"{name} {g}: exact {m['exact_paragraphs_pct']:.1f}%, "
                  f"F1 {m['f1_pct']:.1f}%, {m['sentences_per_s']:,.0f} sentences/s",
                  file=sys.stderr)
        measured = [v for v in entry["languages"].values() if v["status"] == "measured"]
        entry["status"] = "measured" if measured else "not installed"
        results["splitters"][name] = entry
    # the paragraphs, as [split index, first line, length] each, on one line of the file
    runs_json = json.dumps([list(r) for r in runs], separators=(",", ":"))
    text = json.dumps(results, indent=1, ensure_ascii=False)
    text = text[:text.rindex("}")].rstrip() + f',\n "runs": {runs_json}\n}}\n'

    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "x", encoding="utf-8") as f:
        f.write(text)
    print(table(results))
    print()
    print(stamp_line(results))


if __name__ == "__main__":
    main()
