"""Test-wide settings and the pytest fixtures that several test modules use; everything else the
tests share is in helpers.py."""

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from aiayn.cli import main
from aiayn.data.model_dir import save_model
from aiayn.data.tokenizer import Tokenizer
from aiayn.model import Transformer

from helpers import DE, EN, MICRO, TEXTS, sentences, write_lines


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
    d = tmp_path_factory.mktemp("model")
    tok = Tokenizer.train(TEXTS * 3, 48, path=d / "spm.model", byte_fallback=False)
    cfg = replace(MICRO, vocab_size=tok.vocab_size, n_layers=1, d_model=32,
                  d_ff=64, n_heads=4, max_len_b=8)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    return save_model(d / "model", model, cfg, {"spm.model": d / "spm.model"})


@pytest.fixture
def raw(tmp_path):
    """Train (with an empty pair, a long pair and a lopsided pair), valid and test corpora."""
    d = tmp_path / "raw"
    d.mkdir()
    src, tgt = sentences(EN, 200, 1), sentences(DE, 200, 2)
    src[5], tgt[5] = "", "nur Ziel"  # empty source
    src[9], tgt[9] = " ".join(["big"] * 60), " ".join(["groß"] * 60)  # too long with max_len 40
    src[17], tgt[17] = "a", " ".join(["Hund"] * 25)  # length ratio >= 12.5
    write_lines(d / "train.en", src, gz=True)
    write_lines(d / "train.de", tgt, gz=True)
    vsrc, vtgt = sentences(EN, 20, 3), sentences(DE, 20, 4)
    vsrc[3], vtgt[3] = "", ""  # dev keeps empty lines
    vsrc[4], vtgt[4] = "dog", " ".join(["Hund"] * 25)  # and lopsided ones
    write_lines(d / "val.en", vsrc)
    write_lines(d / "val.de", vtgt)
    tsrc, ttgt = sentences(EN, 10, 5), sentences(DE, 10, 6)
    write_lines(d / "test.en", tsrc)
    write_lines(d / "test.de", ttgt)
    return {"dir": d, "train": (src, tgt), "valid": (vsrc, vtgt), "test": (tsrc, ttgt)}


@pytest.fixture
def aiayn(capsys):
    """`aiayn ARGS` in this process: (exit status, stdout, stderr)."""
    def run(*args):
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err
    return run


# A test of an optional extra skips itself where its package is missing (`pytest.importorskip`),
# which is right on a user's machine and wrong in CI: scripts/test.sh installs every extra the
# tests need, so there a missing package means a failed install, and the run fails with the
# package named instead of passing without those tests. Skips for hardware (no VNNI, no native
# bf16) are not failures; `-rs` lists them by name.
_MISSING_PACKAGE = "could not import "
_missing: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
        if _MISSING_PACKAGE in reason:
            _missing.append(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}")


def pytest_terminal_summary(terminalreporter):
    if _missing and os.environ.get("CI") == "true":
        terminalreporter.section("missing packages (CI installs every extra the tests need)")
        for line in _missing:
            terminalreporter.line(line)


def pytest_sessionfinish(session, exitstatus):
    if _missing and os.environ.get("CI") == "true" and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
