"""benchmarks/translate_e2e.py's CTranslate2 row searches the lengths aiayn searches: its calls
cap every sentence's output at least at aiayn's own cap, and at most at the cap of the longest
source in its call (a stand-in ctranslate2 module records the calls), and the cap is the model's
config's; the whole script end to end on a micro model."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import pytest
import sentencepiece as spm
import torch

from aiayn.decoding.common import max_output_lengths

from helpers import REPO, TEXTS

SCRIPT = REPO / "benchmarks" / "translate_e2e.py"

# What the CTranslate2 row's process calls, recorded: each call's source lengths, cap and batch
# size; every hypothesis is its source, so the output file shows which sentence went where.
FAKE_CTRANSLATE2 = '''
import json, os


class Translator:
    def __init__(self, model, **kwargs):
        self.log = os.environ["FAKE_CT2_LOG"]

    def translate_batch(self, batch, beam_size, max_batch_size, max_decoding_length, **kwargs):
        with open(self.log, "a") as f:
            f.write(json.dumps({"lengths": [len(p) for p in batch], "limit": max_decoding_length,
                                "max_batch_size": max_batch_size}) + "\\n")
        return [type("Result", (), {"hypotheses": [list(p)]})() for p in batch]
'''


def test_ct2_calls_cap_outputs_as_aiayn_does(model_dir, tmp_path):
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "ctranslate2.py").write_text(FAKE_CTRANSLATE2)
    rng = random.Random(0)
    words = " ".join(TEXTS).split()
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))) for _ in range(203)]
    src = tmp_path / "src.txt"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    pieces = sp.encode(lines, out_type=str)
    lengths = [len(p) for p in pieces]
    for a, b in ((1.0, 50), (1.5, 10), (0.0, 7)):
        log, out = tmp_path / f"calls-{a}-{b}.jsonl", tmp_path / f"out-{a}-{b}.txt"
        subprocess.run([sys.executable, str(SCRIPT), "--ct2-child", str(model_dir), str(src), str(out),
                        "--compute-type", "int8", "--threads", "1", "--ct2-batch", "64",
                        "--ct2-cap", str(a), str(b)], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "fake"),
                            "FAKE_CT2_LOG": str(log)})
        # every sentence once, in its own line: each output is its own source
        assert out.read_text(encoding="utf-8").splitlines() == [sp.decode(p) for p in pieces]
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        seen = [n for c in calls for n in c["lengths"]]
        assert len(seen) == len(lengths) and seen == sorted(lengths, reverse=True)  # longest first
        assert all(len(c["lengths"]) <= 64 and c["max_batch_size"] == 64 for c in calls)
        mask = torch.zeros(len(lengths), max(lengths) + 1, dtype=torch.bool)  # pieces + EOS
        for i, n in enumerate(lengths):
            mask[i, : n + 1] = True
        own = dict(zip(lengths, max_output_lengths(mask, a, b).tolist()))
        for c in calls:
            assert c["limit"] == max(own[n] for n in c["lengths"])  # the longest's, nobody cut short


@pytest.mark.slow
def test_output_cap_reads_the_models_config(model_dir, tmp_path):
    """End to end: aiayn fp32 and CTranslate2 int8 on the micro model, the CTranslate2 row capped
    at the model's config.json's max_len_a and max_len_b."""
    pytest.importorskip("ctranslate2")
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "max_len_a": 1.2, "max_len_b": 30}))
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(t + "\n" for t in TEXTS[:4]), encoding="utf-8")
    ref.write_text("".join(t + "\n" for t in TEXTS[:4]), encoding="utf-8")
    out = tmp_path / "e2e"
    subprocess.run([sys.executable, str(SCRIPT), "--model", str(model), "--src", str(src),
                    "--ref", str(ref), "--out", str(out), "--precisions", "fp32", "--ct2", "int8",
                    "--threads", "1", "--cpus", "0"], check=True, capture_output=True, text=True)
    results = json.loads((out / "results.json").read_text())
    assert {"commit", "clean", "machine"} <= set(results)  # where the figures come from
    rows = {r["system"]: r for r in results["rows"]}
    assert set(rows) == {"aiayn translate --precision fp32", "CTranslate2 int8 (Python)"}
    assert "--ct2-cap 1.2 30" in rows["CTranslate2 int8 (Python)"]["command"]
    assert len((out / "ct2-int8.hyp").read_text(encoding="utf-8").splitlines()) == 4
    assert all(r["seconds"] > 0 and r["sacrebleu"] >= 0 for r in rows.values())
