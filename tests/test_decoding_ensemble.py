"""Ensemble decoding (aiayn/decoding/ensemble.py): hand-worked next-token tables where the mean of
two models picks what neither picks alone; an ensemble of one model, or of a model with itself,
searches exactly as the model does; two trained models of different widths against a slow
greedy search that runs each model on the whole prefix and averages the probabilities; the
loader, the precision conversion and the CLI."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.cli import main
from aiayn.decoding.common import next_token_logprobs, source_batch
from aiayn.decoding.ensemble import Ensemble, load_models
from aiayn.decoding.translate import Translator
from aiayn.errors import UserError
from aiayn.special import BOS_ID, EOS_ID

from helpers import (
    MICRO,
    A,
    B,
    C,
    TableModel,
    beam_search,
    greedy_search,
    reverser_model_dir,
    train_reverser,
)

# Key 20. Model 1 prefers A (.5), model 2 C (.5); both give B .45. The mean: A .275, B .45,
# C .275, so the ensemble writes B, which neither model writes alone. Every token then ends.
ENDS = {(A,): {EOS_ID: 1.0}, (B,): {EOS_ID: 1.0}, (C,): {EOS_ID: 1.0}}
FIRST = {20: {(): {A: 0.5, B: 0.45, C: 0.05}, **ENDS}}
SECOND = {20: {(): {C: 0.5, B: 0.45, A: 0.05}, **ENDS}}


def _src():
    return source_batch([[20]])


def test_the_mean_of_two_tables_picks_what_neither_picks():
    src, mask = _src()
    alone = [greedy_search(TableModel(t), src, mask, 0.0, 3)[0].tokens for t in (FIRST, SECOND)]
    assert alone == [[A], [C]]
    both = Ensemble([TableModel(FIRST), TableModel(SECOND)])
    (hyp,) = greedy_search(both, src, mask, 0.0, 3)
    assert hyp.tokens == [B] and hyp.logprob == pytest.approx(math.log(0.45), abs=1e-6)
    # beam 3, alpha 0: B (.45), then A and C tied at .275 each
    hyps = beam_search(both, src, mask, beam_size=3, alpha=0.0, max_len_a=0.0, max_len_b=3,
                       nbest=3)[0]
    assert hyps[0].tokens == [B] and sorted(h.tokens[0] for h in hyps[1:]) == [A, C]
    assert [h.logprob for h in hyps] == pytest.approx([math.log(0.45)] + [math.log(0.275)] * 2,
                                                      abs=1e-6)


@pytest.fixture(scope="module")
def two_models():
    """Two briefly trained models of different widths on one vocabulary."""
    from dataclasses import replace

    sizes = dict(vocab_size=24, n_layers=2, d_ff=64, n_heads=4, p_drop=0.0, max_len_b=6)
    return (train_reverser(replace(MICRO, d_model=32, **sizes), steps=60, seed=0),
            train_reverser(replace(MICRO, d_model=48, **sizes), steps=60, seed=1))


SOURCES = [[5, 9, 7, 12], [20, 4], [6, 6, 8, 11, 13, 15]]


@pytest.mark.slow
def test_an_ensemble_of_one_model_or_of_a_model_with_itself_is_that_model(two_models):
    model = two_models[0]
    src, mask = source_batch(SOURCES)
    alone = beam_search(model, src, mask, beam_size=4, nbest=2)
    for members in ([model], [model, model]):
        got = beam_search(Ensemble(members), src, mask, beam_size=4, nbest=2)
        for a, b in zip(alone, got):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


@torch.no_grad()
def _slow_greedy(models, src_ids, max_len):
    """Greedy search without caches: each step runs every model on the whole prefix and takes
    the token of highest mean probability (PAD and BOS excluded, as the search excludes them)."""
    src, mask = source_batch([src_ids])
    out, total = [], 0.0
    for _ in range(max_len):
        tgt = torch.tensor([[BOS_ID] + out])
        probs = sum(torch.softmax(m(src, tgt, mask)[0, -1].float(), -1) for m in models)
        logp = next_token_logprobs((probs / len(models)).log()[None])[0]
        tok = int(logp.argmax())
        total += float(logp[tok])
        if tok == EOS_ID:
            break
        out.append(tok)
    return out, total


def test_cached_ensemble_search_equals_the_slow_mean_of_full_forwards(two_models):
    both = Ensemble(list(two_models))
    src, mask = source_batch(SOURCES)
    found = greedy_search(both, src, mask, 0.0, 6)
    for ids, hyp in zip(SOURCES, found):
        tokens, logprob = _slow_greedy(two_models, ids, 6)
        assert hyp.tokens == tokens
        assert hyp.logprob == pytest.approx(logprob, abs=1e-4)
    # beam 1 is greedy for the ensemble too
    one = beam_search(both, src, mask, beam_size=1, max_len_a=0.0, max_len_b=6)
    assert [h[0].tokens for h in one] == [h.tokens for h in found]


def test_the_step_distribution_is_normalised_and_attention_is_refused(two_models):
    both = Ensemble(list(two_models))
    src, mask = source_batch(SOURCES)
    cache = both.new_cache(both.encode(src, mask), mask)
    step = both.decode_step(torch.full((len(SOURCES), 1), BOS_ID), cache)
    assert step.shape == (len(SOURCES), 24)
    assert step.exp().sum(-1).tolist() == pytest.approx([1.0] * len(SOURCES), abs=1e-5)
    with pytest.raises(ValueError, match="attention"):
        both.decode_step(torch.full((len(SOURCES), 1), BOS_ID), cache, return_attention=True)
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensemble")
    return (reverser_model_dir(root / "a"), reverser_model_dir(root / "b", d_model=48),
            reverser_model_dir(root / "c", separate=True))


@pytest.mark.slow
def test_loader_checks_vocabularies_and_bf16_converts_every_member(model_dirs):
    a, b, other = model_dirs
    assert not isinstance(load_models([a]).model, Ensemble)
    loaded = load_models([a, b])
    assert isinstance(loaded.model, Ensemble) and len(loaded.model) == 2
    tr = Translator(loaded, precision="bf16")
    assert {p.dtype for m in tr.model.members for p in m.parameters()} == {torch.bfloat16}
    assert len(tr.translate(["the cat sat", "", "a dog"])) == 3
    with pytest.raises(UserError, match="vocabulary differs") as e:
        load_models([a, other])
    assert "\n" not in str(e.value)


def test_cli_ensembles_two_model_directories(model_dirs, tmp_path, capsys):
    a, b, _ = model_dirs
    inp = tmp_path / "in.txt"
    inp.write_text("the cat sat\n\na dog runs\n")
    runs = {}
    for name, models in (("a", [a]), ("aa", [a, a]), ("ab", [a, b])):
        out = tmp_path / f"{name}.txt"
        assert main(["translate", "--model", *map(str, models), "--input", str(inp),
                     "--output", str(out), "--beam", "3"]) == 0
        runs[name] = out.read_text().splitlines()
    assert len(runs["ab"]) == 3 and runs["ab"][1] == ""
    assert runs["aa"] == runs["a"]  # the mean of a model with itself is the model
    capsys.readouterr()
    code = main(["translate", "--model", str(a), str(b), "--input", str(inp), "--alignment", "hard"])
    err = capsys.readouterr().err
    assert code == 2 and "one --model" in err and err.count("\n") == 1


def test_serve_answers_as_translate_with_the_same_ensemble(model_dirs, capsys):
    """`aiayn serve --model A B`: the HTTP API gives the ensemble translations `aiayn translate
    --model A B` gives (alone and in one request), /info counts both models' parameters and names
    both directories, alignment is refused (501); a member with another vocabulary: one line."""
    from fastapi.testclient import TestClient

    from aiayn.serving.app import create_app
    from aiayn.serving.model import ServedModel
    from aiayn.serving.settings import ServeSettings

    a, b, other = model_dirs
    lines = ["the cat sat", "a dog runs in the park", "the mat"]
    expected = Translator(load_models([a, b]), beam_size=3).translate(lines)
    served = ServedModel(Translator(load_models([a, b])), model_paths=[str(a), str(b)])
    with TestClient(create_app(served, ServeSettings(), None)) as client:
        ask = lambda q: client.post("/translate", json={"q": q, "beam_size": 3}).json()
        one_by_one = [ask(q)["translatedText"] for q in lines]
        together = ask(lines)["translatedText"]
        info = client.get("/info").json()
        refused = client.post("/translate", json={"q": lines[0], "alignment": True})
    assert one_by_one == expected and together == expected
    sizes = [sum(p.numel() for p in load_models([d]).model.parameters()) for d in (a, b)]
    assert sizes[0] != sizes[1] and info["parameters"] == sum(sizes)
    assert info["models"] == [str(a), str(b)] and info["model"] == str(a)
    assert refused.status_code == 501
    capsys.readouterr()
    assert main(["serve", "--model", str(a), str(other), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "vocabulary differs" in err and err.count("\n") == 1 and "Traceback" not in err
