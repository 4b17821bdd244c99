"""The server over real sockets on 127.0.0.1: a client that hangs up loses its place in the queue,
and a real `aiayn serve` process answers as `aiayn translate` does, then stops on SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiayn.data.model_dir import load_model
from aiayn.decoding.translate import Translator
from aiayn.serving.app import create_app
from aiayn.serving.settings import ServeSettings

from helpers import GatedModel, serve_in_thread, wait_until

REPO = Path(__file__).resolve().parents[1]
LINES = ["the cat sat on the mat", "", "a dog runs in the park", "die katze sitzt auf der matte"]


def post(url: str, body: dict | bytes, headers: dict | None = None, timeout: float = 60):
    """(status, decoded JSON) of a POST; HTTP errors are answers too."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_client_that_hangs_up_frees_its_place(model_dir):
    served = GatedModel(Translator(load_model(model_dir)))
    app = create_app(served, ServeSettings(max_wait_ms=0))
    batcher = app.state.batcher
    with serve_in_thread(app) as url, ThreadPoolExecutor(1) as pool:
        served.gate.clear()
        running = pool.submit(post, url + "/translate", {"q": "a dog"})
        assert served.entered.wait(30)
        # A second client sends its request, then hangs up while it waits in the queue.
        body = json.dumps({"q": ["the cat", "die katze", "the mat"]}).encode()
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_until(lambda: batcher.pending == 3, what="the request to queue")
        wait_until(lambda: batcher.pending == 0, what="the queue to forget the departed client")
        served.gate.set()
        assert running.result(60)[0] == 200
        text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
        assert 'aiayn_http_errors_total{reason="disconnected"} 1.0' in text
        assert "aiayn_sentences_translated_total 1.0" in text  # its sentences never ran


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _stderr_lines(proc: subprocess.Popen) -> "queue.Queue[str]":
    lines: queue.Queue[str] = queue.Queue()

    def pump():
        for raw in proc.stderr:
            lines.put(raw.decode("utf-8", "replace"))
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.slow
def test_aiayn_serve_process_answers_like_aiayn_translate(model_dir, tmp_path):
    key_file = tmp_path / "key.txt"
    key_file.write_text("k3y\n")
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", "--model", str(model_dir),
                             "--port", "0", "--api-key-file", str(key_file), "--threads", "1"],
                            cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        lines = _stderr_lines(proc)
        seen = []
        while True:
            line = lines.get(timeout=120)
            seen.append(line)
            assert line, f"aiayn serve ended early: {''.join(seen)}"
            if "listening on http://127.0.0.1:" in line:
                break
        url = line.split("listening on ")[1].split("/ ")[0]
        assert urllib.request.urlopen(url + "/health", timeout=30).status == 200
        status, answer = post(url + "/translate", {"q": LINES, "nbest": 2}, {"X-API-Key": "k3y"})
        assert status == 200
        assert post(url + "/translate", {"q": "a"})[0] == 401
        # The same lines through `aiayn translate --nbest 2`: the same texts and scores.
        src = tmp_path / "in.txt"
        src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
        nbest = subprocess.run([sys.executable, "-m", "aiayn", "translate", "--model", str(model_dir),
                                "--input", str(src), "--nbest", "2"],
                               cwd=REPO, env=_env(), capture_output=True, timeout=120)
        assert nbest.returncode == 0, nbest.stderr
        rows = [tuple(row.split("\t")) for row in nbest.stdout.decode().split("\n")[:-1]]
        served = [(str(i), f"{h['score']:.6f}", h["tgt"])
                  for i, item in enumerate(answer["translations"]) for h in item["nbest"]]
        assert served == rows
        assert answer["translatedText"] == [item["nbest"][0]["tgt"] for item in answer["translations"]]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    # uvicorn shuts down cleanly, then ends the process by the signal it caught (the convention
    # for a process stopped by a signal).
    assert code in (0, -signal.SIGTERM)
    rest = "".join(iter(lines.get, ""))
    assert "Traceback" not in rest and "error" not in rest.lower(), rest


def test_aiayn_serve_refuses_bad_settings_in_one_line(model_dir, tmp_path, capsys):
    from aiayn.cli import main

    for args, words in [
        (["--model", str(tmp_path / "missing"), "--port", "0"], "aiayn serve: error:"),
        (["--model", str(model_dir), "--max-sentences", "10", "--max-queue", "5"], "max_queue"),
        (["--model", str(model_dir), "--api-key-file", str(tmp_path / "nokey")], "--api-key-file"),
        (["--model", str(model_dir), "--port", "70000"], "--port must be between"),
        (["--model", str(model_dir), "--threads", "0"], "--threads must be >= 1"),
    ]:
        assert main(["serve", *args]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_the_api_key_comes_from_a_file_or_the_environment(tmp_path, monkeypatch):
    from aiayn.commands.serve import API_KEY_ENV, read_api_key
    from aiayn.errors import UserError

    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert read_api_key(None) is None
    monkeypatch.setenv(API_KEY_ENV, " from-env \n")
    assert read_api_key(None) == "from-env"
    f = tmp_path / "key"
    f.write_text("from-file\nsecond line\n")
    assert read_api_key(str(f)) == "from-file"  # the file wins over the environment
    f.write_text("\n")
    with pytest.raises(UserError, match="first line is empty"):
        read_api_key(str(f))
