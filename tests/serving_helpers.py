"""Helpers for the serving tests: an engine whose model worker a test can hold, an engine with
hand-built attention (for the page's heatmap), and uvicorn on a free loopback port in a thread."""

from __future__ import annotations

import os
import shutil
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from aiayn.serving.engine import Attention, Engine


class GatedEngine(Engine):
    """Searches wait while `gate` is clear, so a test decides when the model worker may go on;
    `entered` is set once a search has started."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def search(self, key, sources):
        self.entered.set()
        assert self.gate.wait(60)
        return super().search(key, sources)


class AttentionEngine(Engine):
    """An engine that answers alignment requests with a hand-built cross-attention: target piece
    t attends mostly to source piece t (mod S), the rest spread evenly."""

    supports_alignment = True

    def attention(self, source, hyp):
        src = self.src_pieces(source) + ["</s>"]
        tgt = self.tgt_pieces(hyp.tokens) + ["</s>"]
        s = len(src)
        weights = [[0.7 + 0.3 / s if j == t % s else 0.3 / s for j in range(s)] for t in range(len(tgt))]
        return Attention(src, tgt, weights)

    def alignment(self, att):
        return " ".join(f"{max(range(len(row)), key=row.__getitem__)}-{t}"
                        for t, row in enumerate(att.weights[:-1]))


def chrome(profile, width: int, height: int, skip: Callable[[str], None] | None = None,
           fail: Callable[[str], None] | None = None):
    """Debian's headless Chromium (`chromium`) driven through Debian's `chromedriver` by selenium,
    with a fresh profile and no background networking. Missing browser or driver: `fail` under
    CI (which installs both), else `skip`, else RuntimeError."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        message = "needs Debian's chromium and chromium-driver packages (.ci/run installs them)"
        if os.environ.get("CI") and fail is not None:
            fail(message)
        if skip is not None:
            skip(message)
        raise RuntimeError(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium must never fetch a driver or a browser
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def wait_until(condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@contextmanager
def serve_in_thread(app) -> Iterator[str]:
    """Run `app` on uvicorn at 127.0.0.1 (a free port) in a thread; yields the base URL."""
    import uvicorn

    from aiayn.commands.serve import bind

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="uvicorn to start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
