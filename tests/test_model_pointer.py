"""`Config.pointer` (not in the paper): each decoder input adds the projected encoder output at the
source position of the next slot. Positions worked by hand; the feature against a loop over
sentences and steps; cached decoding (with rows reordered as beam search moves them) against the
full decoder; a task only the next word decides, learnt with the pointer; and the recipe's path:
train on linearized trees, average, parse, and the one-line refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from nltk.tree import Tree

from aiayn.cli import main
from aiayn.config import Config
from aiayn.decoding import greedy_search
from aiayn.decoding.common import source_batch
from aiayn.errors import UserError
from aiayn.model import Transformer
from aiayn.special import BOS_ID, EOS_ID, PAD_ID
from training_fixtures import MICRO

V = 20
SLOTS = torch.zeros(V, dtype=torch.bool)
SLOTS[10:] = True  # ids 10-19 stand for words; 4-9 are brackets


def _model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    cfg = replace(MICRO, vocab_size=V, n_layers=2, d_model=16, d_ff=32, n_heads=2, norm="pre",
                  p_drop=0.0, pointer=True, **changes)
    model = Transformer(cfg).eval()
    model.set_pointer_slots(SLOTS)
    return model


def test_positions_count_the_slots_written_and_stop_at_eos():
    model = _model()
    src = torch.tensor([[11, 12, 13, EOS_ID], [14, EOS_ID, PAD_ID, PAD_ID]])  # 3 and 1 words
    tgt = torch.tensor([[BOS_ID, 4, 10, 5, 11, 12, 6, 7],
                        [BOS_ID, 4, 15, 6, 7, PAD_ID, PAD_ID, PAD_ID]])
    # after BOS and "(": word 0 next; after each slot one further; all written: EOS (3, then 1)
    assert model.pointer_positions(tgt, src != PAD_ID).tolist() == [[0, 0, 1, 1, 2, 3, 3, 3],
                                                                   [0, 0, 1, 1, 1, 1, 1, 1]]


def test_the_input_is_the_projected_encoder_output_at_that_position():
    model = _model()
    src = torch.tensor([[11, 12, 13, EOS_ID], [14, 15, EOS_ID, PAD_ID]])
    tgt = torch.tensor([[BOS_ID, 4, 10, 11, 12, 5], [BOS_ID, 12, 4, 13, 5, 6]])
    mask = src != PAD_ID
    memory = torch.randn(2, 4, 16)
    got = model._pointer_input(tgt, memory, mask)
    w = model.pointer_proj.weight
    for b in range(2):
        n_src = int(mask[b].sum())
        written = 0
        for t in range(tgt.size(1)):
            written += int(SLOTS[tgt[b, t]])
            want = w @ memory[b, min(written, n_src - 1)]
            assert torch.allclose(got[b, t], want, atol=1e-6)
    assert Transformer(replace(model.cfg, pointer=False))._pointer_input(tgt, memory, mask) is None


def test_cached_steps_equal_the_full_decoder_through_reorders():
    """decode_step with rows reordered, duplicated and dropped mid-way (as beam search moves its
    hypotheses) gives the full decoder's logits for each row's own prefix."""
    model = _model(seed=1)
    src = torch.tensor([[11, 12, 13, EOS_ID], [14, 15, EOS_ID, PAD_ID], [16, EOS_ID, PAD_ID, PAD_ID]])
    mask = src != PAD_ID
    prefixes = torch.tensor([[BOS_ID, 4, 10, 11, 5, 12, 13, 6],
                             [BOS_ID, 12, 4, 13, 5, 6, 14, 7],
                             [BOS_ID, 4, 15, 5, 16, 17, 6, 7]])
    with torch.no_grad():
        memory = model.encode(src, mask)
        cache = model.new_cache(memory, mask)
        rows = torch.arange(3)  # which prefix each cache row follows
        for t in range(prefixes.size(1)):
            if t == 3:  # row 0 copied twice, row 2 dropped, its source rows with it
                rows = rows[torch.tensor([0, 0, 1])]
                cache.reorder(torch.tensor([0, 0, 1]))
            got = model.decode_step(prefixes[rows, t : t + 1], cache)
            full = model.decode(prefixes[rows, : t + 1], memory[rows], mask[rows])[:, -1]
            assert torch.allclose(got, full, atol=1e-5), t


def test_the_pointer_learns_what_only_the_next_word_decides():
    """Each word w gets a bracket of its own, "(A w )A" for w < 15, "(B w )B" otherwise, so the
    opening token depends on the next word alone: with the pointer a tiny model writes every
    tree of held-out sentences exactly after 150 updates."""
    g = torch.Generator().manual_seed(0)

    def task(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        srcs, tgts = [], []
        for _ in range(n):
            words = torch.randint(10, 20, (int(torch.randint(2, 6, (1,), generator=g)),),
                                  generator=g).tolist()
            tree = [4]  # "(S"
            for w in words:
                tree += [5, w, 6] if w < 15 else [7, w, 8]
            srcs.append(words + [EOS_ID])
            tgts.append(tree + [9, EOS_ID])  # ")S"
        pad = lambda rows: torch.tensor([r + [PAD_ID] * (max(map(len, rows)) - len(r)) for r in rows])
        return pad(srcs), pad(tgts)

    model = _model(seed=2).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        src, tgt = task(32)
        tgt_in = torch.cat([torch.full((32, 1), BOS_ID), tgt[:, :-1]], dim=1)
        logits = model(src, tgt_in)
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    src, tgt = task(20)
    hyps = greedy_search(model, src, src != PAD_ID, 0.0, 30)
    for h, row in zip(hyps, tgt.tolist()):
        assert h.tokens == [t for t in row if t not in (PAD_ID, EOS_ID)]


def test_config_and_slots_are_checked():
    with pytest.raises(UserError, match="pointer"):
        Config(arch="rnn", pointer=True)
    model = _model()
    with pytest.raises(ValueError, match="at least one slot"):
        model.set_pointer_slots(torch.zeros(V, dtype=torch.bool))
    with pytest.raises(ValueError, match="Config.pointer"):
        Transformer(replace(model.cfg, pointer=False)).set_pointer_slots(SLOTS)


@pytest.fixture
def corpus(tmp_path):
    """A treebank corpus as `aiayn treebank --slots words` writes it: sentences and trees."""
    words = ["the cat sat .", "a dog ran on the mat", "it sat .", "the dog ran ."] * 6
    trees = ["(S (NP the cat )NP (VP sat )VP . )S",
             "(S (NP a dog )NP (VP ran (PP on (NP the mat )NP )PP )VP )S",
             "(S (NP it )NP (VP sat )VP . )S", "(S (NP the dog )NP (VP ran )VP . )S"] * 6
    for split in ("train", "valid"):
        (tmp_path / f"{split}.words").write_text("".join(w + "\n" for w in words))
        (tmp_path / f"{split}.tree").write_text("".join(t + "\n" for t in trees))
    return tmp_path


def _prepare(corpus, out, model_type, vocab_size):
    return main(["prepare", "--src-lang", "words", "--tgt-lang", "tree", "--train",
                 str(corpus / "train"), "--valid", str(corpus / "valid"), "--model-type",
                 model_type, "--vocab-size", str(vocab_size), "--max-len", "0", "--max-ratio",
                 "0", "--out", str(out)])


def test_train_average_and_parse_with_the_pointer(corpus, tmp_path, capsys):
    from aiayn.model.io import load_model
    from aiayn.parsing.constrain import TreeVocabulary

    data = tmp_path / "data"
    assert _prepare(corpus, data, "word", 22) == 0
    run = tmp_path / "run"
    tiny = ["d_model=32", "d_ff=64", "n_layers=1", "n_heads=4", "warmup_steps=30", "max_tokens=300"]
    assert main(["train", "--data", str(data), "--out", str(run), "--preset", "parsing-small-v3-pointer",
                 "--set", *tiny, "--max-steps", "4", "--save-every", "2", "--eval-every", "0"]) == 0
    assert main(["average", "--run", str(run), "--last", "2", "--out", str(tmp_path / "model")]) == 0
    loaded = load_model(tmp_path / "model")
    assert loaded.cfg.pointer
    assert torch.equal(loaded.model.pointer_slots, TreeVocabulary.from_tokenizer(loaded.tgt_tokenizer).slot)
    out = tmp_path / "valid.trees"
    assert main(["parse", "--model", str(tmp_path / "model"), "--input", str(corpus / "valid.words"),
                 "--output", str(out), "--constrained", "--beam", "3"]) == 0
    assert "no repairs" in capsys.readouterr().err
    for line, tree in zip((corpus / "valid.words").read_text().splitlines(), out.read_text().splitlines()):
        assert Tree.fromstring(tree).leaves() == line.split()
    # a source of characters cannot be pointed into word by word: one line, exit 2
    assert _prepare(corpus, tmp_path / "chars", "char", 30) == 0
    capsys.readouterr()
    code = main(["train", "--data", str(tmp_path / "chars"), "--out", str(tmp_path / "r2"), "--preset",
                 "parsing-small-v3-pointer", "--set", *tiny, "--max-steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--model-type word" in err and err.count("\n") == 1
    assert json.loads((tmp_path / "model" / "config.json").read_text())["pointer"] is True
