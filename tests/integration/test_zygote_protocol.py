"""A real zygote speaks typed messages: it answers what it knows, and closes a connection
that sends anything else (a frame that does not decode, a message of another conversation,
a message with a field of the wrong type) without forking, then keeps serving others."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgpack
import psutil
import pytest

from rayless.actors.control import zygote_messages as z
from rayless.actors.control.messages import Kill
from rayless.transport._registry import EXT, MARK
from tests.waiting import scaled

pytestmark = pytest.mark.integration


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A zygote in lazy mode (no torch until a fork) on a socket under ``tmp_path``."""
    path = str(tmp_path / "zygote.sock")
    env = {**os.environ, "RAYLESS_ZYGOTE_PRELOAD": "lazy", "RAYLESS_DIE_WITH_PARENT": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayless.actors.control.zygote", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], scaled(60))
        assert ready, "the zygote did not print ready within its deadline"
        assert proc.stdout.readline().strip() == b"ready"
        yield proc, path
    finally:
        proc.terminate()
        try:
            proc.wait(scaled(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(scaled(10))


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(scaled(30))  # every read below has this deadline
    sock.connect(path)
    return sock


def _read_frame(sock: socket.socket) -> object:
    """The next message, or None once the zygote closed the connection."""
    data = b""
    while len(data) < 4 or len(data) < 4 + z.LENGTH.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    return z.unpack(data[4:])


def _framed(body: bytes) -> bytes:
    return z.LENGTH.pack(len(body)) + body


def test_preload_is_answered_in_typed_messages(
    zygote: tuple[subprocess.Popen[bytes], str],
) -> None:
    _, path = zygote
    with _connect(path) as sock:
        sock.sendall(z.pack(z.Preload("json")))
        assert _read_frame(sock) == z.Preloaded("json", True, "")
        sock.sendall(z.pack(z.Preload("no_such_module_for_rayless_tests")))
        reply = _read_frame(sock)
        assert isinstance(reply, z.Preloaded) and not reply.ok
        assert "ModuleNotFoundError" in reply.error


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(_framed(b"\xc1garbage"), id="not-msgpack"),
        pytest.param(_framed(msgpack.packb({"op": "fork", "tag": 1})), id="the-old-dict"),
        pytest.param(z.LENGTH.pack(1) + z.pack(Kill("a1"))[4:5], id="truncated-header"),
        pytest.param(
            _framed(msgpack.packb([MARK[EXT], "zyg.Fork", [1, {"A": 1}, "/x", None, "t"]])),
            id="fork-with-a-bad-env",
        ),
        pytest.param(z.pack(Kill("a1")), id="another-conversation"),
        pytest.param(z.pack(z.Forked(1, 2)), id="a-reply-as-a-request"),
    ],
)
def test_anything_else_closes_the_connection_without_a_fork(
    zygote: tuple[subprocess.Popen[bytes], str], frame: bytes
) -> None:
    proc, path = zygote
    with _connect(path) as sock:
        sock.sendall(frame)
        assert _read_frame(sock) is None, "the zygote kept a connection that sent garbage"
    assert psutil.Process(proc.pid).children() == []
    with _connect(path) as sock:  # it keeps serving
        sock.sendall(z.pack(z.Preload("json")))
        assert _read_frame(sock) == z.Preloaded("json", True, "")
