"""tools/int8_kernels.py: it finds every int8 product of a converted model, times both kernels on
each, and its in-search timing leaves the search's outputs those of the fbgemm model while
running both kernels on every projection call; it writes JSON and refuses to overwrite."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from aiayn.data.model_dir import load_model
from aiayn.decoding.int8 import Int8Linear, onednn_int8_supported, quantize_rows
from aiayn.decoding.translate import Translator

from helpers import REPO, TEXTS, needs_int8

pytestmark = [needs_int8, pytest.mark.skipif(not onednn_int8_supported(),
                                             reason="needs oneDNN's int8 matmul")]


@pytest.mark.slow
def test_products_kernels_and_search_split(model_dir, tmp_path):
    lines = list(TEXTS[:6])
    src = tmp_path / "src.txt"
    src.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    out = tmp_path / "k.json"
    cmd = [sys.executable, str(REPO / "tools" / "int8_kernels.py"), "--model", str(model_dir),
           "--src", str(src), "--rows", "3", "--reps", "2", "--early-stop", "current",
           "--threads", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())

    # every int8 product of the converted model, each shape once (with its layer count)
    model = Translator(load_model(model_dir), precision="int8").model
    by_key = {(s["in"], s["out"], s["nonnegative"], s["projection"]): s["layers"]
              for s in result["products"]}
    cfg = load_model(model_dir).cfg
    d, ff, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    assert by_key[(d, v, False, True)] == 1  # the projection, on its own line
    assert by_key[(ff, d, True, False)] == 2 * cfg.n_layers  # every FFN's second product
    assert by_key[(d, ff, False, False)] >= 2 * cfg.n_layers  # (and any other d -> d_ff)
    n_int8 = sum(1 for m in model.modules() if isinstance(m, Int8Linear))
    assert sum(by_key.values()) == n_int8
    # both kernels timed on each, at the rows asked for
    assert result["products"] and all(p["rows"] == 3 for p in result["products"])
    assert all(set(p["us"]) == {"fbgemm", "onednn"} and all(t > 0 for t in p["us"].values())
               for p in result["products"])

    # the search with both kernels in the projection: the outputs of one on fbgemm alone
    [split] = result["searches"]
    assert split["early_stop"] == "current"
    fbgemm = Translator(load_model(model_dir), precision="int8", early_stop="current")
    plain = fbgemm.model.out_proj.int8
    fbgemm.model.out_proj.int8 = Int8Linear(*quantize_rows(fbgemm.model.out_proj.weight), None,
                                            plain.levels)
    outputs = [h[0].tokens for h in fbgemm.search(fbgemm.prepare(lines))]
    assert split["outputs_sha256"] == hashlib.sha256(json.dumps(outputs).encode()).hexdigest()
    assert split["calls"] > 0 and split["rows"] >= split["calls"]
    assert all(s > 0 for s in split["projection_seconds"].values())

    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr.strip().splitlines()[-1]
    missing = subprocess.run(cmd[:4] + ["--src", str(tmp_path / "none.txt")],
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "none.txt" in missing.stderr
    assert "Traceback" not in missing.stderr
