"""`aiayn export --format huggingface` and `--format onnx` on a briefly trained model: a post-norm
model becomes Hugging Face's MarianMTModel, a pre-norm one its PegasusForConditionalGeneration,
both with MarianTokenizer's files (`AutoModelForSeq2SeqLM` and `AutoTokenizer` load either). For
each, at fp32: its ids and logits are aiayn's (logits within the LayerNorm epsilon's difference,
to float32 rounding when the epsilons agree), its greedy output is aiayn's token for token and,
through the exported tokenizer, text for text, and its beam search ranked by log-probability alone
gives aiayn's 4-best token for token; onnxruntime's greedy decode of the ONNX graphs equals
aiayn's; what cannot be exported is one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from aiayn.cli import main as cli_main
from aiayn.data.model_dir import load_model
from aiayn.decoding.common import source_batch
from aiayn.errors import UserError
from aiayn.model import build_model
from aiayn.special import BOS_ID, EOS_ID, PAD_ID

from helpers import MICRO, TEXTS, beam_search, greedy_search, reverser_model_dir

transformers = pytest.importorskip("transformers")  # the `huggingface` extra (scripts/test.sh)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return reverser_model_dir(tmp_path_factory.mktemp("reverser"), max_len_b=12)


@pytest.fixture(scope="module")
def trained_pre(tmp_path_factory):
    """The same, pre-norm (`norm="pre"`, as the recipe's translation-tiny-v2)."""
    return reverser_model_dir(tmp_path_factory.mktemp("reverser-pre"), max_len_b=12, norm="pre")


def _export(model_dir, out) -> None:
    assert cli_main(["export", "--format", "huggingface", "--model", str(model_dir), "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def hf_dir(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "marian"
    _export(trained, out)
    return out


@pytest.fixture(scope="module")
def hf_pre_dir(trained_pre, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-pre") / "pegasus"
    _export(trained_pre, out)
    return out


# Each norm, its aiayn model directory's and its export's fixtures, and the class it becomes
NORMS = {"post": ("trained", "hf_dir", "MarianMTModel"),
         "pre": ("trained_pre", "hf_pre_dir", "PegasusForConditionalGeneration")}


@pytest.fixture
def exported(request):
    """(aiayn model directory, its Hugging Face export loaded in eval mode, the export's directory)
    for the norm the test is parametrized with."""
    trained_name, out_name, cls = NORMS[request.param]
    out = request.getfixturevalue(out_name)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval()
    assert type(hf).__name__ == cls
    return request.getfixturevalue(trained_name), hf, out


def _generated(rows: list[list[int]]) -> list[list[int]]:
    """`generate`'s rows as aiayn's outputs: after the decoder's BOS, the pieces before EOS
    (finished rows are padded, with PAD by greedy search and with EOS by beam search)."""
    out = []
    for row in rows:
        assert row[0] == BOS_ID  # the decoder starts from BOS, as aiayn's
        pieces = row[1:]
        assert EOS_ID in pieces, row
        out.append(pieces[: pieces.index(EOS_ID)])
    return out


def _aiayn_greedy(loaded, sources: list[list[int]], complete: bool = False):
    """aiayn's greedy outputs (pieces, no EOS); with `complete`, (pieces, whether EOS ended them
    rather than the maximum output length)."""
    found = greedy_search(loaded.model, *source_batch(sources))
    return [(h.tokens, h.complete) for h in found] if complete else [h.tokens for h in found]


@pytest.mark.parametrize("norm, eps", [("post", 1e-5), ("pre", 1e-5), ("pre", 1e-6)])
def test_each_norm_is_its_class_layer_for_layer(norm, eps):
    """An untrained model of each norm, converted in memory: Marian for post-norm, Pegasus for
    pre-norm, fp32 logits equal to aiayn's up to float32 rounding when the LayerNorm epsilons
    agree (1e-5, theirs), within the epsilon's difference otherwise; padded sources, biases
    everywhere, several layers."""
    from aiayn.export.huggingface import to_huggingface

    torch.manual_seed(0)
    cfg = replace(MICRO, vocab_size=40, d_model=32, d_ff=64, n_layers=3, p_drop=0.0, norm=norm,
                  attn_bias=True, layer_norm_eps=eps)
    model = build_model(cfg).eval()
    with torch.no_grad():  # LayerNorms and biases away from their initial 1 and 0
        for name, w in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                w.add_(0.2 * torch.randn_like(w))
    hf = to_huggingface(model)
    assert type(hf).__name__ == NORMS[norm][2]
    g = torch.Generator().manual_seed(1)
    src, mask = source_batch([torch.randint(4, 40, (n,), generator=g).tolist() for n in (7, 3, 5)])
    tgt_in = torch.randint(4, 40, (3, 6), generator=g)
    tgt_in[:, 0] = BOS_ID
    with torch.no_grad():
        ours = model(src, tgt_in, mask)  # (B, T, V)
        theirs = hf(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt_in).logits
    diff = (ours - theirs).abs().max().item()
    assert diff < (1e-4 if eps == 1e-5 else 2e-3), diff
    if eps != 1e-5:
        assert diff > 1e-6  # the epsilon is the one difference left


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["post", "pre"], indirect=True)
def test_the_export_loads_and_computes_aiayns_logits(exported):
    trained, hf, out = exported
    loaded = load_model(trained)
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert type(tok).__name__ == "MarianTokenizer"  # for either class: aiayn's ids
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
    assert (ours - theirs)[real].abs().max().item() < 2e-3  # their LayerNorm eps is 1e-5, ours 1e-6
    assert ours[real].argmax(-1).tolist() == theirs[real].argmax(-1).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["post", "pre"], indirect=True)
def test_greedy_search_is_aiayns_token_for_token_and_text_for_text(exported, tmp_path):
    trained, hf, out_dir = exported
    loaded = load_model(trained)
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
    tok = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=64)
    got = tok.batch_decode(out, skip_special_tokens=True)
    # MarianTokenizer strips the text it decodes; aiayn keeps a space an output may begin with
    assert got == [line.strip() for line in hyp.read_text().splitlines()] and any(got)


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["post", "pre"], indirect=True)
def test_beam_search_by_log_probability_is_aiayns_4_best(exported):
    """Beam 4 ranked by log-probability alone on both sides (aiayn's alpha 0, Hugging Face's
    length_penalty 0: the two length penalties differ for any other alpha, so only this ranking
    is shared), every output left to end with EOS: the same 4 best hypotheses, token for token,
    with the same scores. Hugging Face's default early stopping stops, at length_penalty 0, when
    no live beam can beat its worst kept hypothesis, as aiayn's exact bound does."""
    trained, hf, _ = exported
    loaded = load_model(trained)
    g = torch.Generator().manual_seed(3)
    sources = [loaded.src_tokenizer.encode(t) for t in TEXTS] + [
        torch.randint(4, loaded.cfg.vocab_size, (int(n),), generator=g).tolist()
        for n in torch.randint(2, 9, (14,), generator=g)]
    src, mask = source_batch(sources)
    ours = beam_search(loaded.model, src, mask, beam_size=4, alpha=0.0, nbest=4, max_len_a=1,
                       max_len_b=40)
    with torch.no_grad():
        out = hf.generate(input_ids=src, attention_mask=mask.long(), num_beams=4, do_sample=False,
                          length_penalty=0.0, num_return_sequences=4, max_new_tokens=100,
                          output_scores=True, return_dict_in_generate=True)
    theirs = _generated(out.sequences.tolist())
    scores = out.sequences_scores.tolist()
    for i, hyps in enumerate(ours):
        assert len(hyps) == 4 and all(h.complete for h in hyps)  # no maximum length reached
        assert [h.tokens for h in hyps] == theirs[4 * i: 4 * i + 4]
        assert [h.score for h in hyps] == pytest.approx(scores[4 * i: 4 * i + 4], abs=1e-3)


@pytest.mark.slow
def test_what_marian_cannot_hold_is_refused_in_one_line(trained, tmp_path, capsys):
    from aiayn.export.huggingface import check_exportable

    cfg = load_model(trained).cfg
    from aiayn.export.huggingface import model_class

    assert model_class(cfg) == "MarianMTModel"
    assert model_class(replace(cfg, norm="pre")) == "PegasusForConditionalGeneration"
    check_exportable(replace(cfg, norm="pre"))  # pre-norm is exported (as Pegasus), not refused
    for change, words in [(dict(positions="learned"), "sinusoids"),
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
