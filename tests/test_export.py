"""`aiayn export --format ctranslate2`: the exported model decodes exactly as aiayn does.

The models are trained for a few seconds to reverse their input, so their greedy outputs depend on
every part of the network (positions above all), differ from sentence to sentence and mostly end
with EOS. CTranslate2's greedy search must give the same token ids as `greedy_search`, and its
teacher-forced log-probabilities the same values as our model's log-softmax.
"""

from __future__ import annotations

import random
import sys
from dataclasses import replace

import pytest
import torch

from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model, save_model
from aiayn.decoding.common import source_batch
from aiayn.errors import UserError
from aiayn.model import build_model
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

from helpers import greedy_search
from helpers import reverser_model_dir as _model_dir

MAX_LEN = 10
# aiayn's searches never emit PAD or BOS; CTranslate2 must be told (see aiayn/export/ctranslate2.py).
SUPPRESS = [["<pad>"], ["<s>"]]

def _ct2():
    return pytest.importorskip("ctranslate2")


def _sources(vocab: int, n: int = 16, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(1, 9))] for _ in range(n)]


def _ct2_greedy(translator, loaded, sources: list[list[int]]) -> list[list[int]]:
    src_tok, tgt_tok = loaded.src_tokenizer, loaded.tgt_tokenizer
    results = translator.translate_batch(
        [[src_tok.id_to_piece(i) for i in s] for s in sources], beam_size=1,
        max_decoding_length=MAX_LEN, suppress_sequences=SUPPRESS)
    return [[tgt_tok.piece_to_id(p) for p in r.hypotheses[0]] for r in results]


def _teacher_forced(model, sources, targets) -> list[list[float]]:
    """Our log p(y_t | y_<t, x) of each target token, EOS appended."""
    src, src_mask = source_batch(sources)
    width = max(map(len, targets)) + 1
    tgt_in = torch.full((len(targets), width), PAD_ID)
    for i, t in enumerate(targets):
        tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID] + t)
    with torch.no_grad():
        logp = model(src, tgt_in, src_mask).log_softmax(-1)  # (B, T, V)
    return [[float(logp[i, j, y]) for j, y in enumerate(t + [EOS_ID])] for i, t in enumerate(targets)]


VARIANTS = {
    "paper": {},  # post-norm, sinusoids, shared and tied vocabulary
    "learned-prenorm-bias": dict(positions="learned", max_positions=32, norm="pre", attn_bias=True),
    "separate-vocab": dict(separate=True, tie_output=False),
    "head-size": dict(d_k=16, d_v=16, n_heads=2),  # d_k != d_model / h (Table 3 rows A, B)
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def exported(request, tmp_path_factory):
    ctranslate2 = _ct2()
    root = tmp_path_factory.mktemp(request.param)
    model_dir = _model_dir(root, **VARIANTS[request.param])
    assert cli_main(["export", "--format", "ctranslate2", "--model", str(model_dir), "--out",
                     str(root / "ct2")]) == 0
    translator = ctranslate2.Translator(str(root / "ct2"), device="cpu", intra_threads=1)
    return load_model(model_dir), translator, root / "ct2"


@pytest.mark.slow
def test_ctranslate2_greedy_equals_aiayn_greedy(exported):
    loaded, translator, _ = exported
    sources = _sources(loaded.cfg.src_vocab)
    src, src_mask = source_batch(sources)
    ours = greedy_search(loaded.model, src, src_mask, max_len_a=0, max_len_b=MAX_LEN)
    assert _ct2_greedy(translator, loaded, sources) == [h.tokens for h in ours]
    # The comparison can fail: outputs differ between sentences, and most end with EOS.
    assert len({tuple(h.tokens) for h in ours}) >= len(sources) // 2
    assert sum(h.complete for h in ours) >= len(sources) // 2


def test_ctranslate2_log_probs_equal_ours(exported):
    loaded, translator, _ = exported
    sources = _sources(loaded.cfg.src_vocab, seed=2)
    targets = _sources(loaded.cfg.tgt_vocab, seed=3)
    src_tok, tgt_tok = loaded.src_tokenizer, loaded.tgt_tokenizer
    scored = translator.score_batch([[src_tok.id_to_piece(i) for i in s] for s in sources],
                                    [[tgt_tok.id_to_piece(i) for i in t] for t in targets])
    ours = _teacher_forced(loaded.model, sources, targets)
    for r, want in zip(scored, ours):
        assert r.log_probs == pytest.approx(want, abs=1e-4)


def test_export_holds_the_tokenizers(exported):
    loaded, _, out = exported
    names = {p.name for p in out.iterdir()}
    assert {"model.bin", "config.json"} <= names
    assert {"spm.model"} <= names or {"src.spm.model", "tgt.spm.model"} <= names
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]  # no leftovers


def test_builtin_sinusoids_would_differ(exported, tmp_path):
    """Sanity check of the check: CTranslate2's own sinusoid layout (sin | cos halves) is not
    ours (sin/cos interleaved), and the greedy comparison notices."""
    ctranslate2 = _ct2()
    from aiayn.export.ctranslate2 import build_spec, save_spec

    loaded, _, _ = exported
    if loaded.cfg.positions != "sinusoidal":
        pytest.skip("learned positions have no layout to confuse")
    pieces = [[t.id_to_piece(i) for i in range(t.vocab_size)]
              for t in (loaded.src_tokenizer, loaded.tgt_tokenizer)]
    spec = build_spec(loaded.model, *pieces, max_positions=64)
    for stack in (spec.encoder, spec.decoder):
        table = stack.position_encodings.encodings.numpy()  # (P, d) interleaved
        stack.position_encodings.encodings = table.reshape(64, -1, 2).transpose(0, 2, 1).reshape(64, -1)
    save_spec(spec, tmp_path / "wrong")
    wrong = ctranslate2.Translator(str(tmp_path / "wrong"), device="cpu", intra_threads=1)
    sources = _sources(loaded.cfg.src_vocab)
    src, src_mask = source_batch(sources)
    ours = greedy_search(loaded.model, src, src_mask, max_len_a=0, max_len_b=MAX_LEN)
    assert _ct2_greedy(wrong, loaded, sources) != [h.tokens for h in ours]


def test_int8_export_translates(model_dir, tmp_path):
    ctranslate2 = _ct2()
    assert cli_main(["export", "--format", "ctranslate2", "--precision", "int8", "--model",
                     str(model_dir), "--out", str(tmp_path / "q")]) == 0
    translator = ctranslate2.Translator(str(tmp_path / "q"), device="cpu", compute_type="int8")
    out = translator.translate_batch([["▁the", "▁cat"]], beam_size=2, max_decoding_length=5)
    assert 1 <= len(out[0].hypotheses[0]) <= 5


def test_existing_output_is_never_replaced_without_overwrite(model_dir, tmp_path, capsys):
    _ct2()
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    args = ["export", "--format", "ctranslate2", "--model", str(model_dir), "--out", str(out)]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "--overwrite" in err and "\n" not in err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    # --overwrite replaces only what export writes: never a user's own directory
    assert cli_main(args + ["--overwrite"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a CTranslate2 model directory" in err and "\n" not in err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    (out / "mine.txt").unlink()
    out.rmdir()
    assert cli_main(args) == 0 and cli_main(args + ["--overwrite"]) == 0
    assert (out / "model.bin").exists()
    assert cli_main(["export", "--format", "ctranslate2", "--overwrite", "--model", str(model_dir),
                     "--out", str(model_dir)]) == 2  # never over the model itself
    assert "model directory itself" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, option", [
    (dict(attn_window=2), "attn_window"),
    (dict(d_k=16, d_v=8), "d_v=8"),
    (dict(arch="rnn", rnn_emb=8, rnn_hidden=8, rnn_attn=8), "arch='rnn'"),
])
def test_unsupported_options_are_user_errors(model_dir, tmp_path, capsys, overrides, option):
    from aiayn.export.ctranslate2 import check_exportable

    cfg = replace(load_model(model_dir).cfg, **overrides)
    with pytest.raises(UserError, match=option):
        check_exportable(cfg)
    # Through the CLI: one line, exit status 2, nothing written.
    torch.manual_seed(0)
    bad = save_model(tmp_path / "bad", build_model(cfg), cfg, {"spm.model": model_dir / "spm.model"})
    assert cli_main(["export", "--format", "ctranslate2", "--model", str(bad), "--out",
                     str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert option in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_missing_ctranslate2_says_how_to_install(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import now raises ImportError
    assert cli_main(["export", "--format", "ctranslate2", "--model", str(model_dir), "--out",
                     str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "pip install 'aiayn[export]'" in err and "\n" not in err
