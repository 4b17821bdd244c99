"""`aiayn evaluate` end to end: the table, --json, and one-line user errors (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.cli import main as cli_main
from aiayn.evaluation import chrf, sacre_bleu, tokenized_bleu

ROOT = Path(__file__).resolve().parents[1]
REFS = ["Die Kreuz-Fahrt war sehr schön.", "Ein Mann mit einem roten Hut steht an der Straße.",
        "Zwei Hunde spielen im Schnee."]
HYPS = ["Die Kreuz-Reise war schön.", "Ein Mann mit rotem Hut steht an der Straße.",
        "Zwei Hunde spielen im Schnee."]


def run(*args: str) -> subprocess.CompletedProcess:
    """`aiayn evaluate ARGS --lang de` (these references are German and lie in no dataset)."""
    return subprocess.run([sys.executable, "-m", "aiayn", "evaluate", *args, "--lang", "de"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def files(tmp_path):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    return hyp, ref


def test_table_shows_all_three_scores_and_signatures(files):
    hyp, ref = files
    p = run("--hyp", str(hyp), "--ref", str(ref))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"{sacre_bleu(HYPS, REFS).score:.2f}" in out
    assert f"{chrf(HYPS, REFS).score:.2f}" in out
    assert f"{tokenized_bleu(HYPS, REFS, lang='de').score:.2f}" in out
    assert "tok:13a" in out and "nc:6" in out and "compound:atat" in out
    assert "compounds split" in out


def test_json_output_parses_and_lowercase_switches_to_multi30k_style(files):
    hyp, ref = files
    p = run("--hyp", str(hyp), "--ref", str(ref), "--json", "--lowercase")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["lines"] == 3
    assert d["sacrebleu"]["score"] == pytest.approx(sacre_bleu(HYPS, REFS, lowercase=True).score)
    assert "case:lc" in d["sacrebleu"]["signature"] and "case:lc" in d["chrf"]["signature"]
    lc = tokenized_bleu(HYPS, REFS, lowercase=True, normalize_punct=True, split_compounds=False)
    assert d["tokenized_bleu"]["score"] == pytest.approx(lc.score)
    assert "Multi30k" in d["tokenized_bleu"]["style"]


@pytest.mark.slow
def test_mismatched_line_counts_exit_2_with_one_line_and_no_traceback(files, tmp_path):
    hyp, _ = files
    short = tmp_path / "short.de"
    short.write_text(REFS[0] + "\n", encoding="utf-8")
    p = run("--hyp", str(hyp), "--ref", str(short))
    assert p.returncode == 2
    assert p.stdout == ""
    err = p.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"{hyp} has 3 lines" in err and f"{short} has 1" in err


def test_missing_file_and_bad_utf8_are_user_errors(files, tmp_path, capsys):
    hyp, ref = files
    assert cli_main(["evaluate", "--hyp", str(tmp_path / "nope"), "--ref", str(ref), "--lang", "de"]) == 2
    assert "nope" in capsys.readouterr().err
    bad = tmp_path / "bad.de"
    bad.write_bytes(REFS[0].encode() + b"\n" + b"Stra\xdfe\n" + REFS[2].encode() + b"\n")
    assert cli_main(["evaluate", "--hyp", str(bad), "--ref", str(ref), "--lang", "de"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and re.search(r":2:|line 2", err) and "UTF-8" in err and "\n" not in err


def test_a_missing_dependency_is_one_line_naming_the_package(files, monkeypatch, capsys):
    """Run from source without aiayn's dependencies (as on one GPU machine, without sacremoses):
    one line naming the package and how to install it, exit 2, no traceback."""
    from aiayn.evaluation import tokenized

    hyp, ref = files
    tokenized._moses.cache_clear()
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # `import sacremoses` now fails
    try:
        rc = cli_main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lang", "de"])
    finally:
        tokenized._moses.cache_clear()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("aiayn evaluate: error: the Python package 'sacremoses' is not installed")
    assert "pip install sacremoses" in err


def test_line_reading_details(tmp_path, capsys):
    # CRLF line ends, a BOM and a missing final newline still give 3 aligned lines; U+2028 inside a
    # line does not split it (str.splitlines would)
    hyp = tmp_path / "h"
    hyp.write_bytes(("\ufeff" + HYPS[0] + "\r\n" + HYPS[1] + "\u2028\r\n" + HYPS[2]).encode())
    ref = tmp_path / "r"
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    assert cli_main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", "--lang", "de"]) == 0
    assert json.loads(capsys.readouterr().out)["lines"] == 3


def test_empty_files_score_zero(tmp_path, capsys):
    (tmp_path / "h").write_text("")
    (tmp_path / "r").write_text("")
    assert cli_main(["evaluate", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"),
                     "--json", "--lang", "de"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["lines"] == 0
    assert d["sacrebleu"]["score"] == d["chrf"]["score"] == d["tokenized_bleu"]["score"] == 0.0


def test_reference_perplexity_under_a_model_matches_one_at_a_time(model_dir, tmp_path, capsys):
    import math

    import torch

    from aiayn.data.model_dir import load_model
    from aiayn.special import BOS_ID, EOS_ID

    srcs = ["the cat sat on the mat", "ein hund", "die kinder spielen im garten im park"]
    refs = ["die katze sitzt", "a dog runs in the park", "the children play"]
    (tmp_path / "s.txt").write_text("\n".join(srcs) + "\n")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n")
    assert cli_main(["evaluate", "--ref", str(tmp_path / "r.txt"), "--src", str(tmp_path / "s.txt"),
                     "--model", str(model_dir), "--json", "--precision", "fp32"]) == 0
    got = json.loads(capsys.readouterr().out)["perplexity"]

    m = load_model(model_dir)
    nll, n = 0.0, 0
    with torch.no_grad():
        for s, r in zip(srcs, refs):
            src = torch.tensor([m.src_tokenizer.encode(s) + [EOS_ID]])
            tgt = m.tgt_tokenizer.encode(r) + [EOS_ID]
            logp = m.model(src, torch.tensor([[BOS_ID] + tgt[:-1]]))[0].log_softmax(-1)
            nll -= sum(logp[i, t].item() for i, t in enumerate(tgt))
            n += len(tgt)
    assert got["n_tokens"] == n
    assert got["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-4)


def test_model_needs_src(files, model_dir):
    r = run("--ref", str(files[1]), "--model", str(model_dir))
    assert r.returncode == 2 and "--model and --src go together" in r.stderr
