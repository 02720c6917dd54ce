"""A real zygote speaks typed messages: it answers what it knows, and closes a connection
that sends anything else (a frame that does not decode, a message of another conversation,
a message with a field of the wrong type) without forking, then keeps serving others."""

from __future__ import annotations

import contextlib
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

from rayless.actors.protocol import zygote_messages as z
from rayless.actors.protocol.messages import Kill
from rayless.transport._registry import EXT, MARK
from tests.waiting import scaled

pytestmark = pytest.mark.integration


def _start_zygote(path: str, *args: str, preload: str = "lazy") -> subprocess.Popen[bytes]:
    env = {**os.environ, "RAYLESS_ZYGOTE_PRELOAD": preload, "RAYLESS_DIE_WITH_PARENT": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "rayless.actors.host.zygote", path, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


@contextlib.contextmanager
def _running(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """Wait for the zygote's "ready"; terminate it at the end."""
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], scaled(60))
        assert ready, "the zygote did not print ready within its deadline"
        assert proc.stdout.readline().strip() == b"ready"
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(scaled(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(scaled(10))


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A zygote in lazy mode (no torch until a fork) on a socket under ``tmp_path``."""
    path = str(tmp_path / "zygote.sock")
    proc = _start_zygote(path)
    with _running(proc):
        yield proc, path


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # every read below has this deadline, a hang guard: a preload that imports torch took
    # over 30 s beside a full suite, a second suite and two CPU burners (load 12)
    sock.settimeout(scaled(120))
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


def test_the_light_template_serves_after_its_warm_up_without_torch(tmp_path: Path) -> None:
    """``--template light`` in the (default) eager mode: its warm-up, done before it serves,
    imports the runtime's modules and never torch, and a fork from it has no torch."""
    path = str(tmp_path / "light.sock")
    proc = _start_zygote(path, "--template", "light", preload="eager")
    with _running(proc), _connect(path) as sock:
        sock.sendall(z.pack(z.Preload("json")))  # answered once the warm-up is done
        assert _read_frame(sock) == z.Preloaded("json", True, "")
        with open(f"/proc/{proc.pid}/maps") as f:
            assert "libtorch" not in f.read(), "the light template imported torch"
        log = str(tmp_path / "child.log")
        sock.sendall(z.pack(z.Fork(1, {"RAYLESS_ADDRESS": "tcp://127.0.0.1:1"}, log, None, "")))
        forked = _read_frame(sock)
        assert isinstance(forked, z.Forked)
        exited = _read_frame(sock)  # (no agent answers it: the actor process gives up)
        assert isinstance(exited, z.Exited) and exited.pid == forked.pid


def _maps_torch(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return "libtorch" in f.read()


def test_the_torch_template_on_demand_imports_torch_with_the_first_module_that_does(
    tmp_path: Path,
) -> None:
    """``RAYLESS_ZYGOTE_PRELOAD=demand``: the torch template forks without torch until a
    spawn's module imports it; from then on it holds torch, and so do its forks."""
    path = str(tmp_path / "demand.sock")
    proc = _start_zygote(path, preload="demand")
    with _running(proc), _connect(path) as sock:
        sock.sendall(z.pack(z.Preload("json")))
        assert _read_frame(sock) == z.Preloaded("json", True, "")
        log = str(tmp_path / "child.log")
        sock.sendall(z.pack(z.Fork(1, {"RAYLESS_ADDRESS": "tcp://127.0.0.1:1"}, log, None, "")))
        forked = _read_frame(sock)
        assert isinstance(forked, z.Forked)
        assert not _maps_torch(proc.pid), "the template imported torch for a torch-free fork"
        assert isinstance(_read_frame(sock), z.Exited)
        sock.sendall(z.pack(z.Preload("tests.integration.weights_classes")))  # imports torch
        assert _read_frame(sock) == z.Preloaded("tests.integration.weights_classes", True, "")
        assert _maps_torch(proc.pid)


def test_an_unknown_preload_mode_is_refused(tmp_path: Path) -> None:
    proc = _start_zygote(str(tmp_path / "z.sock"), preload="sometimes")
    _, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode != 0 and b"RAYLESS_ZYGOTE_PRELOAD must be one of" in err


def test_a_template_it_does_not_know_is_a_usage_error(tmp_path: Path) -> None:
    proc = _start_zygote(str(tmp_path / "z.sock"), "--template", "heavy")
    _, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 2 and b"invalid choice" in err


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_a_sigterm_during_the_torch_warm_up_exits_cleanly(tmp_path: Path, delay: float) -> None:
    # a script that ends right after ray.init(): its cluster stops while the torch template
    # is still importing torch. Stopping by raising out of the signal handler went through
    # torch's C++ import code: "terminate called after throwing ... SystemExit", an abort.
    path = str(tmp_path / "zygote.sock")
    proc = _start_zygote(path, preload="eager")
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], scaled(60))
    assert ready and proc.stdout.readline().strip() == b"ready"
    select.select([], [], [], delay)
    proc.terminate()
    try:
        code = proc.wait(scaled(30))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read().decode(errors="replace")
    assert code == 0, err[-2000:]
    assert "terminate called" not in err and "Traceback" not in err, err[-2000:]
    assert not os.path.exists(path)
