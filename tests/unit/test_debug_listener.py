"""The actor's debug listener in-process: token proofs both ways, stacks of every thread."""

from __future__ import annotations

import socket
import threading

import pytest

from rayless.actors.control.debug import DebugServer, client_handshake
from rayless.errors import AuthError

TOKEN = "d" * 32


def _connect(server: DebugServer) -> socket.socket:
    host, _, port = server.address.removeprefix("tcp://").rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_wrong_token_gets_nothing() -> None:
    server = DebugServer("t", TOKEN)
    server.start()
    try:
        with _connect(server) as sock, pytest.raises(AuthError, match="authentication failed"):
            client_handshake(sock, "w" * 32, "stack")
    finally:
        server.stop()


def test_stack_shows_every_thread() -> None:
    server = DebugServer("t", TOKEN)
    server.start()
    release = threading.Event()

    def parked_in_a_function_we_can_name() -> None:
        release.wait()

    thread = threading.Thread(target=parked_in_a_function_we_can_name, name="parked")
    thread.start()
    try:
        with _connect(server) as sock:
            conn = client_handshake(sock, TOKEN, "stack")
            chunks = [conn.buffer]
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        text = b"".join(chunks).decode()
        assert text.startswith("actor t (pid ")
        assert "--- thread parked" in text and "in parked_in_a_function_we_can_name" in text
        # the listener's own threads are left out (another listener of this process, e.g. a
        # driver's that a session-wide cluster started, is a thread like any other)
        assert server._thread is not None and f"({server._thread.ident})" not in text
    finally:
        release.set()
        thread.join()
        server.stop()
