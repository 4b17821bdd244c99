"""Test-wide settings and shared fixtures."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

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
    from aiayn.config import get_preset
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.model import Transformer
    from aiayn.model.io import save_model

    d = tmp_path_factory.mktemp("model")
    tok = Tokenizer.train(TEXTS * 3, 48, path=d / "spm.model", byte_fallback=False)
    cfg = replace(get_preset("micro"), vocab_size=tok.vocab_size, n_layers=1, d_model=32,
                  d_ff=64, n_heads=4, max_len_b=8)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    return save_model(d / "model", model, cfg, {"spm.model": d / "spm.model"})
