"""benchmarks/recipe_results.py: a finished recipe run (a real, tiny `aiayn train`, scored by
`aiayn evaluate --json`) becomes one results file holding those scores, the run's updates and
the provenance stamp; it never replaces a file and says in one line what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import REPO, run_cli, tiny_dataset

SCRIPT = REPO / "benchmarks" / "recipe_results.py"


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_recipe_run_becomes_one_stamped_results_file(tmp_path):
    out = tmp_path / "recipe"
    data = tiny_dataset(tmp_path / "d")
    r = run_cli("train", "--data", str(data), "--out", str(out / "run"), "--preset", "base",
                "--set", "n_layers=1", "d_model=32", "d_ff=64", "n_heads=2", "max_tokens=512",
                "--max-steps", "3", "--precision", "fp32")
    assert r.returncode == 0, r.stderr
    ref = data / "valid.tgt.txt"
    lines = ref.read_text(encoding="utf-8").splitlines()
    hyp = tmp_path / "hyp.txt"  # half the lines right, so the scores are neither 0 nor 100
    hyp.write_text("".join((t if i % 2 else "x") + "\n" for i, t in enumerate(lines)),
                   encoding="utf-8")
    expected = {}
    for split in ("valid", "test"):
        for suffix, extra in (("", []), ("-lc", ["--lowercase"])):
            e = run_cli("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lang", "en",
                        "--json", *extra)
            assert e.returncode == 0, e.stderr
            (out / f"{split}.scores{suffix}.json").write_text(e.stdout)
            expected[split, suffix] = json.loads(e.stdout)
    results = tmp_path / "r" / "run.json"
    done = script("--out-dir", str(out), "--results", str(results))
    assert done.returncode == 0, done.stderr
    record = json.loads(results.read_text())
    assert {"commit", "clean", "machine"} <= set(record)
    assert record["steps"] == 3 and record["precision"] == "fp32"
    test = record["scores"]["test"]
    assert test["sacrebleu"] == expected["test", ""]["sacrebleu"]["score"]
    assert test["lowercased_tokenized_bleu"] == expected["test", "-lc"]["tokenized_bleu"]["score"]
    assert 0 < test["sacrebleu"] < 100
    assert f"{test['sacrebleu']:.2f}" in done.stdout  # the markdown row
    again = script("--out-dir", str(out), "--results", str(results))
    assert again.returncode != 0 and "exists" in again.stderr
    (out / "test.scores.json").unlink()
    missing = script("--out-dir", str(out), "--results", str(tmp_path / "other.json"))
    assert missing.returncode != 0
    assert missing.stderr.strip().count("\n") == 0 and "test.scores.json" in missing.stderr
