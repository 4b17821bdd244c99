"""`aiayn serve`: translate over HTTP, with a web page, continuous batching and limits.

    aiayn serve --model runs/base/model                 # http://127.0.0.1:8000/
    curl -s localhost:8000/translate -H 'Content-Type: application/json' \\
         -d '{"q": "A man is riding a bike."}'

Binds 127.0.0.1 unless `--host` says otherwise; `--port 0` takes a free port. When it is
listening, one line on stderr gives the address: `aiayn serve: SRC -> TGT from DIR; listening on http://HOST:PORT/ (Ctrl-C stops)`.
Translations are those of `aiayn translate` with the same model and search settings.
API key (optional): `--api-key-file FILE` (its first line), or the environment variable
AIAYN_API_KEY; clients send it as `X-API-Key: KEY` or `Authorization: Bearer KEY`.
docs/guides/serving.md describes the API.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from aiayn.commands.common import (
    add_device_argument,
    add_early_stop_argument,
    add_precision_argument,
    search_settings,
    set_examples,
    translator_from_args,
)
from aiayn.errors import UserError

API_KEY_ENV = "AIAYN_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from aiayn.serving.settings import ServeSettings

    set_examples(p, "aiayn serve --model runs/m30k/model                 # http://127.0.0.1:8000/",
                 "aiayn serve --model runs/m30k/model --host 0.0.0.0 --port 8080 --api-key-file key.txt",
                 about=__doc__.split("\n\n", 2)[2])

    d = ServeSettings()
    p.add_argument("--model", required=True, nargs="+", metavar="DIR",
                   help="model directory (from train/average); several: their ensemble, as in "
                        "aiayn translate (not in the paper)")
    n = p.add_argument_group("network")
    n.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    n.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 takes a free one)")
    n.add_argument("--api-key-file", metavar="FILE",
                   help=f"require this key (the file's first line); or set {API_KEY_ENV}")
    n.add_argument("--access-log", action="store_true", help="log every request on stderr")
    b = p.add_argument_group("batching")
    b.add_argument("--batch-tokens", type=int, default=d.batch_tokens, metavar="T",
                   help=f"room of the running search: sentences decoded at once x their longest "
                        f"source, padded to a multiple of 16; requests join it as others finish "
                        f"(default {d.batch_tokens})")
    b.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, metavar="MS",
                   help=f"when nothing is being decoded, the longest wait for more requests "
                        f"before a search starts (default {d.max_wait_ms:g})")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-chars", type=int, default=d.max_chars, metavar="N",
                     help=f"characters per request (default {d.max_chars})")
    lim.add_argument("--max-sentences", type=int, default=d.max_sentences, metavar="N",
                     help=f"texts per request (default {d.max_sentences})")
    lim.add_argument("--max-queue", type=int, default=d.max_queue, metavar="N",
                     help=f"sentences waiting for the model before requests get 503 (default {d.max_queue})")
    lim.add_argument("--timeout", type=float, default=d.timeout_s, metavar="S",
                     help=f"seconds from arrival to answer before a 504 (default {d.timeout_s:g})")
    lim.add_argument("--max-beam", type=int, default=d.max_beam, metavar="K",
                     help=f"largest beam size a request may ask for (default {d.max_beam})")
    lim.add_argument("--header-timeout", type=float, default=d.header_timeout_s, metavar="S",
                     help=f"seconds a request's line and headers may take to arrive before the "
                          f"connection is closed (default {d.header_timeout_s:g})")
    lim.add_argument("--max-src-tokens", type=int, default=1024, metavar="N",
                     help="truncate longer sources, as aiayn translate does (default 1024, EOS included)")
    h = p.add_argument_group("hardware")
    add_device_argument(h)
    h.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads for torch (default: one fewer than the cores torch would use, "
                        "at least 1, leaving one to the HTTP server)")
    add_precision_argument(h)
    s = p.add_argument_group("search (per request: beam size and alpha, within the limits)")
    add_early_stop_argument(s)


def read_api_key(path: str | None) -> str | None:
    """The key from `path` (first line, stripped) or from the environment; None for no key."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            raise UserError(f"--api-key-file {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise UserError(f"--api-key-file {path}: not UTF-8 text") from None
        if not key:
            raise UserError(f"--api-key-file {path}: the first line is empty")
        return key
    key = os.environ.get(API_KEY_ENV, "").strip()
    return key or None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (IPv4 or IPv6 by the address), so that `--port 0` can report its port."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def main(args: argparse.Namespace) -> int:
    from aiayn.serving.settings import ServeSettings, decoding_threads

    try:
        settings = ServeSettings(batch_tokens=args.batch_tokens, max_wait_ms=args.max_wait_ms,
                                 max_chars=args.max_chars, max_sentences=args.max_sentences,
                                 max_queue=args.max_queue, timeout_s=args.timeout,
                                 max_beam=args.max_beam, header_timeout_s=args.header_timeout)
    except ValueError as e:
        raise UserError(f"serve settings: {e}") from None
    from aiayn.data.model_dir import read_config

    search = search_settings(args, read_config(args.model[0]))
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    api_key = read_api_key(args.api_key_file)
    sock = bind(args.host, args.port)

    import torch
    import uvicorn

    from aiayn.serving.app import create_app
    from aiayn.serving.batcher import in_passing_thread
    from aiayn.serving.http import server_config
    from aiayn.serving.model import ServedModel

    torch.set_num_threads(args.threads or decoding_threads(torch.get_num_threads()))
    # loaded off the main thread: the model worker is then the only thread with torch's thread
    # pool (`in_passing_thread`)
    served = in_passing_thread(lambda: ServedModel(
        translator_from_args(args, "serve", search), model_paths=args.model))
    app = create_app(served, settings, api_key)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if host not in ("127.0.0.1", "::1") and api_key is None:
        print(f"aiayn serve: warning: listening on {host} without an API key: anyone who can reach "
              f"this machine can use it", file=sys.stderr)
    print(f"aiayn serve: {served.src_lang or '?'} -> {served.tgt_lang or '?'} from "
          f"{' + '.join(args.model)}; "
          f"listening on http://{shown}:{port}/ (Ctrl-C stops)", file=sys.stderr, flush=True)
    uvicorn.Server(server_config(app, settings.header_timeout_s, args.access_log)).run(sockets=[sock])
    return 0
