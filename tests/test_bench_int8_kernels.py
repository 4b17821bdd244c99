"""benchmarks/int8_kernels.py: it finds every int8 product of a converted model, times both
kernels on each, and its in-search timing leaves the search's outputs those of the fbgemm model
while running both kernels on every projection call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import int8_kernels  # noqa: E402

from aiayn.data.model_dir import load_model  # noqa: E402
from aiayn.decoding.int8 import onednn_int8_supported  # noqa: E402
from aiayn.decoding.translate import Translator  # noqa: E402

from helpers import TEXTS, needs_int8  # noqa: E402

pytestmark = [needs_int8, pytest.mark.skipif(not onednn_int8_supported(),
                                             reason="needs oneDNN's int8 matmul")]


def test_product_shapes_cover_every_int8_layer(model_dir):
    model = Translator(load_model(model_dir), precision="int8").model
    shapes = int8_kernels.product_shapes(model)
    cfg = load_model(model_dir).cfg
    d, ff, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    by_key = {(s["in"], s["out"], s["nonnegative"], s["projection"]): s["layers"] for s in shapes}
    assert by_key[(d, v, False, True)] == 1  # the projection, on its own line
    assert by_key[(ff, d, True, False)] == 2 * cfg.n_layers  # every FFN's second product
    assert by_key[(d, ff, False, False)] >= 2 * cfg.n_layers  # (and any other d -> d_ff)
    n_int8 = sum(1 for m in model.modules() if isinstance(m, int8_kernels.Int8Linear))
    assert sum(by_key.values()) == n_int8


def test_time_kernels_times_both():
    us = int8_kernels.time_kernels(32, 48, True, 63, rows=5, reps=3)
    assert set(us) == {"fbgemm", "onednn"} and all(t > 0 for t in us.values())


def test_search_split_keeps_the_fbgemm_outputs(model_dir):
    lines = list(TEXTS[:6])
    tr = Translator(load_model(model_dir), precision="int8")
    sources = tr.prepare(lines)
    plain = tr.model.out_proj.int8
    split = int8_kernels.search_split(tr, sources)
    assert tr.model.out_proj.int8 is plain  # put back
    # the same search with a projection on fbgemm alone
    fbgemm = Translator(load_model(model_dir), precision="int8")
    fbgemm.model.out_proj.int8 = int8_kernels.Int8Linear(
        *int8_kernels.quantize_rows(fbgemm.model.out_proj.weight), None, plain.levels)
    assert split["outputs"] == [h[0].tokens for h in fbgemm.search(sources)]
    assert split["calls"] > 0 and split["rows"] >= split["calls"]
    assert all(s > 0 for s in split["projection_seconds"].values())


def test_cli_writes_json_and_refuses_to_overwrite(model_dir, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("".join(t + "\n" for t in TEXTS[:4]), encoding="utf-8")
    out = tmp_path / "k.json"
    cmd = [sys.executable, str(BENCH / "int8_kernels.py"), "--model", str(model_dir),
           "--src", str(src), "--rows", "3", "--reps", "2", "--early-stop", "current",
           "--threads", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert [s["early_stop"] for s in result["searches"]] == ["current"]
    assert result["products"] and all(p["rows"] == 3 for p in result["products"])
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr.strip().splitlines()[-1]
    missing = subprocess.run(cmd[:4] + ["--src", str(tmp_path / "none.txt")],
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "none.txt" in missing.stderr
    assert "Traceback" not in missing.stderr
