"""The RNN encoder-decoder baseline (aiayn.model.rnn) against an independent computation of
Bahdanau et al.'s equations, its incremental decoding against the full pass, and a whole run
through the trainer, checkpoints, averaging and search."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiayn.config import BASE
from aiayn.model import build_model, count_parameters, flops_per_target_token
from aiayn.model.rnn import RNNSearch
from aiayn.presets import load_config
from aiayn.special import PAD_ID

from helpers import REPO, beam_search, greedy_search, tiny_dataset

CFG = replace(BASE, arch="rnn", vocab_size=30, rnn_emb=6, rnn_hidden=5, rnn_attn=7, p_drop=0.0)


def make(cfg=CFG, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg).eval()


def batch(b=3, s=7, t=5, seed=1, vocab=30):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    src[1, 5:] = PAD_ID
    src[2, 2:] = PAD_ID
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    return src, tgt


# --- an independent computation: the equations, one sentence at a time, in float64 -----------


def gru(x, h, w_ih, w_hh, b_ih, b_hh):
    """One GRU step written out (reset r, update z, candidate n; rows of the weights in r, z, n
    order, as PyTorch stores them)."""
    gi = [w @ x + b for w, b in zip(w_ih.chunk(3), b_ih.chunk(3))]
    gh = [w @ h + b for w, b in zip(w_hh.chunk(3), b_hh.chunk(3))]
    r = torch.sigmoid(gi[0] + gh[0])
    z = torch.sigmoid(gi[1] + gh[1])
    n = torch.tanh(gi[2] + r * gh[2])
    return (1 - z) * n + z * h


def reference_logits(m: RNNSearch, src: list[int], tgt_in: list[int]) -> torch.Tensor:
    p = {k: v.double() for k, v in m.state_dict().items()}
    emb = p["src_embed.weight"]
    hdim = m.cfg.rnn_hidden
    xs = [emb[i] for i in src]
    fwd, h = [], torch.zeros(hdim, dtype=torch.float64)
    for x in xs:
        h = gru(x, h, p["encoder.weight_ih_l0"], p["encoder.weight_hh_l0"],
                p["encoder.bias_ih_l0"], p["encoder.bias_hh_l0"])
        fwd.append(h)
    bwd, h = [], torch.zeros(hdim, dtype=torch.float64)
    for x in reversed(xs):
        h = gru(x, h, p["encoder.weight_ih_l0_reverse"], p["encoder.weight_hh_l0_reverse"],
                p["encoder.bias_ih_l0_reverse"], p["encoder.bias_hh_l0_reverse"])
        bwd.insert(0, h)
    ann = [torch.cat([f, b]) for f, b in zip(fwd, bwd)]
    s = torch.tanh(p["init_state.weight"] @ bwd[0] + p["init_state.bias"])
    rows = []
    for y_id in tgt_in:
        y = emb[y_id]
        e = [float(p["score.weight"][0] @ torch.tanh(p["query_proj.weight"] @ s + p["query_proj.bias"]
                                                   + p["key_proj.weight"] @ a)) for a in ann]
        z = sum(math.exp(v) for v in e)
        c = sum((math.exp(v) / z) * a for v, a in zip(e, ann))
        s = gru(torch.cat([y, c]), s, p["cell.weight_ih"], p["cell.weight_hh"], p["cell.bias_ih"],
                p["cell.bias_hh"])
        t = p["readout.weight"] @ torch.cat([s, y, c]) + p["readout.bias"]
        t = torch.maximum(t[0::2], t[1::2])  # maxout over consecutive pairs
        rows.append(emb @ t)  # output layer tied to the embedding
    return torch.stack(rows)


def test_rnn_equals_the_equations_sentence_by_sentence():
    m = make()
    src, tgt = batch()
    with torch.no_grad():
        logits = m.double()(src, tgt)
    for b in range(src.size(0)):
        real = [int(i) for i in src[b] if i != PAD_ID]
        expected = reference_logits(m, real, tgt[b].tolist())
        torch.testing.assert_close(logits[b], expected, rtol=1e-9, atol=1e-9)


def test_attention_weights_are_a_distribution_over_real_source_tokens():
    m = make()
    src, tgt = batch()
    _, att = m(src, tgt, return_attention=True)
    (w,) = att["cross"]
    assert w.shape == (3, 1, 5, 7)
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 1, 5))
    assert w[1, :, :, 5:].abs().max() == 0 and w[2, :, :, 2:].abs().max() == 0


def test_cached_decoding_equals_full_pass_and_reorders():
    m = make()
    src, tgt = batch()
    mask = src != PAD_ID
    with torch.no_grad():
        full = m(src, tgt)
        cache = m.new_cache(m.encode(src, mask), mask)
        steps = [m.decode_step(tgt[:, i:i + 1], cache) for i in range(3)]
        torch.testing.assert_close(torch.stack(steps, 1), full[:, :3], rtol=0, atol=1e-6)
        index = torch.tensor([2, 2, 0, 1])
        cache.reorder(index)
        nxt = m.decode_step(tgt[index, 3:4], cache)
        torch.testing.assert_close(nxt, m(src[index], tgt[index, :4])[:, -1], rtol=0, atol=1e-6)


def test_beams_sharing_one_source_copy_equal_rows_with_their_own():
    # beam search keeps a sentence's annotations once for its k beams (`cross_index=None`)
    m = make()
    src, tgt = batch()
    mask = src != PAD_ID
    beams = torch.arange(3).repeat_interleave(2)
    with torch.no_grad():
        full = m(src[beams], tgt[beams])
        cache = m.new_cache(m.encode(src, mask), mask)
        cache.reorder(beams, cross_index=None)
        assert cache.memory.size(0) == 3 and cache.state.size(0) == 6
        steps = [m.decode_step(tgt[beams, i:i + 1], cache) for i in range(3)]
        torch.testing.assert_close(torch.stack(steps, 1), full[:, :3], rtol=0, atol=1e-6)
        cache.reorder(torch.tensor([0, 1, 4, 5]), cross_index=torch.tensor([0, 2]))  # 1 leaves
        nxt = m.decode_step(tgt[beams[[0, 1, 4, 5]], 3:4], cache)
        torch.testing.assert_close(nxt, full[[0, 1, 4, 5], 3], rtol=0, atol=1e-6)


def test_untied_vocabularies_and_counts():
    cfg = replace(CFG, tgt_vocab_size=20, tie_embeddings=False, tie_output=False)
    m = make(cfg)
    src, _ = batch()
    tgt = torch.randint(4, 20, (3, 4))
    assert m(src, tgt).shape == (3, 4, 20)
    assert count_parameters(cfg) == sum(p.numel() for p in m.parameters())
    assert count_parameters(CFG) < count_parameters(cfg)
    # the recurrence, not the vocabulary, dominates at RNNsearch's sizes
    big = replace(BASE, arch="rnn", vocab_size=30_000)
    assert flops_per_target_token(big) > flops_per_target_token(replace(big, rnn_hidden=500))


# --- a whole run: trainer, checkpoints, averaging, searches -------------------------------


@pytest.fixture(scope="module")
def rnn_run(tmp_path_factory):
    from aiayn.training.trainer import TrainOptions, train

    root = tmp_path_factory.mktemp("rnn")
    data = tiny_dataset(root)
    cfg = load_config("base", overrides=["arch=rnn", "rnn_emb=32", "rnn_hidden=48", "rnn_attn=32",
                                         "p_drop=0.0", "warmup_steps=40", "max_tokens=400",
                                         "lr_scale=4"])
    opts = TrainOptions(max_steps=240, eval_every=120, save_every=60, keep=4, threads=1,
                        tensorboard=False, progress=False, eval_bleu_sentences=0, save_minutes=None)
    summary = train(cfg, data, root / "run", opts)
    return data, root / "run", summary


@pytest.mark.slow
def test_rnn_trains_saves_averages_and_decodes(rnn_run, tmp_path):
    from aiayn.data.dataset import ParallelDataset
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.common import source_batch
    from aiayn.training.average import average_checkpoints
    from aiayn.training.checkpoint import list_checkpoints

    data, run, summary = rnn_run
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in records if r["kind"] == "dev"]
    first = [r for r in records if r["kind"] == "train"][0]
    assert first["nll"] > 2.5  # about log(25): it starts knowing nothing
    assert dev[-1]["dev_nll"] < 0.8  # and learns to reverse and shift the words
    ckpts = [d for _, d in list_checkpoints(run)]
    assert len(ckpts) == 4
    avg = load_model(average_checkpoints(ckpts[-2:], tmp_path / "avg"))
    assert isinstance(avg.model, RNNSearch)

    valid = ParallelDataset(data, "valid")
    sources = [valid[i][0].tolist() for i in range(24)]
    src, mask = source_batch(sources)
    model = load_model(ckpts[-1]).model
    greedy = greedy_search(model, src, mask)
    beam1 = beam_search(model, src, mask, beam_size=1, alpha=0.0)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam1]
    right = sum(h.tokens == valid[i][1].tolist() for i, h in enumerate(greedy))
    assert right >= 4  # held-out sentences translated exactly (chance: none)
    # text in, text out: the averaged model through the Translator, beam 4 (the config's)
    from aiayn.decoding.translate import Translator

    lines, refs = zip(*(valid.text(i) for i in range(24)))
    out = Translator(avg).translate(list(lines))
    assert sum(o == r for o, r in zip(out, refs)) >= 4


BLEU_VS_TIME = REPO / "benchmarks" / "bleu_vs_time.py"


def bleu_vs_time(cwd: Path, *args, ok: bool = True) -> subprocess.CompletedProcess:
    """benchmarks/bleu_vs_time.py with these arguments, run in `cwd`; it must succeed (`ok`) or
    fail."""
    done = subprocess.run([sys.executable, str(BLEU_VS_TIME), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)
    assert (done.returncode == 0) == ok, done.stderr[-2000:]
    return done


def curve(entry: dict, metric: str = "bleu") -> tuple[list[float], list[float]]:
    """One curve of the script's OUT.json: (wall-clock seconds, scores) in time order."""
    pts = sorted(entry["points"].values(), key=lambda p: p["wall_s"])
    return [p["wall_s"] for p in pts], [p[metric] for p in pts]


@pytest.mark.slow
def test_bleu_against_time_script_scores_every_checkpoint(rnn_run, tmp_path):
    data, run, _ = rnn_run
    from aiayn.training.checkpoint import list_checkpoints

    last = list_checkpoints(run)[-1][1]
    out = tmp_path / "curve"
    bleu_vs_time(tmp_path, "--data", data, "--run", f"A={run}", "--run", f"B={run}",
                 "--out", out, "--sentences", "20", "--align", f"RNN={last}",
                 "--align", f"again={last}", "--sentence", "1", "--align-split", "valid")
    got = json.loads(out.with_suffix(".json").read_text())
    walls, bleus = curve(got["A"])
    assert len(walls) == 4 and walls == sorted(walls) and walls[0] > 0
    assert bleus[-1] > bleus[0]
    # the same run twice: "A" reaches B's final BLEU exactly when B ends, at most
    assert got["comparison"]["target_bleu"] == bleus[-1] and got["comparison"]["ratio"] <= 1
    assert out.with_suffix(".png").stat().st_size > 0 and (tmp_path / "curve-align.png").exists()


@pytest.mark.slow
def test_word_error_rate_against_time(rnn_run, tmp_path):
    """--g2p's metric: a checkpoint's greedy outputs scored as words against their references
    (lower is better, so the comparison looks for the first time at or below the target), and
    the validation words read with all their pronunciations (the demo corpus's valid.refs)."""
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator
    from aiayn.training.checkpoint import list_checkpoints

    data, run, _ = rnn_run
    step, last = list_checkpoints(run)[-1]
    one = tmp_path / "run"  # the run with its last checkpoint only: one to score
    shutil.copytree(last, one / last.relative_to(run))
    shutil.copy(run / "metrics.jsonl", one)
    srcs = (data / "valid.src.txt").read_text(encoding="utf-8").splitlines()[:20]
    refs = (data / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()[:20]
    # two recorded curves, compared in each order while the run is scored between them
    old = tmp_path / "old.json"
    old.write_text(json.dumps({
        "A": {"points": {"1": {"wall_s": 60.0, "wer": 50.0}, "2": {"wall_s": 120.0, "wer": 30.0}}},
        "B": {"points": {"1": {"wall_s": 100.0, "wer": 60.0}, "2": {"wall_s": 200.0, "wer": 40.0}}}}))

    def wer_of_last(name: str, prons: list[list[str]], fast: str, slow: str) -> tuple[float, dict]:
        corpus = tmp_path / name  # as `aiayn demo` writes it: pronunciations " | "-separated
        corpus.mkdir()
        (corpus / "valid.src").write_text("".join(s + "\n" for s in srcs), encoding="utf-8")
        (corpus / "valid.refs").write_text("".join(" | ".join(p) + "\n" for p in prons),
                                           encoding="utf-8")
        bleu_vs_time(tmp_path, "--g2p", corpus, "--run", f"{fast}={old}#{fast}", "--run", f"R={one}",
                     "--run", f"{slow}={old}#{slow}", "--out", tmp_path / f"{name}-wer")
        got = json.loads((tmp_path / f"{name}-wer.json").read_text())
        return got["R"]["points"][str(step)]["wer"], got["comparison"]

    hyps = Translator(load_model(last), greedy=True).translate(srcs)
    wer, a_to_b = wer_of_last("exact", [[r] for r in refs], "A", "B")
    assert wer == 100 * sum(h.split() != r.split() for h, r in zip(hyps, refs)) / 20
    assert a_to_b == {"target_wer": 40.0, "slow_wall_s": 200.0, "fast_reaches_at_s": 90.0, "ratio": 0.45}
    # Whatever the toy model learned on this machine: 5 words with no right pronunciation, 15
    # whose second pronunciation is the greedy output (a word is right if it matches any).
    wrong = "ZZZ QQQ"
    wer, b_to_a = wer_of_last("graded", [[wrong]] * 5 + [[wrong, h] for h in hyps[5:]], "B", "A")
    assert wer == 25.0 and b_to_a["fast_reaches_at_s"] is None


def test_first_reaching_interpolates(tmp_path):
    """The first time a recorded curve (60 s: 10, 120 s: 20[, 180 s: 30]) reaches another's final
    BLEU, interpolated between its points."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({
        **{f"A{n}": {"points": {str(s): {"wall_s": 60.0 * s, "bleu": 10.0 * s} for s in range(1, n + 1)}}
           for n in (2, 3)},
        **{f"to{t}": {"points": {"1": {"wall_s": 300.0, "bleu": float(t)}}} for t in (25, 5, 21)}}))
    for n, target, expected in ((3, 25, 150), (2, 5, 60), (2, 21, None)):
        out = tmp_path / f"to{target}"
        bleu_vs_time(tmp_path, "--data", tmp_path, "--from-metrics", "--run", f"A={old}#A{n}",
                     "--run", f"T={old}#to{target}", "--out", out)
        reached = json.loads(out.with_suffix(".json").read_text())["comparison"]["fast_reaches_at_s"]
        assert reached == (None if expected is None else pytest.approx(expected))


def test_bleu_against_time_from_a_runs_own_dev_evaluations(tmp_path):
    """--from-metrics: one point per dev record, at the run's training time for that step
    (interpolated between the train records), and nothing translated."""
    records = [{"kind": "train", "step": 100, "elapsed": 60.0},
               {"kind": "train", "step": 300, "elapsed": 200.0},
               {"kind": "dev", "step": 200, "dev_bleu": 5.0, "bleu_sentences": 30},
               {"kind": "train", "step": 500, "elapsed": 400.0},
               {"kind": "dev", "step": 400, "dev_loss": 2.0},  # no BLEU: not a point
               {"kind": "dev", "step": 500, "dev_bleu": 9.0, "bleu_sentences": 30}]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "curve"
    bleu_vs_time(tmp_path, "--data", tmp_path / "no-data", "--from-metrics",
                 "--run", f"A={tmp_path / 'a'}", "--run", f"B={tmp_path / 'b'}", "--out", out)
    got = json.loads(out.with_suffix(".json").read_text())
    assert curve(got["A"]) == ([130.0, 400.0], [5.0, 9.0])
    assert got["comparison"]["fast_reaches_at_s"] == 400.0
    assert out.with_suffix(".png").stat().st_size > 0


def test_bleu_against_time_with_a_curve_recorded_before(tmp_path):
    """--run LABEL=OLD.json#KEY: an earlier output's curve, drawn and compared as it was (not
    re-scored), in its place in the order; a missing file or curve is one line."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"RNN": {"run": "gone", "points": {
        "100": {"wall_s": 100.0, "bleu": 10.0}, "200": {"wall_s": 200.0, "bleu": 8.0}}},
        "machine": "a 2-core CPU"}))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"kind": "train", "step": 100, "elapsed": 50.0}, {"kind": "train", "step": 300, "elapsed": 150.0},
        {"kind": "dev", "step": 100, "dev_bleu": 4.0}, {"kind": "dev", "step": 300, "dev_bleu": 12.0}]))
    out = tmp_path / "curve"
    bleu_vs_time(tmp_path, "--data", tmp_path, "--from-metrics", "--run", f"A={tmp_path / 'a'}",
                 "--run", f"RNN, before={old}#RNN", "--out", out)
    got = json.loads(out.with_suffix(".json").read_text())
    assert list(got)[:2] == ["A", "RNN, before"] and got["RNN, before"]["recorded"]
    assert curve(got["RNN, before"]) == ([100.0, 200.0], [10.0, 8.0])
    # A (4 at 50 s, 12 at 150 s) reaches the recorded curve's final 8 halfway: 100 s of its 200
    assert got["comparison"] == {"target_bleu": 8.0, "slow_wall_s": 200.0,
                                 "fast_reaches_at_s": 100.0, "ratio": 0.5}
    for bad, says in [(f"{old}#CNN", r"has no curve 'CNN' \(it has RNN\)"),
                      (f"{tmp_path / 'none.json'}#RNN", "no such file")]:
        done = bleu_vs_time(tmp_path, "--data", tmp_path, "--from-metrics", "--run",
                            f"A={tmp_path / 'a'}", "--run", f"B={bad}", "--out", out, ok=False)
        assert re.search(says, done.stderr.strip().splitlines()[-1])
    done = bleu_vs_time(tmp_path, "--g2p", tmp_path, "--run", f"B={old}#RNN", "--out", out, ok=False)
    assert "has no wer scores" in done.stderr.strip().splitlines()[-1]


def test_run_labels_may_hold_equals_signs_and_a_wrong_run_is_one_line(tmp_path):
    """LABEL=PATH splits where an existing path follows, so "lr_scale=0.7=PATH" and a directory
    named with "=" both parse; a path that is not a run directory fails before any scoring."""
    run = tmp_path / "lr=0.7"
    run.mkdir()
    old = run / "old.json"
    old.write_text(json.dumps({"RNN": {"points": {"1": {"wall_s": 60.0, "bleu": 5.0}}}}))
    out = tmp_path / "c"
    bleu_vs_time(tmp_path, "--data", tmp_path, "--from-metrics", "--run",
                 f"T, lr_scale=0.7={old}#RNN", "--run", f"T={old}#RNN", "--out", out)
    assert list(json.loads(out.with_suffix(".json").read_text()))[:2] == ["T, lr_scale=0.7", "T"]
    # nothing exists: the last "=" (the path is b.json)
    done = bleu_vs_time(tmp_path, "--data", tmp_path, "--from-metrics", "--run", "T=a=b.json#K",
                        "--out", out, ok=False)
    assert done.stderr.strip().splitlines()[-1] == "--run T=a=b.json#K: no such file b.json"
    for bad in ("no-label", f"={run}"):
        done = bleu_vs_time(tmp_path, "--data", tmp_path, "--run", bad, "--out", out, ok=False)
        assert "expected LABEL=PATH" in done.stderr
    done = bleu_vs_time(tmp_path, "--data", tmp_path, "--run", f"A={run}", "--out", tmp_path / "c2",
                        ok=False)
    assert "not a training run directory (no metrics.jsonl" in done.stderr.strip().splitlines()[-1]
