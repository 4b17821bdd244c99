"""Test-wide settings and shared fixtures."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from training_fixtures import MICRO

from aiayn.model.int8 import int8_supported

needs_int8 = pytest.mark.skipif(not int8_supported(), reason="needs fbgemm on an x86 CPU with AVX2")

TEXTS = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "ein hund läuft im park",
    "die katze sitzt auf der matte",
    "the children play in the garden",
    "die kinder spielen im garten",
]


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests' micro models run fastest on one thread; on a shared, loaded 2-core machine a
    second OpenMP thread can make each tiny kernel wait milliseconds. (Subprocess tests set
    OMP_NUM_THREADS themselves.)"""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A saved model directory: a random 1-layer micro model with a tiny shared sentencepiece
    vocabulary learned from TEXTS."""
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.model import Transformer
    from aiayn.model.io import save_model

    d = tmp_path_factory.mktemp("model")
    tok = Tokenizer.train(TEXTS * 3, 48, path=d / "spm.model", byte_fallback=False)
    cfg = replace(MICRO, vocab_size=tok.vocab_size, n_layers=1, d_model=32,
                  d_ff=64, n_heads=4, max_len_b=8)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    return save_model(d / "model", model, cfg, {"spm.model": d / "spm.model"})


# --- a briefly trained model (confident, position-dependent outputs) ---------------------------


def train_reverser(cfg, steps: int = 120, seed: int = 0):
    """A model trained briefly to output its source reversed (ids mapped into the target
    vocabulary): enough for varied, position-dependent greedy outputs."""
    import torch.nn.functional as F

    from aiayn.decoding.common import source_batch
    from aiayn.model import Transformer
    from aiayn.special import BOS_ID, EOS_ID, PAD_ID

    torch.manual_seed(seed)
    model = Transformer(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)
    v_src, v_tgt = cfg.src_vocab, cfg.tgt_vocab
    for _ in range(steps):
        srcs = [torch.randint(4, v_src, (int(n),), generator=g).tolist()
                for n in torch.randint(2, 9, (32,), generator=g)]
        tgts = [[4 + (x - 4) % (v_tgt - 4) for x in reversed(s)] for s in srcs]
        src, src_mask = source_batch(srcs)
        width = max(map(len, tgts)) + 1
        tgt_in = torch.full((len(tgts), width), PAD_ID)
        tgt_out = torch.full((len(tgts), width), PAD_ID)
        for i, t in enumerate(tgts):
            tgt_in[i, : len(t) + 1] = torch.tensor([BOS_ID] + t)
            tgt_out[i, : len(t) + 1] = torch.tensor(t + [EOS_ID])
        logits = model(src, tgt_in, src_mask)  # (B, T, V)
        loss = F.cross_entropy(logits.transpose(1, 2), tgt_out, ignore_index=PAD_ID)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def reverser_model_dir(root: Path, separate: bool = False, **overrides) -> Path:
    """A saved, briefly trained model directory; `separate` gives it its own target vocabulary."""
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.model.io import save_model

    root.mkdir(parents=True, exist_ok=True)
    if separate:
        src_tok = Tokenizer.train(TEXTS[::2] * 3, 40, path=root / "src.spm.model", byte_fallback=False)
        tgt_tok = Tokenizer.train(TEXTS[1::2] * 3, 34, path=root / "tgt.spm.model", byte_fallback=False)
        files = {"src.spm.model": root / "src.spm.model", "tgt.spm.model": root / "tgt.spm.model"}
        overrides = dict(tgt_vocab_size=tgt_tok.vocab_size, tie_embeddings=False, **overrides)
    else:
        src_tok = Tokenizer.train(TEXTS * 3, 48, path=root / "spm.model", byte_fallback=False)
        files = {"spm.model": root / "spm.model"}
    sizes = dict(n_layers=2, d_model=32, d_ff=64, n_heads=4, p_drop=0.0)
    cfg = replace(MICRO, vocab_size=src_tok.vocab_size, **{**sizes, **overrides})
    return save_model(root / "model", train_reverser(cfg), cfg, files)
