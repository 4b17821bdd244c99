"""`Translator` and `aiayn translate`: one output line per input line, in order, empty lines kept
empty, over-long lines truncated with a warning, atomic output, clean user errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import SearchOptions, Translator, search_batched
from aiayn.errors import UserError

REPO = Path(__file__).resolve().parents[1]
@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_model(model_dir)


LINES = [
    "the cat sat on the mat",
    "",
    "a dog runs",
    " ".join(["the children play in the garden"] * 40),  # far beyond --max-src-tokens 64
    "",
    "die katze",
    "   ",
    "ein hund läuft im park",
]


def test_translator_keeps_order_and_empty_lines(loaded):
    warnings = []
    tr = Translator(loaded, precision="fp32", max_src_tokens=64, warn=warnings.append, batch_tokens=60)
    out = tr.translate(LINES)
    assert len(out) == len(LINES)
    assert out[1] == out[4] == out[6] == ""  # blank in, blank out ...
    nbest = tr.translate_nbest(LINES, 2)
    assert nbest[1] == nbest[4] == nbest[6] == [(0.0, "")]  # ... without running the model
    # Each line translated alone gives the same text: batching and sorting change nothing.
    alone = [Translator(loaded, precision="fp32", max_src_tokens=64, warn=lambda m: None)
             .translate([line])[0]
             for line in LINES]
    assert out == alone
    # The long line is truncated to 63 pieces + EOS, with one warning naming line 4.
    assert len(warnings) == 2 and all(w.startswith("line 4:") for w in warnings)  # two calls
    pieces = loaded.src_tokenizer.encode(LINES[3])[:63]
    (hyp,), = tr.search([pieces])
    assert out[3] == loaded.tgt_tokenizer.decode(hyp.tokens)


def test_translator_nbest_and_greedy(loaded):
    tr = Translator(loaded, precision="fp32", beam_size=3)
    nbest = tr.translate_nbest(LINES[:3], 3)
    assert [len(n) for n in nbest] == [3, 1, 3]
    for entries in nbest:
        scores = [s for s, _ in entries]
        assert scores == sorted(scores, reverse=True)
    assert [n[0][1] for n in nbest] == tr.translate(LINES[:3])
    assert nbest[1] == [(0.0, "")]
    greedy = Translator(loaded, precision="fp32", greedy=True)
    ids = [loaded.src_tokenizer.encode(line) for line in LINES[:3] if line]
    # tokens in, tokens out: the training loop's dev-BLEU path
    found = search_batched(loaded.model, ids, SearchOptions(greedy=True))
    assert [h[0].tokens for h in found] == [h[0].tokens for h in greedy.search(ids)]
    loaded.model.train()  # as during training: searched in eval mode, then put back
    try:
        again = search_batched(loaded.model, ids, SearchOptions(greedy=True))
        assert loaded.model.training
    finally:
        loaded.model.eval()
    assert [h[0].tokens for h in again] == [h[0].tokens for h in found]
    with pytest.raises(ValueError):
        Translator(loaded, precision="fp32", greedy=True, nbest=2)
    with pytest.raises(ValueError):
        Translator(loaded, precision="fp32", beam_size=2).translate_nbest(["a"], 3)


def test_search_chooses_the_attention_kernels_for_its_device(loaded, monkeypatch):
    """On a GPU the whole search runs without cuDNN's attention (a plan per new shape, and
    decoding makes one every step); on CPU, PyTorch's choice. The flags are checked from inside
    the search, at each decoding step, and are back as they were afterwards."""
    import torch

    from aiayn.decoding import engine
    from aiayn.kernels.attention import decoding_kernels

    cuda = torch.backends.cuda
    with decoding_kernels(torch.device("cuda")):
        assert not cuda.cudnn_sdp_enabled()
        assert cuda.flash_sdp_enabled() and cuda.mem_efficient_sdp_enabled() and cuda.math_sdp_enabled()
    assert cuda.cudnn_sdp_enabled()
    with decoding_kernels(torch.device("cpu")):
        assert cuda.cudnn_sdp_enabled()

    seen = []
    step = type(loaded.model).decode_step

    def spy(self, *args, **kwargs):
        seen.append(cuda.cudnn_sdp_enabled())
        return step(self, *args, **kwargs)

    # a CPU model decoded as if its device were a GPU: only the kernel choice differs
    monkeypatch.setattr(type(loaded.model), "decode_step", spy)
    monkeypatch.setattr(engine, "decoding_kernels", lambda device: decoding_kernels(torch.device("cuda")))
    ids = [loaded.src_tokenizer.encode("a dog runs")]
    search_batched(loaded.model, ids)
    assert seen and not any(seen)
    assert cuda.cudnn_sdp_enabled()


def _cli(*args, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """`aiayn translate` in fp32, as the Translators it is compared with (the CLI's default,
    auto, is bf16 on a CPU with native bf16); a --precision in `args` comes later and wins."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "aiayn", "translate", "--precision", "fp32",
                           *map(str, args)],
                          input=stdin, capture_output=True, cwd=REPO, env=env, timeout=120)


@pytest.mark.slow
def test_cli_file_to_file(model_dir, loaded, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    r = _cli("--model", model_dir, "--input", src, "--output", out, "--max-src-tokens", 64,
             "--batch-size", 3)
    assert r.returncode == 0, r.stderr
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) - 1 == len(LINES)
    expected = Translator(loaded, precision="fp32", max_src_tokens=64, warn=lambda m: None).translate(LINES)
    assert got[:-1] == expected
    stderr = r.stderr.decode()
    assert "line 4:" in stderr and "warning" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]  # no temp files

    # An existing output is refused (one line, exit 2) and left alone; --overwrite replaces it.
    out.write_text("keep me\n")
    r = _cli("--model", model_dir, "--input", src, "--output", out)
    assert r.returncode == 2 and b"--overwrite" in r.stderr and r.stderr.count(b"\n") == 1
    assert out.read_text() == "keep me\n"
    # A failure after the check (bad input) leaves the old file intact even with --overwrite.
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nbroken \xff line\n")
    r = _cli("--model", model_dir, "--input", bad, "--output", out, "--overwrite")
    assert r.returncode == 2 and b":2:" in r.stderr and b"Traceback" not in r.stderr
    assert out.read_text() == "keep me\n"
    r = _cli("--model", model_dir, "--input", src, "--output", out, "--overwrite",
             "--max-src-tokens", 64)
    assert r.returncode == 0 and out.read_text(encoding="utf-8").split("\n")[:-1] == expected


@pytest.mark.slow
def test_cli_stdin_stdout_nbest(model_dir):
    text = "the cat\n\na dog runs\n".encode()
    r = _cli("--model", model_dir, "--nbest", 2, stdin=text)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.decode().split("\n")[:-1]]
    assert [row[0] for row in rows] == ["0", "0", "1", "2", "2"]
    assert rows[2][1:] == ["0.000000", ""]
    assert float(rows[0][1]) >= float(rows[1][1]) and float(rows[3][1]) >= float(rows[4][1])
    plain = _cli("--model", model_dir, stdin=text)
    assert plain.stdout.decode().split("\n")[:-1] == [rows[0][2], "", rows[3][2]]
    greedy = _cli("--model", model_dir, "--greedy", "--interactive", stdin=text)
    assert greedy.returncode == 0 and len(greedy.stdout.decode().split("\n")) == 4


def test_cli_early_stop_option(model_dir, loaded):
    text = "the cat sat on the mat\na dog runs\nein hund läuft im park\n"
    r = _cli("--model", model_dir, "--early-stop", "current", "--alpha", "1.5", stdin=text.encode())
    assert r.returncode == 0, r.stderr
    lines = text.splitlines()
    tr = Translator(loaded, precision="fp32", early_stop="current", alpha=1.5)
    assert r.stdout.decode().split("\n")[:-1] == tr.translate(lines)
    r = _cli("--model", model_dir, "--early-stop", "never", stdin=text.encode())
    assert r.returncode == 2 and b"invalid choice" in r.stderr
    with pytest.raises(ValueError, match="early_stop"):
        SearchOptions(early_stop="never").validate()


@pytest.mark.slow
def test_cli_user_errors(model_dir, tmp_path):
    r = _cli("--model", tmp_path / "nope", stdin=b"hello\n")
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"nope" in r.stderr
    assert b"Traceback" not in r.stderr
    r = _cli("--model", model_dir, "--input", tmp_path / "missing.txt")
    assert r.returncode == 2 and b"missing.txt" in r.stderr and b"Traceback" not in r.stderr
    r = _cli("--model", model_dir, "--beam", 2, "--nbest", 3, stdin=b"x\n")
    assert r.returncode == 2 and b"beam size" in r.stderr


def _read_line(f, timeout: float) -> bytes:
    """One line from the pipe `f` within `timeout` seconds (b"" on timeout)."""
    import select

    buf = b""
    while not buf.endswith(b"\n"):
        if not select.select([f], [], [], timeout)[0]:
            return b""
        chunk = os.read(f.fileno(), 1)
        if not chunk:
            return buf
        buf += chunk
    return buf


def test_cli_from_a_pipe_answers_each_line_before_the_next_is_sent(model_dir, loaded):
    """A program that writes a line and waits for its translation gets it: the command reads and
    writes as it goes, flushing each answer, and never waits for the end of its input."""
    lines = ["the cat sat on the mat", "", "a dog runs", "ein hund läuft im park"]
    expected = Translator(loaded, precision="fp32").translate(lines)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "aiayn", "translate", "--precision", "fp32",
                          "--model", str(model_dir)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    try:
        for line, want in zip(lines, expected):
            p.stdin.write(line.encode() + b"\n")
            p.stdin.flush()
            got = _read_line(p.stdout, timeout=90)
            assert got == want.encode() + b"\n", (line, got, p.poll())
        p.stdin.close()
        assert p.wait(timeout=60) == 0 and p.stdout.read() == b""
    finally:
        p.kill()
        p.wait()


def test_cli_streams_a_file_in_groups_with_the_same_result(model_dir, loaded, tmp_path, monkeypatch,
                                                           capsys):
    """Groups smaller than the file (translated and written one after another, line numbers in
    warnings counted across them) give the same output as one whole-file translation."""
    from aiayn.cli import main as cli_main
    from aiayn.commands import translate as translate_command

    src = tmp_path / "in.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    monkeypatch.setattr(translate_command, "STREAM_LINES", 3)
    out = tmp_path / "out.txt"
    assert cli_main(["translate", "--precision", "fp32", "--model", str(model_dir), "--input",
                     str(src), "--output", str(out), "--max-src-tokens", "64"]) == 0
    warnings: list[str] = []
    expected = Translator(loaded, precision="fp32", max_src_tokens=64, warn=warnings.append).translate(LINES)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert warnings and warnings[0].startswith("line 4:")
    assert "warning: line 4:" in capsys.readouterr().err  # the second group's first line


def test_stream_hands_back_each_line_in_order_while_later_input_waits(loaded):
    """`Translator.stream`, what `aiayn translate` writes with: one engine for the whole input,
    every line's result in input order and equal to translating it alone (blank lines too), and
    a line's result comes out while the next group of input has not arrived: the input is read
    beside the search, which waits for it only when it has nothing to decode."""
    import threading

    tr = Translator(loaded, precision="fp32")
    first_out = threading.Event()
    groups = [LINES[:3], ["", "  "], LINES[3:] + LINES[:2]]

    def slow_input():
        yield groups[0]
        assert first_out.wait(60), "the first group's results never came while input waited"
        yield from groups[1:]

    got = []
    for ready in tr.stream(slow_input()):
        got += ready
        first_out.set()
    flat = [line for g in groups for line in g]
    assert [i for i, _ in got] == list(range(len(flat)))
    want = [tr.translate([line])[0] for line in flat]
    assert [tr.detokenize(h[0].tokens) for _, h in got] == want


def test_stream_raises_the_reading_error_after_the_lines_before_it(loaded):
    def broken():
        yield ["the cat sat on the mat"]
        raise UserError("<stdin>: line 2: invalid UTF-8")

    seen = []
    with pytest.raises(UserError, match="line 2"):
        for ready in Translator(loaded, precision="fp32").stream(broken()):
            seen += ready
    assert [i for i, _ in seen] == [0]
