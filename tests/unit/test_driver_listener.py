"""A driver's debug listener: when it runs, what it answers, and how the head keeps it (under
the registering connection's session, until that session ends)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from rayless.actors.control import debug
from rayless.actors.control.head import Head
from rayless.actors.core import timeline
from rayless.actors.protocol import messages as m
from rayless.transport.errors import ProtocolError
from rayless.transport.peer import Peer
from tests.waiting import wait_until_sync

TOKEN = "d" * 32


def _peer(rid: bytes) -> Peer:
    return Peer(rid, "p", "127.0.0.1", True, time.monotonic())


@pytest.mark.parametrize(
    ("flag", "recording", "wanted"),
    [("", False, False), ("", True, True), ("1", False, True), ("0", True, False)],
)
def test_a_driver_listens_when_it_records_a_timeline_or_is_told_to(
    monkeypatch: pytest.MonkeyPatch, flag: str, recording: bool, wanted: bool
) -> None:
    monkeypatch.setenv(debug.ENV_DEBUG, flag)
    monkeypatch.setattr(timeline.RECORDER, "enabled", recording)
    assert debug.driver_wanted() is wanted
    loop = asyncio.new_event_loop()
    server = debug.start_driver(TOKEN, "tcp://127.0.0.1:1", loop)
    loop.close()
    assert (server is not None) is wanted
    if server is not None:
        server.stop()


def test_the_listener_binds_the_route_to_the_head(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYLESS_CURVE", raising=False)
    assert debug.host_toward("tcp://127.0.0.1:5000") == "127.0.0.1"
    assert debug.host_toward("tcp://localhost:5000") == "127.0.0.1"
    monkeypatch.setenv("RAYLESS_CURVE", "1")  # unencrypted: it stays on the host
    assert debug.host_toward("tcp://10.1.2.3:5000") == "127.0.0.1"


def test_a_driver_s_stack_names_it_and_stopping_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(debug.ENV_DEBUG, "1")
    before = set(threading.enumerate())
    loop = asyncio.new_event_loop()
    server = debug.start_driver(TOKEN, "tcp://127.0.0.1:1", loop)
    loop.close()
    assert server is not None
    host, _, port = server.address.removeprefix("tcp://").rpartition(":")
    stranger = socket.create_connection((host, int(port)), timeout=10)  # never handshakes
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            conn = debug.client_handshake(sock, TOKEN, "stack")
            chunks = [conn.buffer]
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        assert b"".join(chunks).decode().startswith(f"driver (pid {os.getpid()})")
    finally:
        server.stop()  # cuts the stranger's handshake too
    wait_until_sync(
        lambda: not [t.name for t in set(threading.enumerate()) - before if "debug" in t.name],
        timeout=10,
        what="the listener's threads to end",
    )
    with stranger:  # cut: its greeting, then the end of the stream
        said = b""
        while chunk := stranger.recv(4096):
            said += chunk
        assert said.startswith(debug.MAGIC.encode())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=10).close()


async def test_the_head_keeps_a_driver_s_listener_under_its_session() -> None:
    head = Head("t" * 32)
    try:
        driver, stranger = _peer(b"r1"), _peer(b"r2")
        wanted = m.DebugEndpoints(drivers=True)
        register = m.DebugRegister("driver:forged", "tcp://127.0.0.1:7", 42, "driver")
        with pytest.raises(ProtocolError, match="by its session"):
            head.requests.handle(stranger, register)  # a connection of no session
        head.requests.handle(driver, m.Hello("s1"))
        assert head.requests.handle(driver, register)
        (record,) = head.requests.handle(driver, wanted)
        assert record["actor_id"] == "driver:s1"  # the session's, not the id it named
        assert (record["kind"], record["pid"]) == ("driver", 42)
        assert record["debug_address"] == "tcp://127.0.0.1:7"
        assert head.requests.handle(driver, m.DebugEndpoints()) == []  # actors only
        head.requests.handle(stranger, m.Hello("s2"))  # another session cannot withdraw it
        head.requests.handle(stranger, m.DebugRegister("driver:s1", "", 42, "driver"))
        assert len(head.requests.handle(driver, wanted)) == 1
        head.requests.handle(driver, m.DebugRegister("driver:s1", "", 42, "driver"))
        assert head.requests.handle(driver, wanted) == []  # withdrawn
        head.requests.handle(driver, register)
        head._peer_gone(driver)  # its session's last connection: the session ends
        assert head.requests.handle(stranger, wanted) == []
        head.requests.handle(driver, m.Hello("s1"))
        head.requests.handle(driver, register)
        await head.requests.handle(driver, m.EndSession("s1"))
        assert head.requests.handle(driver, wanted) == []
        with pytest.raises(ProtocolError, match="unknown debug listener kind"):
            head.requests.handle(driver, m.DebugRegister("a1", "tcp://x:1", 1, "other"))
    finally:
        for timer in head._orphan_timers.values():
            timer.cancel()
        await head.server.aclose()
