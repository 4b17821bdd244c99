"""tools/encoder_collapse.py: a model that reads its source against the same model with its
encoder forced to collapse (every position mapped to one vector), and its position similarity
against one computed here from the encoder's own outputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aiayn.data.model_dir import load_model, save_model
from aiayn.decoding.common import source_batch

from helpers import REPO, TEXTS, reverser_model_dir

TOOL = REPO / "tools" / "encoder_collapse.py"


def collapse(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                          text=True)


def figures(model: Path, src: Path, ref: Path | None = None) -> dict:
    done = collapse("--model", model, "--src", src, *(["--ref", ref] if ref else []), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def reverser(tmp_path_factory) -> Path:
    return reverser_model_dir(tmp_path_factory.mktemp("reverser"))


def test_position_similarity_against_the_encoders_outputs(reverser, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("".join(t + "\n" for t in TEXTS[:6]), encoding="utf-8")
    got = figures(reverser, src)["layers"]
    loaded = load_model(reverser)
    model = loaded.model.eval()
    x, mask = source_batch([loaded.src_tokenizer.encode(t) for t in TEXTS[:6]])
    outs = []  # the embeddings (layer 0), then each encoder layer's output
    model.encoder[0].register_forward_pre_hook(lambda m, a: outs.append(a[0]))
    for layer in model.encoder:
        layer.register_forward_hook(lambda m, a, o: outs.append(o[0]))
    with torch.no_grad():
        model.encode(x, mask)

    def by_hand(h: torch.Tensor) -> float:  # per sentence: cosine over ordered pairs i != j
        per = []
        for b in range(h.size(0)):
            v = h[b][mask[b]]  # real positions only
            n = len(v)
            per.append(sum(float(F.cosine_similarity(v[i], v[j], dim=0))
                           for i in range(n) for j in range(n) if i != j) / (n * (n - 1)))
        return sum(per) / len(per)

    assert mask.sum(1).min() < mask.size(1)  # padding is there, and must count for nothing
    assert [s["layer"] for s in got] == list(range(len(outs))) == [0, 1, 2]
    for s, h in zip(got, outs):
        assert s["similarity"] == pytest.approx(by_hand(h), abs=1e-5)


@pytest.mark.slow
def test_a_reading_model_is_told_apart_from_a_collapsed_one(reverser, tmp_path):
    loaded = load_model(reverser)
    tok = loaded.src_tokenizer
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    lines = [t for t in TEXTS if len(tok.encode(t)) >= 3][:6]
    src.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    # the reverser's targets: its source pieces reversed (one vocabulary for both sides)
    ref.write_text("".join(tok.decode(tok.encode(t)[::-1]) + "\n" for t in lines), encoding="utf-8")
    reading = figures(reverser, src, ref)
    assert [s["layer"] for s in reading["layers"]] == [0, 1, 2]
    assert reading["layers"][-1]["similarity"] < 0.9
    shares = reading["cross_entropy_share"]
    assert len(shares) == 2 and min(shares) < 0.8  # the reverser looks at particular words

    # a huge constant added by each FFN swamps the residual stream under post-norm
    model = loaded.model
    with torch.no_grad():
        for layer in model.encoder:
            layer.ffn.w2.bias.copy_(torch.linspace(-1, 1, 32) * 1e4)
    broken = save_model(tmp_path / "broken", model, loaded.cfg, {"spm.model": reverser / "spm.model"})
    got = figures(broken, src, ref)
    last = got["layers"][-1]
    assert last["similarity"] > 0.999
    assert last["ffn_norm"] > 100 * last["residual_norm"]
    assert min(got["cross_entropy_share"]) > 0.99


@pytest.mark.slow
def test_cli_prints_the_table_and_rejects_a_missing_file(reverser, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("hello world\nthe cat sat\n", encoding="utf-8")
    done = collapse("--model", reverser, "--src", src, "--ref", src)
    assert done.returncode == 0, done.stderr
    assert "position similarity" in done.stdout and "entropy / uniform" in done.stdout
    done = collapse("--model", reverser, "--src", tmp_path / "nope.txt")
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and "nope.txt" in done.stderr
    assert "Traceback" not in done.stderr
