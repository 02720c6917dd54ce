"""``transport.tcp_owner``: the kernel names the local user at the other end of a loopback
TCP connection (one ``sock_diag`` request), and nothing else."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rayless.transport.tcp_owner import TcpOwners, is_loopback

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sock_diag is Linux's")


@pytest.fixture
def owners() -> Iterator[TcpOwners]:
    o = TcpOwners()
    yield o
    o.close()


def _pair(host: str, family: int) -> tuple[socket.socket, socket.socket, socket.socket]:
    try:
        server = socket.create_server((host, 0), family=family)
    except OSError as exc:
        pytest.skip(f"no {host} here: {exc}")
    client = socket.create_connection((host, server.getsockname()[1]))
    accepted, _ = server.accept()
    return server, client, accepted


@pytest.mark.parametrize(
    ("host", "family"), [("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)]
)
def test_a_loopback_peer_of_ours_is_our_uid(owners: TcpOwners, host: str, family: int) -> None:
    server, client, accepted = _pair(host, family)
    with server, client, accepted:
        assert owners.uid(accepted) == os.getuid()
        assert owners.uid(accepted) == os.getuid()  # the netlink socket is reused


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_a_peer_under_another_uid_is_that_uid(owners: TcpOwners) -> None:
    # The child says who it is: another test's client (a ZeroMQ socket retrying a dead
    # address whose port this server was given) may connect first, and is left alone.
    mark = os.urandom(8).hex().encode()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        port = server.getsockname()[1]
        code = (
            f"import socket,sys; s=socket.create_connection(('127.0.0.1',{port})); "
            f"s.sendall({mark!r}); sys.stdin.read()"
        )
        cmd = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ]
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, cwd="/")
        try:
            while True:  # not a wait: each accept has the server's 60 s timeout
                accepted, _ = server.accept()
                with accepted:
                    accepted.settimeout(60)
                    if _read(accepted, len(mark)) != mark:
                        continue  # not the child
                    assert owners.uid(accepted) == 65534
                    break
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)


def _read(conn: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes, fewer where the peer closes first (or sends nothing in time)."""
    got = b""
    try:
        while len(got) < n:  # not a wait: each recv has the socket's timeout
            part = conn.recv(n - len(got))
            if not part:
                break
            got += part
    except OSError:
        pass
    return got


def test_a_socket_that_is_not_connected_has_no_owner(owners: TcpOwners) -> None:
    with socket.socket() as s:
        assert owners.uid(s) is None


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.3.2.1") and is_loopback("::1")
    assert is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.1") and not is_loopback("::") and not is_loopback("nope")
