"""Inputs a user can get wrong, each refused in one line (exit 2, no traceback, nothing written and
nothing deleted): a non-numeric n-best score, a beam beyond every search's bound, `--nbest 0`, a
text longer than the model's positions, an n-best list given to `evaluate` as translations, a
dataset directory given to `prepare --vocab-from`, a disk that fills while prepare copies a
vocabulary; a client that sends its headers too slowly to `aiayn serve`; and one default
precision for the CLI and the Python API."""

from __future__ import annotations

import errno
import os
import select
import shutil
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import uvicorn

import aiayn.precision as precision
from aiayn import files
from aiayn.cli import build_parser
from aiayn.commands.common import decode_precision
from aiayn.commands.evaluate import is_nbest
from aiayn.commands.serve import bind
from aiayn.data.model_dir import load_model, read_config, save_model
from aiayn.decoding import MAX_BEAM_SIZE
from aiayn.decoding.search import SearchOptions
from aiayn.decoding.translate import Translator, format_nbest
from aiayn.model import Transformer
from aiayn.serving.app import create_app
from aiayn.serving.http import server_config
from aiayn.serving.model import ServedModel
from aiayn.serving.settings import ServeSettings

from helpers import tiny_dataset, wait_until


def one_line(err: str, command: str) -> str:
    """`err`: one line, `aiayn COMMAND: error: ...`, no traceback."""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"aiayn {command}: error: "), err
    return err


def last_line(err: str, command: str) -> str:
    """The error, the last line of stderr and its only error (progress lines may precede it)."""
    lines = err.rstrip("\n").splitlines()
    assert "Traceback" not in err and [line for line in lines if "error" in line] == lines[-1:], err
    return one_line(lines[-1] + "\n", command)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- score ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["jsonl", "tsv"])
def test_score_refuses_an_nbest_score_that_is_no_number_in_every_format(model_dir, tmp_path, aiayn,
                                                                        fmt):
    src = write(tmp_path / "src.txt", ["a dog runs", "the cat"])
    nbest = write(tmp_path / "nbest.txt", ["0\t-1.500000\tein hund", "1\tabc\tdie katze"])
    out = tmp_path / "scores.txt"
    code, stdout, err = aiayn("score", "--model", model_dir, "--src", src, "--nbest", nbest,
                              "--format", fmt, "--output", out)
    assert code == 2 and stdout == ""
    assert f"{nbest}:2: the score column, 'abc', is not a number" in one_line(err, "score")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["nbest.txt", "src.txt"]


def short_model(root: Path, model_dir: Path, positions: str, max_positions: int = 12) -> Path:
    """`model_dir`'s micro model, random, with room for `max_positions` positions, learned or
    sinusoidal."""
    cfg = replace(read_config(model_dir), positions=positions, max_positions=max_positions)
    torch.manual_seed(0)
    return save_model(root, Transformer(cfg).eval(), cfg, {"spm.model": model_dir / "spm.model"})


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
@pytest.mark.parametrize("side", ["ref", "src"])
def test_score_refuses_a_text_longer_than_the_models_positions(model_dir, tmp_path, aiayn,
                                                               positions, side):
    model = short_model(tmp_path / "short", model_dir, positions)
    long = " ".join(["the cat sat on the mat"] * 4)  # far more than 11 pieces + EOS
    lines = {"src": ["a dog", "a dog"], "ref": ["ein hund", "ein hund"]}
    lines[side][1] = long
    src, ref = write(tmp_path / "src.txt", lines["src"]), write(tmp_path / "ref.txt", lines["ref"])
    out = tmp_path / "scores.jsonl"
    code, stdout, err = aiayn("score", "--model", model, "--src", src, "--ref", ref, "--output", out)
    assert code == 2 and stdout == ""
    where = src if side == "src" else ref
    assert f"{where}:2: " in one_line(err, "score") and "more than the 12 positions" in err
    assert not out.exists()
    # within them, both lines score
    lines[side][1] = "a dog" if side == "src" else "ein hund"
    write(tmp_path / f"{side}.txt", lines[side])
    assert aiayn("score", "--model", model, "--src", src, "--ref", ref)[0] == 0


# --- search bounds: --beam, --nbest -----------------------------------------------------------

@pytest.mark.parametrize("option, value, message", [
    ("--beam", MAX_BEAM_SIZE + 1, f"beam size {MAX_BEAM_SIZE + 1} is above the limit of {MAX_BEAM_SIZE}"),
    ("--beam", 10_000, f"beam size 10000 is above the limit of {MAX_BEAM_SIZE}"),
    ("--nbest", 0, "nbest must be >= 1"),
    ("--nbest", -1, "nbest must be >= 1"),
])
def test_translate_refuses_a_beam_beyond_the_bound_and_nbest_below_one(model_dir, tmp_path, aiayn,
                                                                       option, value, message):
    src = write(tmp_path / "in.txt", ["a dog runs"])
    out = tmp_path / "out.txt"
    code, stdout, err = aiayn("translate", "--model", model_dir, "--input", src, "--output", out,
                              option, value)
    assert code == 2 and stdout == ""
    assert message in one_line(err, "translate")
    assert not out.exists() and os.listdir(tmp_path) == ["in.txt"]


def test_the_beam_bound_holds_for_the_api_and_the_server(model_dir, aiayn):
    cfg = read_config(model_dir)
    assert SearchOptions(beam_size=MAX_BEAM_SIZE).resolve(cfg).beam_size == MAX_BEAM_SIZE
    with pytest.raises(ValueError, match="above the limit"):
        Translator(load_model(model_dir), precision="fp32", beam_size=MAX_BEAM_SIZE + 1)
    with pytest.raises(ValueError, match="above the limit"):
        Translator(load_model(model_dir), precision="fp32").with_settings(beam_size=MAX_BEAM_SIZE + 1)
    with pytest.raises(ValueError, match=f"max_beam must be at most {MAX_BEAM_SIZE}"):
        ServeSettings(max_beam=MAX_BEAM_SIZE + 1)
    code, _, err = aiayn("serve", "--model", model_dir, "--port", "0", "--max-beam", MAX_BEAM_SIZE + 1)
    assert code == 2 and f"max_beam must be at most {MAX_BEAM_SIZE}" in one_line(err, "serve")


# --- evaluate ---------------------------------------------------------------------------------

def test_evaluate_refuses_an_nbest_list_as_translations(tmp_path, aiayn):
    refs = ["ein hund läuft", "die katze schläft", "zwei männer"]
    ref = write(tmp_path / "ref.txt", refs)
    rows = [row for i, text in enumerate(refs)
            for row in format_nbest(i, [(-0.5, text), (-1.25, text + " da")])]
    nbest = write(tmp_path / "nbest.txt", rows)  # what `aiayn translate --nbest 2` writes
    code, stdout, err = aiayn("evaluate", "--hyp", nbest, "--ref", ref, "--lang", "de")
    assert code == 2 and stdout == ""
    line = one_line(err, "evaluate")
    assert f"{nbest} is an n-best list" in line and "aiayn score --nbest" in line and "1-best" in line
    # one translation a line is scored, even one that begins with a number and a tab
    hyps = write(tmp_path / "hyp.txt", ["0\tein hund", *refs[1:]])
    assert aiayn("evaluate", "--hyp", hyps, "--ref", ref, "--lang", "de")[0] == 0
    assert not is_nbest(["0\t-1.000000\ta", "1\t-2.000000\tb", "ein hund"])  # not every line
    assert not is_nbest(["1\t-1.000000\ta", "0\t-2.000000\tb"])  # indices fall
    assert not is_nbest([])
    assert is_nbest(["0\t0.000000\t", "2\t-3.500000\tx\ty"])  # a blank line's entry; text with tabs


# --- prepare ----------------------------------------------------------------------------------

def corpus(tmp_path: Path) -> Path:
    write(tmp_path / "train.xx", ["a dog runs", "the cat sat"] * 20)
    write(tmp_path / "train.yy", ["ein hund läuft", "die katze saß"] * 20)
    return tmp_path / "train"


def test_prepare_vocab_from_refuses_a_directory_that_is_no_model(tmp_path, aiayn):
    dataset = tiny_dataset(tmp_path / "ds")  # has spm.model, but no config.json nor weights
    before = sorted(os.listdir(dataset))
    out = tmp_path / "new"
    code, stdout, err = aiayn("prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train",
                              corpus(tmp_path), "--out", out, "--vocab-from", dataset, "--no-progress")
    assert code == 2 and stdout == ""
    line = one_line(err, "prepare")
    assert f"--vocab-from {dataset}: not an aiayn model directory (no config.json or model.safetensors)" in line
    assert "model to fine-tune" in line
    assert not out.exists() and not (tmp_path / ".new.partial").exists()
    assert sorted(os.listdir(dataset)) == before


class FullDisk:
    """A file whose every write fails as on a full disk."""

    def __init__(self, f):
        self.f = f

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)

    def write(self, _):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_prepare_on_a_full_disk_names_what_it_writes_not_its_input(model_dir, tmp_path, aiayn,
                                                                    monkeypatch):
    """The disk fills while prepare copies the model's vocabulary into its work directory: the
    line names the file being written (not the model's file it copies), and the model is intact."""
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    real_fdopen = os.fdopen

    class FilesOs:  # `os` as aiayn.files sees it: files opened for writing are on a full disk
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def fdopen(fd, mode="r", *a, **k):
            f = real_fdopen(fd, mode, *a, **k)
            return FullDisk(f) if "w" in mode else f

    def sendfile(*_):  # what shutil.copyfile writes with on Linux
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "os", FilesOs())
    monkeypatch.setattr(os, "sendfile", sendfile)
    out = tmp_path / "new"
    code, stdout, err = aiayn("prepare", "--src-lang", "xx", "--tgt-lang", "yy", "--train",
                              corpus(tmp_path), "--out", out, "--vocab-from", model,
                              "--no-progress", "--workers", "0")
    assert code == 2 and stdout == ""
    line = last_line(err, "prepare")
    assert line.startswith(f"aiayn prepare: error: cannot write {tmp_path}/.new.partial/spm.model: "
                           f"No space left on device; free some disk space"), line
    assert str(model) not in line
    assert not out.exists()
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


# --- serve: a deadline on request headers -----------------------------------------------------

@pytest.fixture
def server(model_dir):
    """`aiayn serve`'s app and server configuration on 127.0.0.1 (a free port), with a deadline
    of 0.5 s on request headers; yields the port."""
    settings = ServeSettings(header_timeout_s=0.5)
    app = create_app(ServedModel(Translator(load_model(model_dir), precision="fp32")), settings)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(server_config(app, settings.header_timeout_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="uvicorn to start")
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def closed_by_server(conn: socket.socket, within: float = 15.0, trickle: bytes = b"") -> bool:
    """Whether the server closes `conn` within `within` seconds (generous: the deadline is 0.5 s),
    while we send `trickle` a byte at a time, 20 a second, if given."""
    end = time.monotonic() + within
    sent = 0
    while time.monotonic() < end:
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable:
            try:
                return conn.recv(4096) == b""
            except ConnectionResetError:
                return True
        if sent < len(trickle):
            try:
                conn.sendall(trickle[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return True
            sent += 1
    return False


def test_serve_drops_a_client_whose_headers_do_not_arrive(server):
    partial = b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with socket.create_connection(("127.0.0.1", server), timeout=30) as idle:
        idle.sendall(partial)  # and no more
        assert closed_by_server(idle)
    # a byte at a time does not extend the deadline (slowloris)
    with socket.create_connection(("127.0.0.1", server), timeout=30) as slow:
        assert closed_by_server(slow, trickle=partial + b"X-Pad: " + b"a" * 1000)
    # a connection that never sends anything
    with socket.create_connection(("127.0.0.1", server), timeout=30) as silent:
        assert closed_by_server(silent)
    # a whole request is answered; the kept-alive connection's next request has the same deadline
    with socket.create_connection(("127.0.0.1", server), timeout=30) as ok:
        ok.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += ok.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200 ")
        ok.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.1)
        ok.recv(4096)  # the rest of the first answer's body
        assert closed_by_server(ok)


# --- one default precision: the CLI's and the Python API's ---------------------------------------

@pytest.mark.parametrize("native_bf16", [None, True, False])  # None: this machine as it is
def test_the_api_and_the_cli_default_to_the_same_precision(model_dir, monkeypatch, native_bf16):
    if native_bf16 is not None:
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native_bf16)
    expected = precision.auto_precision("cpu")
    if native_bf16 is not None:
        assert expected == ("bf16" if native_bf16 else "fp32")
    args = build_parser(["translate"]).parse_args(["translate", "--model", str(model_dir)])
    cli = decode_precision(args, torch.device("cpu"), "translate")
    api = Translator(load_model(model_dir, "cpu"))
    assert cli == api.precision == expected
    assert next(api.model.parameters()).dtype == (torch.bfloat16 if expected == "bf16" else torch.float32)
    # an in-memory model (training's dev BLEU) keeps fp32: its caller's autocast decides
    fresh = load_model(model_dir, "cpu")
    assert Translator.for_model(fresh.model, fresh.src_tokenizer).precision == "fp32"
