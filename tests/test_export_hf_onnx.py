"""`aiayn export --format huggingface` and `--format onnx` on a briefly trained model: Hugging Face's
MarianMTModel and MarianTokenizer load the export, its ids and logits are aiayn's (logits within
the LayerNorm epsilon's difference), its greedy output is aiayn's token for token and, through
the exported tokenizer, text for text; onnxruntime's greedy decode of the ONNX graphs equals aiayn's; what
cannot be exported is one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model
from aiayn.decoding.common import source_batch
from aiayn.errors import UserError
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

from helpers import TEXTS, greedy_search, reverser_model_dir

transformers = pytest.importorskip("transformers")  # the `huggingface` extra (scripts/test.sh)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return reverser_model_dir(tmp_path_factory.mktemp("reverser"), max_len_b=12)


@pytest.fixture(scope="module")
def hf_dir(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "marian"
    assert cli_main(["export", "--format", "huggingface", "--model", str(trained), "--out", str(out)]) == 0
    return out


def _aiayn_greedy(loaded, sources: list[list[int]], complete: bool = False):
    """aiayn's greedy outputs (pieces, no EOS); with `complete`, (pieces, whether EOS ended them
    rather than the maximum output length)."""
    found = greedy_search(loaded.model, *source_batch(sources))
    return [(h.tokens, h.complete) for h in found] if complete else [h.tokens for h in found]


@pytest.mark.slow
def test_the_export_loads_and_computes_aiayns_logits(trained, hf_dir):
    loaded = load_model(trained)
    tok = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
    hf = transformers.MarianMTModel.from_pretrained(str(hf_dir)).eval()
    texts = TEXTS[:6]
    ids = [loaded.src_tokenizer.encode(t) for t in texts]
    # the tokenizer gives aiayn's ids, EOS appended as aiayn's batches have it
    assert [tok(t)["input_ids"] for t in texts] == [s + [EOS_ID] for s in ids]
    src, mask = source_batch(ids)
    tgt_in = torch.tensor([[BOS_ID] + s[:4] + [PAD_ID] * (4 - len(s[:4])) for s in ids])
    with torch.no_grad():
        ours = loaded.model(src, tgt_in, mask)  # (B, T, V)
        theirs = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt_in).logits
    real = tgt_in != PAD_ID
    assert (ours - theirs)[real].abs().max().item() < 2e-3  # Marian's LayerNorm eps is 1e-5, ours 1e-6
    assert ours[real].argmax(-1).tolist() == theirs[real].argmax(-1).tolist()


def test_greedy_search_is_aiayns_token_for_token_and_text_for_text(trained, hf_dir, tmp_path):
    loaded = load_model(trained)
    hf = transformers.MarianMTModel.from_pretrained(str(hf_dir)).eval()
    ids = [loaded.src_tokenizer.encode(t) for t in TEXTS[:8]]
    ours = _aiayn_greedy(loaded, ids, complete=True)
    src, mask = source_batch(ids)
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=mask.long(), num_beams=1, do_sample=False,
                          max_new_tokens=64)
    assert any(done for _, done in ours)
    for (mine, done), row in zip(ours, out.tolist()):
        assert row[0] == BOS_ID  # the decoder starts from BOS, as aiayn's
        theirs = [t for t in row[1:] if t != PAD_ID]
        # token for token, as far as aiayn's per-sentence maximum length (§6.1) let it go
        assert theirs[: len(mine)] == mine
        if done:
            assert theirs[len(mine)] == EOS_ID
    # text in, text out with the exported tokenizer: what `aiayn translate --greedy` writes (for
    # the sentences aiayn ended with EOS, not at its per-sentence maximum length)
    texts = [t for t, (_, done) in zip(TEXTS[:8], ours) if done]
    src_file = tmp_path / "src"
    src_file.write_text("\n".join(texts) + "\n")
    hyp = tmp_path / "hyp"
    assert cli_main(["translate", "--model", str(trained), "--input", str(src_file), "--output",
                     str(hyp), "--greedy", "--precision", "fp32"]) == 0
    tok = transformers.MarianTokenizer.from_pretrained(str(hf_dir))
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=64)
    got = tok.batch_decode(out, skip_special_tokens=True)
    # MarianTokenizer strips the text it decodes; aiayn keeps a space an output may begin with
    assert got == [line.strip() for line in hyp.read_text().splitlines()] and any(got)


def test_what_marian_cannot_hold_is_refused_in_one_line(trained, tmp_path, capsys):
    from aiayn.export.huggingface import check_exportable

    cfg = load_model(trained).cfg
    for change, words in [(dict(norm="pre"), "post-norm"), (dict(positions="learned"), "sinusoids"),
                          (dict(attn_window=2), "restricted"),
                          (dict(tgt_vocab_size=cfg.vocab_size + 1, tie_embeddings=False), "vocabular"),
                          (dict(arch="rnn"), "Transformer")]:
        with pytest.raises(UserError, match=words):
            check_exportable(replace(cfg, **change))
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    capsys.readouterr()
    args = ["export", "--format", "huggingface", "--model", str(trained), "--out", str(out)]
    assert cli_main(args + ["--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "not a Hugging Face model directory" in err and err.count("\n") == 1
    assert (out / "notes.txt").read_text() == "keep me"
    assert cli_main(args + ["--precision", "int8"]) == 2
    assert "stores fp32" in capsys.readouterr().err


@pytest.mark.slow
def test_onnxruntime_greedy_decoding_equals_aiayns(trained, tmp_path, capsys):
    pytest.importorskip("onnxruntime")  # the `onnx` extra (scripts/test.sh)
    from aiayn.export.onnx import OnnxGreedy

    out = tmp_path / "onnx"
    assert cli_main(["export", "--format", "onnx", "--model", str(trained), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"encoder.onnx", "decoder.onnx", "config.json", "spm.model"}
    loaded = load_model(trained)
    ids = [loaded.src_tokenizer.encode(t) for t in TEXTS[:8]]
    assert OnnxGreedy(out, threads=1).search(ids) == _aiayn_greedy(loaded, ids)
    # again over the same directory: refused without --overwrite, replaced with it
    capsys.readouterr()
    args = ["export", "--format", "onnx", "--model", str(trained), "--out", str(out)]
    assert cli_main(args) == 2 and "--overwrite" in capsys.readouterr().err
