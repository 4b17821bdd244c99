"""The HTTP server under `aiayn serve`: uvicorn, its h11 protocol, and a deadline on headers.

uvicorn closes a kept-alive connection that stays idle after a response (`timeout_keep_alive`),
but sets no time limit on a request's line and headers: a client that sends them a byte at a
time (slowloris) holds its connection, and its socket, for as long as it likes, and a few
hundred such clients exhaust the server's file descriptors. `HeaderDeadline` closes a
connection whose request line and headers are not complete `header_timeout` seconds after the
request began: after the connection opened, or, on a kept-alive connection, after the next
request's first byte. The deadline is not extended by further bytes, so trickling them does not
help. The body is the application's to read, within its own limits (`ServeSettings`).

Every connection has Nagle's algorithm off (TCP_NODELAY): asyncio turns it off only for sockets
made with protocol IPPROTO_TCP, and `socket.create_server` (`aiayn serve`'s listening socket)
makes them with protocol 0, so each small write (a response's body after its headers, a streamed
prefix) waited for the client's delayed ACK, about 40 ms on Linux loopback.

The h11 protocol (pure Python, a dependency of uvicorn) is chosen explicitly, not uvicorn's
"auto", which would take httptools where it is installed: the deadline reads h11's state.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


def no_delay(transport: Any) -> None:
    """Nagle's algorithm off on a TCP connection's socket (module doc); other sockets as they are."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are late
    (module doc). `header_timeout`: seconds, set on a subclass (`with_header_timeout`)."""

    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        no_delay(transport)
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()  # the first bytes of a kept-alive connection's next request
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request line and headers are in (or an error)
            self._disarm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()  # no request to answer: h11 can send no response before one


def with_header_timeout(seconds: float) -> type[HeaderDeadline]:
    """The protocol class with a deadline of `seconds` on each request's headers."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout": float(seconds)})


def server_config(app: Any, header_timeout_s: float, access_log: bool = False) -> uvicorn.Config:
    """uvicorn's configuration for `aiayn serve`: the h11 protocol with a deadline on request
    headers (`HeaderDeadline`), uvicorn's idle keep-alive timeout, warnings only in the log
    (every request as well with `access_log`), and at most 5 seconds to finish the requests in
    flight on shutdown."""
    return uvicorn.Config(app, http=with_header_timeout(header_timeout_s), log_level="warning",
                          access_log=access_log, timeout_graceful_shutdown=5, lifespan="on")
