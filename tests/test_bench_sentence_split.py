"""benchmarks/sentence_split.py on tiny parallel files: its paragraphs are runs of 2-5 lines of
one split, every splitter is measured or reported "not installed", and the regex baseline's
figures are those of an independent computation (a character loop, not a regular expression)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers import REPO

SCRIPT = REPO / "benchmarks" / "sentence_split.py"

# one sentence a line, parallel across languages; abbreviations and a line with no final stop
LINES = {
    "en": ["A man rides a bike.", "Dr. Smith talks to a nurse.", "Two dogs play in the snow!",
           "Is the child asleep?", "A woman sings on a stage", "The team wins the game.",
           "Mr. Brown sells fruit at the market.", "A boy jumps into a lake.",
           "People wait for the bus, e.g. students.", "A cat sleeps on a sofa.",
           "Three girls dance.", "A chef cooks in a kitchen.", "It rains in the city.",
           "An old man reads a paper.", "The sun sets over the sea.", "A dog fetches a ball.",
           "Workers build a house.", "A baby laughs.", "Kids swim in a pool.",
           "A bird sits on a branch."],
    "de": ["Ein Mann fährt Fahrrad.", "Dr. Schmidt spricht mit einer Pflegerin.",
           "Zwei Hunde spielen im Schnee!", "Schläft das Kind?", "Eine Frau singt auf einer Bühne",
           "Die Mannschaft gewinnt das Spiel.", "Herr Braun verkauft z. B. Obst auf dem Markt.",
           "Ein Junge springt in einen See.", "Leute warten auf den Bus, z. B. Schüler.",
           "Eine Katze schläft auf einem Sofa.", "Drei Mädchen tanzen.",
           "Ein Koch kocht in einer Küche.", "Es regnet in der Stadt.",
           "Ein alter Mann liest eine Zeitung.", "Die Sonne geht über dem Meer unter.",
           "Ein Hund holt einen Ball.", "Arbeiter bauen ein Haus.", "Ein Baby lacht.",
           "Kinder schwimmen in einem Becken.", "Ein Vogel sitzt auf einem Ast."],
    "fr": ["Un homme fait du vélo.", "M. Dupont parle à une infirmière.",
           "Deux chiens jouent dans la neige !", "L'enfant dort-il ?",
           "Une femme chante sur une scène", "L'équipe gagne le match.",
           "Mme Brun vend des fruits au marché.", "Un garçon saute dans un lac.",
           "Des gens attendent le bus, p. ex. des élèves.", "Un chat dort sur un canapé.",
           "Trois filles dansent.", "Un cuisinier cuisine.", "Il pleut en ville.",
           "Un vieil homme lit un journal.", "Le soleil se couche sur la mer.",
           "Un chien rapporte une balle.", "Des ouvriers construisent une maison.",
           "Un bébé rit.", "Des enfants nagent.", "Un oiseau est sur une branche."],
}
SPLITS = {"test_2016_flickr": slice(0, 12), "val": slice(12, 20)}
LIBRARIES = {"pysbd": "pysbd", "blingfire": "blingfire", "syntok": "syntok"}
PCT = ("exact_paragraphs_pct", "precision_pct", "recall_pct", "f1_pct")


def nonspace(text: str) -> int:
    return sum(not ch.isspace() for ch in text)


def regex_boundaries(text: str) -> set[int]:
    """Breaks after . ! or ? followed by white space and an uppercase letter, found by walking
    the characters; each as the count of non-space characters before it."""
    out = set()
    for i, ch in enumerate(text):
        if ch in ".!?" and i + 1 < len(text) and text[i + 1].isspace():
            j = i + 1
            while j < len(text) and text[j].isspace():
                j += 1
            if j < len(text) and text[j].isupper():
                out.add(nonspace(text[:j]))
    return out


def test_splitters_measured_and_regex_baseline_recomputed(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for lang, lines in LINES.items():
        for split, part in SPLITS.items():
            with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines[part]))
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(SCRIPT), "--data", str(data), "--langs", "en", "de", "fr",
           "--paragraphs", "40", "--seed", "3", "--repeats", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| regex |" in done.stdout and "Commit: " in done.stdout

    r = json.loads(out.read_text(encoding="utf-8"))
    assert {"commit", "clean", "machine"} <= set(r) and r["machine"]
    assert r["paragraphs"] == 40 and r["langs"] == ["en", "de", "fr"]
    assert r["splits"] == ["test_2016_flickr", "val"]
    assert set(r["splitters"]) == {"sentencex", "pysbd", "blingfire", "syntok", "nltk-punkt",
                                   "regex"}

    for name, entry in r["splitters"].items():
        assert set(entry["languages"]) == {"en", "de", "fr"}
        for lang, m in entry["languages"].items():
            assert m["status"] in ("measured", "not installed"), (name, lang)
            if m["status"] == "not installed":
                assert m["reason"]
                continue
            for key in PCT:
                assert 0 <= m[key] <= 100, (name, lang, key)
            assert m["sentences_per_s"] > 0 and m["correct_boundaries"] <= m["predicted_boundaries"]
        if name in LIBRARIES and importlib.util.find_spec(LIBRARIES[name]) is None:
            assert entry["status"] == "not installed"
            assert all(m["status"] == "not installed" for m in entry["languages"].values())
    assert r["splitters"]["sentencex"]["status"] == "measured"  # the product's splitter
    assert r["splitters"]["sentencex"]["version"]

    # the paragraphs: runs of 2-5 lines of one split, the same runs in every language
    sizes = [len(LINES["en"][SPLITS[s]]) for s in r["splits"]]
    runs = r["runs"]
    assert len(runs) == 40
    assert all(2 <= n <= 5 and 0 <= i and i + n <= sizes[s] for s, i, n in runs)
    assert len({tuple(x) for x in runs}) > 1

    for lang in ("en", "de", "fr"):
        parts = [LINES[lang][SPLITS[s]] for s in r["splits"]]
        exact = tp = n_pred = n_gold = 0
        for s, i, n in runs:
            sentences = parts[s][i:i + n]
            text = " ".join(sentences)
            gold = {nonspace("".join(sentences[:k])) for k in range(1, n)}
            pred = regex_boundaries(text)
            exact += pred == gold
            tp += len(pred & gold)
            n_pred += len(pred)
            n_gold += len(gold)
        c = r["corpus"][lang]
        assert c["paragraphs"] == 40 and c["gold_boundaries"] == n_gold
        assert c["sentences"] == sum(n for _, _, n in runs)
        m = r["splitters"]["regex"]["languages"][lang]
        assert m["status"] == "measured"
        assert (m["predicted_boundaries"], m["correct_boundaries"]) == (n_pred, tp)
        p, rec = 100 * tp / n_pred, 100 * tp / n_gold
        assert m["exact_paragraphs_pct"] == pytest.approx(100 * exact / 40)
        assert m["precision_pct"] == pytest.approx(p)
        assert m["recall_pct"] == pytest.approx(rec)
        assert m["f1_pct"] == pytest.approx(2 * p * rec / (p + rec))
        assert m["text_altered"] == 0

    # an existing --out is never overwritten
    before = out.read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode != 0 and "exists" in again.stderr
    assert out.read_bytes() == before
