"""A local HTTP server for the download tests (127.0.0.1 only; the tests never reach the internet):
serves files from a dict, answers HTTP Range requests, records what it was asked, and can break
off a response midway or ignore Range headers, as real servers and networks do."""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class Served:
    files: dict[str, bytes]
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    cut_after: dict[str, int] = field(default_factory=dict)  # name -> bytes sent before breaking off (once)
    ignore_range: bool = False
    url: str = ""


def _handler(served: Served):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            name = self.path.lstrip("/")
            rng = self.headers.get("Range")
            served.requests.append((name, rng))
            data = served.files.get(name)
            if data is None:
                self.send_error(404)
                return
            start = 0
            m = re.fullmatch(r"bytes=(\d+)-", rng or "")
            if m and not served.ignore_range:
                start = int(m.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cut = served.cut_after.pop(name, None)
            self.wfile.write(body if cut is None else body[:cut])
            self.wfile.flush()
            self.close_connection = True

    return Handler


@contextlib.contextmanager
def serve(files: dict[str, bytes], **kw) -> Iterator[Served]:
    """Serve `files` (name -> bytes) at `served.url` for the duration of the block."""
    served = Served(dict(files), **kw)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
