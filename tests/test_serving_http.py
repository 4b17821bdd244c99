"""aiayn/serving/http.py: Nagle's algorithm is off on every TCP connection the server accepts
(else each small write waits for the client's delayed ACK), and left alone elsewhere."""

from __future__ import annotations

import socket

from aiayn.serving.http import no_delay


class Transport:
    def __init__(self, sock):
        self.sock = sock

    def get_extra_info(self, name):
        return self.sock if name == "socket" else None


def test_accepted_tcp_connections_get_tcp_nodelay():
    server = socket.create_server(("127.0.0.1", 0))  # as `aiayn serve` binds: protocol 0
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    try:
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        no_delay(Transport(conn))
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for s in (conn, client, server):
            s.close()


def test_other_sockets_are_left_alone():
    a, b = socket.socketpair()  # AF_UNIX: no TCP options to set
    try:
        no_delay(Transport(a))
        no_delay(Transport(None))
    finally:
        a.close()
        b.close()
