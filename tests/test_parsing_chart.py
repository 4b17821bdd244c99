"""The chart parser (aiayn/parsing/chart/): spans of hand-built trees, CKY against brute force
over every binary bracketing, decoding gold scores back to the gold tree, batched = one at a time,
an ensemble of one model twice = that model, and `aiayn train --preset parsing-chart-small` +
`aiayn average` + `aiayn parse` end to end on a tiny corpus it learns exactly."""

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from nltk.tree import Tree

from aiayn.cli import main
from aiayn.parsing.chart.config import ChartConfig
from aiayn.parsing.chart.data import Vocabulary
from aiayn.parsing.chart.files import ChartModel, load_chart, write_model_dir
from aiayn.parsing.chart.model import (
    CHAR_SPECIALS,
    SPECIALS,
    CharEncoder,
    SpanParser,
    char_ids,
    encode,
    model_words,
    span_targets,
)
from aiayn.parsing.chart.parse import chart_parse
from aiayn.parsing.chart.trees import NONE, cky, decode_tree, span_votes, spans_to_tree, tree_spans
from aiayn.parsing.signatures import signature

from helpers import SMALL_CHART, TREES, run_cli, tiny_treebank_corpus, train_until_killed


def xx(line: str) -> str:
    """The tree with every part-of-speech tag written XX (what the chart parser outputs)."""
    t = Tree.fromstring(line)
    for pos in t.treepositions("leaves"):
        t[pos[:-1]].set_label("XX")
    return t.pformat(margin=1 << 30)


def test_spans_of_a_hand_built_tree():
    assert tree_spans(Tree.fromstring(TREES[0])) == [
        (0, 7, "S"), (0, 2, "NP"), (2, 6, "VP"), (3, 6, "PP"), (4, 6, "NP")]
    # a unary chain is one label, top first; a constituent over one word is a span of length 1
    assert tree_spans(Tree.fromstring(TREES[2])) == [
        (0, 5, "SINV"), (0, 1, "S+VP"), (2, 3, "VP"), (3, 4, "NP")]
    assert tree_spans(Tree.fromstring(TREES[3])) == [(0, 1, "NP")]


@pytest.mark.parametrize("line", TREES)
def test_spans_back_to_the_tree(line):
    t = Tree.fromstring(line)
    assert spans_to_tree(t.leaves(), tree_spans(t)) == xx(line)


def _brackets(i, j):
    """Every binary bracketing of fenceposts i..j: lists of its spans."""
    if j - i == 1:
        yield [(i, j)]
        return
    for k in range(i + 1, j):
        for left in _brackets(i, k):
            for right in _brackets(k, j):
                yield [(i, j)] + left + right


@pytest.mark.parametrize("n,seed", [(1, 0), (2, 1), (4, 2), (6, 3), (6, 4)])
def test_cky_finds_the_best_bracketing_that_brute_force_finds(n, seed):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(n + 1, n + 1))
    best = max(sum(scores[s] for s in b) for b in _brackets(0, n))
    spans = cky(scores)
    assert len(spans) == 2 * n - 1 and spans[0] == (0, n)
    assert math.isclose(sum(scores[s] for s in spans), best)
    assert sorted(spans) in [sorted(b) for b in _brackets(0, n)]


def _gold_log_probs(line: str, labels: list[str], p: float = 0.9) -> np.ndarray:
    t = Tree.fromstring(line)
    n = len(t.leaves())
    lp = np.full((n + 1, n + 1, len(labels)), math.log((1 - p) / (len(labels) - 1)))
    lp[..., 0] = math.log(p)
    for i, j, lab in tree_spans(t):
        lp[i, j] = math.log((1 - p) / (len(labels) - 1))
        lp[i, j, labels.index(lab)] = math.log(p)
    return lp


@pytest.mark.parametrize("line", TREES)
def test_decoding_gold_probabilities_gives_the_gold_tree(line):
    labels = [NONE, "S", "NP", "VP", "PP", "SINV", "S+VP"]
    words = Tree.fromstring(line).leaves()
    assert decode_tree(_gold_log_probs(line, labels), words, labels) == xx(line)


def test_the_whole_sentence_is_labelled_even_when_none_wins_there():
    labels = [NONE, "S", "NP"]
    lp = np.log(np.full((4, 4, 3), [0.98, 0.01, 0.01]))  # "none" best everywhere
    lp[0, 3] = np.log([0.5, 0.2, 0.3])
    tree = decode_tree(lp, ["a", "b", "c"], labels)
    assert tree == "(NP (XX a) (XX b) (XX c))"


def test_span_targets_label_the_constituents_and_ignore_the_rest():
    t = span_targets([(0, 3, 2), (0, 1, 1)], 3)
    assert t[0, 3] == 2 and t[0, 1] == 1 and t[1, 2] == 0 and t[1, 3] == 0
    assert (t[torch.tril(torch.ones(4, 4, dtype=torch.bool))] == -100).all()


def test_model_words_use_a_signature_only_when_the_vocabulary_has_it():
    index = {"the": 4, signature("Xylophones"): 5}
    assert model_words(["the", "Xylophones", "zzq"], index) == ["the", signature("Xylophones"), "zzq"]


def _tiny_model(seed=0, d_char=0):
    torch.manual_seed(seed)
    cfg = ChartConfig(n_layers=1, d_model=16, d_ff=32, n_heads=2, d_span=16, p_drop=0.0, p_word_drop=0.0,
                      d_char=d_char, max_chars=6)
    vocab = Vocabulary(list(SPECIALS) + list("abcd"), [NONE, "S", "NP", "VP"],
                       list(CHAR_SPECIALS) + list("abcd") if d_char else [])
    return ChartModel(SpanParser(cfg, len(vocab.words), 4, len(vocab.chars)).eval(), vocab)


def save(m: ChartModel, path):
    path.mkdir()
    write_model_dir(path, m.model.state_dict(), m.model.cfg, m.vocab, {})
    return path


@pytest.mark.parametrize("d_char", [0, 8])
def test_batched_scores_equal_one_sentence_at_a_time(d_char):
    m = _tiny_model(d_char=d_char)
    sents = [["a", "b", "c", "d", "a"], ["b"], ["c", "aabbccdd"], ["xyz", "a"]]
    with torch.no_grad():
        batch = m.logits(sents)  # (4, 6, 6, 4)
        for b, s in enumerate(sents):
            alone = m.logits([s])[0]
            f = len(s) + 1
            torch.testing.assert_close(batch[b, :f, :f], alone[:f, :f], atol=1e-5, rtol=1e-5)


def test_span_scores_equal_the_mlp_on_each_span_built_by_hand():
    """The factorized span layer (once per fencepost) against [f_j - f_i ; b_i - b_j] per span."""
    m = _tiny_model(2).model
    ids = encode([["a", "b", "c", "d"], ["d", "a"]], _tiny_model().vocab.word_index)
    with torch.no_grad():
        out = m(ids)
        h = m.encode(ids)
        half = h.size(-1) // 2
        for b, n in enumerate([4, 2]):
            for i in range(n + 1):
                for j in range(i + 1, n + 1):
                    fwd = lambda k: h[b, k, :half]  # noqa: E731 - token k, left of fencepost k
                    bwd = lambda k: h[b, k + 1, half:]  # noqa: E731 - token k+1, right of it
                    x = torch.cat([fwd(j) - fwd(i), bwd(i) - bwd(j)])
                    ref = m.span_out(torch.relu(m.span_norm(m.span_hidden(x))))
                    torch.testing.assert_close(out[b, i, j], ref, atol=1e-5, rtol=1e-5)
        lower = torch.ones(5, 5, dtype=torch.bool).tril()  # i >= j: not spans
        assert (out[1, :, 3:] == 0).all() and (out[0][lower] == 0).all()


def test_char_ids_by_hand():
    index = {c: k for k, c in enumerate(list(CHAR_SPECIALS) + ["a", "b", "c"])}  # a 4, b 5, c 6
    chars, where = char_ids([["ab", "b", "ab"], ["z"], ["abcabc"]], index, max_chars=4)
    # distinct words in order of first sight, row 0 empty; `z` unknown (1); `abcabc` longer than 4:
    # its first 2 and last 2 characters
    assert chars.tolist() == [[0, 0, 0, 0, 0, 0], [2, 4, 5, 3, 0, 0], [2, 5, 3, 0, 0, 0],
                              [2, 1, 3, 0, 0, 0], [2, 4, 5, 5, 6, 3]]
    assert where.tolist() == [[0, 1, 2, 1, 0], [0, 3, 0, 0, 0], [0, 4, 0, 0, 0]]


def test_the_char_encoder_once_per_distinct_word_equals_each_word_alone():
    """Each slot against its word's characters run through the layers by hand, unpadded: the
    padding of the batch and sharing a row between slots change nothing; BOS/EOS/PAD get 0."""
    torch.manual_seed(0)
    enc = CharEncoder(8, 5, 12)
    index = {c: k for k, c in enumerate(list(CHAR_SPECIALS) + ["a", "b", "c", "d"])}
    sents = [["abcd", "a", "abcd"], ["dcb"]]
    with torch.no_grad():
        got = enc(char_ids(sents, index, 20))  # (2, 5, 12)
        for b, words in enumerate(sents):
            for t in range(5):
                if not 1 <= t <= len(words):
                    assert (got[b, t] == 0).all()
                    continue
                ids = torch.tensor([2] + [index[c] for c in words[t - 1]] + [3])
                x = enc.embed.weight[ids].T[None]  # (1, d_char, len): this word only
                want = torch.relu(F.conv1d(x, enc.conv.weight, enc.conv.bias, padding=1))[0].amax(-1)
                torch.testing.assert_close(got[b, t], want, atol=1e-6, rtol=1e-5)


def _save_before_the_trainer(m: ChartModel, path, characters: bool = True):
    """A model directory as saved before the chart parser trained through `aiayn train`: chart.json
    holding kind, config, vocabularies and info; no config.json (and, older still, no characters)."""
    from safetensors.torch import save_file

    path.mkdir()
    config = {k: v for k, v in m.model.cfg.to_dict().items() if k in (
        "n_layers", "d_model", "d_ff", "n_heads", "p_drop", "p_word_drop", "d_span", "warmup_steps",
        "lr_scale", "lr_cooldown", "max_cells", "d_char", "max_chars")}
    meta = {"kind": "chart", "config": config, "words": m.vocab.words, "labels": m.vocab.labels,
            "chars": m.vocab.chars, "info": {"steps": 1}}
    if not characters:
        for key in ("d_char", "max_chars"):
            del meta["config"][key]
        del meta["chars"]
    (path / "chart.json").write_text(json.dumps(meta))
    save_file({k: v.contiguous() for k, v in m.model.state_dict().items()}, str(path / "model.safetensors"))
    return path


def test_models_saved_before_the_trainer_and_before_characters_still_load(tmp_path):
    m = _tiny_model(6)
    old = load_chart(_save_before_the_trainer(m, tmp_path / "m", characters=False))
    assert old.model.char_encoder is None and old.model.cfg.d_char == 0
    assert chart_parse([old], ["a b c d"]) == chart_parse([m], ["a b c d"])
    with_chars = _tiny_model(6, d_char=4)
    back = load_chart(_save_before_the_trainer(with_chars, tmp_path / "c"))
    assert back.vocab.chars == with_chars.vocab.chars
    assert chart_parse([back], ["a bad cab xyz"]) == chart_parse([with_chars], ["a bad cab xyz"])
    now = load_chart(save(with_chars, tmp_path / "now"))
    assert chart_parse([now], ["a bad cab xyz"]) == chart_parse([with_chars], ["a bad cab xyz"])


def test_parses_are_trees_over_the_words_and_an_ensemble_of_one_model_twice_is_that_model():
    m = _tiny_model(1)
    rng = random.Random(0)
    lines = [" ".join(rng.choice("abcdxy") for _ in range(rng.randint(1, 9))) for _ in range(12)] + [""]
    one, two = chart_parse([m], lines), chart_parse([m, m], lines)
    assert one == two and one[-1] == ""
    for line, tree in zip(lines[:-1], one):
        assert Tree.fromstring(tree).leaves() == line.split()


def _train(corpus, run, *extra):
    return main(["train", "--data", str(corpus), "--out", str(run), "--preset", "parsing-chart-small",
                 "--max-steps", "150", "--save-every", "10", "--eval-every", "75", "--no-progress",
                 "--no-tensorboard", "--threads", "1", "--set", *SMALL_CHART, *extra])


@pytest.mark.slow
@pytest.mark.parametrize("chars", [["d_char=0"], ["d_char=8"]])
def test_train_average_and_parse_end_to_end(tmp_path, capsys, chars):
    corpus = tiny_treebank_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    assert _train(corpus, run, *chars) == 0, capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 150 and summary["final_dev"]["dev_f1"] > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in records if r["kind"] == "dev"]
    assert [r["step"] for r in dev] == [75, 150] and dev[1]["dev_nll"] < dev[0]["dev_nll"]
    assert main(["average", "--run", str(run), "--out", str(tmp_path / "model")]) == 0
    model = tmp_path / "model"
    meta = json.loads((model / "meta.json").read_text())
    assert len(meta["averaged_from"]) == 5  # n_average: the last five checkpoints, 110-150
    vocab = json.loads((model / "chart.json").read_text())
    assert (len(vocab["chars"]) > len(CHAR_SPECIALS)) == (chars != ["d_char=0"])
    assert json.loads((model / "config.json").read_text())["task"] == "chart-parser"
    trees = tmp_path / "trees"
    assert main(["parse", "--model", str(model), "--input", str(corpus / "train.words"),
                 "--output", str(trees)]) == 0
    # four trees, 150 updates: learnt by heart
    assert trees.read_text().splitlines() == [xx(t) for t in TREES]
    capsys.readouterr()
    # the trainer's guarantees: a run directory is not reused unasked; a bad value is one line
    assert _train(corpus, run) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and err.count("\n") == 1
    assert _train(corpus, tmp_path / "x", "d_model=abc") == 2
    err = capsys.readouterr().err
    assert "d_model" in err and "abc" in err and err.count("\n") == 1


@pytest.mark.slow
def test_a_killed_chart_run_resumes_to_the_same_weights(tmp_path):
    """SIGKILL after the first checkpoint, then --resume: the uninterrupted run's weights,
    bit for bit (dropout on)."""
    from safetensors.torch import load_file

    corpus = tiny_treebank_corpus(tmp_path / "corpus", copies=8)
    common = ["--data", str(corpus), "--preset", "parsing-chart-small", "--set", *SMALL_CHART,
              "p_drop=0.2", "p_word_drop=0.1", "--max-steps", "120", "--save-every", "10",
              "--eval-every", "40", "--threads", "1", "--no-tensorboard", "--no-progress",
              "--seed", "3", "--save-minutes", "1000"]
    killed = tmp_path / "killed"
    train_until_killed(killed, common)
    r = run_cli("train", "--out", str(tmp_path / "ref"), *common)
    assert r.returncode == 0, r.stderr
    r = run_cli("train", "--out", str(killed), "--resume", *common)
    assert r.returncode == 0, r.stderr
    assert "resuming" in r.stderr
    a = load_file(str(tmp_path / "ref" / "last" / "model.safetensors"))
    b = load_file(str(killed / "last" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_checkpoint_of_another_corpus_is_not_resumed(tmp_path, capsys):
    corpus = tiny_treebank_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    assert _train(corpus, run) == 0
    other = tiny_treebank_corpus(tmp_path / "other", TREES[:2])
    capsys.readouterr()
    assert main(["train", "--data", str(other), "--out", str(run), "--resume",
                 "--max-steps", "160", "--no-progress", "--no-tensorboard"]) == 2
    err = capsys.readouterr().err
    assert "vocabulary" in err and err.count("\n") == 1


def test_the_sampler_resumes_where_it_stopped_and_shares_batches_among_ranks():
    from aiayn.parsing.chart.data import ChartSampler, length_batches

    lengths = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6, 2, 3]
    batches = length_batches(lengths, 60)
    assert sorted(k for b in batches for k in b) == list(range(len(lengths)))
    for b in batches:  # each batch within the budget, or one sentence alone
        assert len(b) == 1 or (max(lengths[k] for k in b) + 1) ** 2 * len(b) <= 60
    whole = ChartSampler(lengths, 60, seed=4)
    run = [list(b) for _ in range(3) for b in whole]  # three epochs
    again = ChartSampler(lengths, 60, seed=4)
    first = [list(b) for b in itertools.islice(iter(again), 2)]
    state = again.state_dict()
    resumed = ChartSampler(lengths, 60, seed=4)
    resumed.load_state_dict(state)
    rest = [list(b) for b in resumed] + [list(b) for _ in range(2) for b in resumed]
    assert first + rest == run
    assert run[: len(whole)] != run[len(whole): 2 * len(whole)]  # a new order each epoch
    ranks = [ChartSampler(lengths, 60, seed=4, rank=r, world_size=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == len(batches) // 2
    shared = [list(b) for r in ranks for b in r]
    assert len({tuple(b) for b in shared}) == len(shared)  # no batch on two ranks
    with pytest.raises(Exception, match="max_tokens"):
        ChartSampler(lengths, 61, seed=4).load_state_dict(state)


def test_the_config_follows_the_config_conventions():
    cfg = ChartConfig().with_overrides(["d_model=64", "p_drop=0.3", "d_char=0"])
    assert (cfg.d_model, cfg.p_drop, cfg.d_char) == (64, 0.3, 0)
    back = ChartConfig.from_dict(json.loads(cfg.to_json()))
    assert back == cfg and json.loads(cfg.to_json())["task"] == "chart-parser"
    assert cfg.architecture_changes(ChartConfig()) == ["d_model: 64 -> 128", "d_char: 0 -> 32"]
    from aiayn.config import BASE
    from aiayn.errors import UserError

    with pytest.raises(UserError, match="not a chart-parser"):
        ChartConfig.from_dict(BASE.to_dict())
    with pytest.raises(UserError, match="a chart-parser model"):
        type(BASE).from_dict(json.loads(cfg.to_json()))
    with pytest.raises(UserError, match="unknown config field 'd_spam'"):
        ChartConfig().with_overrides(["d_spam=3"])


def test_a_chart_parser_and_a_sequence_model_do_not_ensemble(tmp_path, capsys):
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "chart.json").write_text(json.dumps({"kind": "chart"}))
    other = tmp_path / "other"
    other.mkdir()
    assert main(["parse", "--model", str(chart), str(other), "--input", str(tmp_path / "in")]) == 2
    err = capsys.readouterr().err
    assert "cannot parse as one ensemble" in err and err.count("\n") == 1


def test_the_config_refuses_bad_values():
    from aiayn.errors import UserError

    with pytest.raises(UserError, match="d_model"):
        ChartConfig(d_model="wide")
    with pytest.raises(UserError, match="n_heads"):
        ChartConfig(d_model=30, n_heads=4)
    with pytest.raises(UserError, match="p_drop"):
        ChartConfig(p_drop=1.0)
    with pytest.raises(UserError, match="d_char"):
        ChartConfig(d_char=-1)


def test_every_bracketing_of_four_words_is_reachable():
    """CKY with scores that favour one bracketing returns exactly it, for all five of n = 4."""
    for b in _brackets(0, 4):
        scores = np.full((5, 5), -1.0)
        for s in b:
            scores[s] = 1.0
        assert sorted(cky(scores)) == sorted(b)
    assert len(list(itertools.islice(_brackets(0, 4), 10))) == 5


def test_span_votes_add_the_weight_per_tree_and_skip_unknown_labels():
    a = Tree.fromstring("(S (NP (XX a) (XX b)) (VP (XX c)))")
    b = Tree.fromstring("(S (XX a) (FRAG (XX b) (XX c)))")
    v = span_votes([a, b], 3, [NONE, "S", "NP", "VP"], 0.5)
    assert v[0, 3, 1] == 1.0 and v[0, 2, 2] == 0.5 and v[2, 3, 3] == 0.5
    assert v.sum() == 2.0  # FRAG is not a label of the model: no vote


def test_heavy_votes_make_the_chart_write_the_voted_spans():
    m = _tiny_model(3)
    voted = "(S (NP (XX a) (XX b)) (VP (XX c) (NP (XX d))))"
    out = chart_parse([m], ["a b c d"], votes=[[Tree.fromstring(voted)]], vote_weight=100.0)
    # every voted span is written; the model may add spans of its own that cross none of them
    assert set(tree_spans(Tree.fromstring(voted))) <= set(tree_spans(Tree.fromstring(out[0])))
    unvoted = chart_parse([m], ["a b c d"])
    assert not set(tree_spans(Tree.fromstring(voted))) <= set(tree_spans(Tree.fromstring(unvoted[0])))


def test_parse_with_votes_from_the_command_line(tmp_path, capsys):
    model = save(_tiny_model(4), tmp_path / "chart")
    (tmp_path / "in").write_text("a b c d\n\nb a\n")
    votes = tmp_path / "votes"
    votes.write_text("(S (NP (XX a) (XX b)) (VP (XX c) (NP (XX d))))\n\n(S (XX b) (VP (XX a)))\n")
    out = tmp_path / "out"
    assert main(["parse", "--model", str(model), "--input", str(tmp_path / "in"), "--output", str(out),
                 "--votes", str(votes), "--vote-weight", "50"]) == 0
    got = out.read_text().splitlines()
    for want, tree in zip(votes.read_text().splitlines(), got):
        if want:
            assert set(tree_spans(Tree.fromstring(want))) <= set(tree_spans(Tree.fromstring(tree)))
    assert len(got) == 3 and got[1] == ""
    capsys.readouterr()
    short = tmp_path / "short"
    short.write_text("(S (XX a))\n")
    assert main(["parse", "--model", str(model), "--input", str(tmp_path / "in"), "--votes", str(short)]) == 2
    err = capsys.readouterr().err
    assert "1 lines, but the input has 3" in err and err.count("\n") == 1
    other = tmp_path / "other"
    other.write_text("(S (XX a) (XX b) (XX x) (XX d))\n\n(S (XX b) (XX a))\n")
    assert main(["parse", "--model", str(model), "--input", str(tmp_path / "in"), "--votes", str(other)]) == 2
    err = capsys.readouterr().err
    assert "other words than input line 1" in err and err.count("\n") == 1
    from aiayn.config import BASE

    seq = tmp_path / "seq"
    seq.mkdir()
    (seq / "config.json").write_text(BASE.to_json())
    assert main(["parse", "--model", str(seq), "--input", str(tmp_path / "in"), "--votes", str(votes)]) == 2
    assert "needs chart parsers" in capsys.readouterr().err
    # the search options are for sequence-to-sequence parsers: refused, not ignored
    assert main(["parse", "--model", str(model), "--input", str(tmp_path / "in"), "--beam", "4"]) == 2
    err = capsys.readouterr().err
    assert "--beam" in err and "CKY" in err and err.count("\n") == 1
    # a damaged model is one line, no traceback
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:100])
    assert main(["parse", "--model", str(model), "--input", str(tmp_path / "in")]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and err.count("\n") == 1
