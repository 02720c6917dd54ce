"""Hostile limits and transports: every message limit, the pre-handshake gate, CURVE.

The other half of tests/integration/test_security.py (fuzzing every endpoint, authentication,
pickle): a peer past a limit gets an error and the server keeps serving; a stranger cannot make
an endpoint hold more than ``max_preauth_bytes`` nor stay past ``handshake_timeout``; CURVE
shuts out plain peers and other clusters.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgpack
import psutil
import pytest
import zmq

from rayless.actors import Cluster
from rayless.actors.protocol.messages import ListNodes
from rayless.transport import codec
from rayless.transport.client import Client
from rayless.transport.errors import LimitError, Timeout
from rayless.transport.protocol import (
    PROTOCOL,
    Kind,
    Limits,
    envelope,
    new_nonce,
    new_token,
    open_envelope,
    pack_control,
)
from rayless.transport.server import Server
from tests.integration.actor_classes import Counter
from tests.integration.test_security import _dealer, _handshake, _reply
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


# -- limits --------------------------------------------------------------------------------


async def test_every_limit_gives_the_peer_an_error_and_the_server_keeps_serving() -> None:
    token = new_token()
    limits = Limits(max_message_bytes=2**20, max_frames=8, max_header_bytes=4096)
    async with Server(token=token, handler=lambda r: len(r.body), limits=limits) as srv:
        async with Client(srv.address, token=token) as client:
            # the client learnt the server's limits in the handshake: it refuses to send
            with pytest.raises(LimitError, match="exceeds the limit of 1048576"):
                await client.request(b"x" * (2 * 2**20), timeout=5)
            with pytest.raises(LimitError, match="header"):
                await client.request("y" * 8000, timeout=5)
            assert await client.request(b"x" * 1000, timeout=5) == 1000

        def raw() -> dict[str, Any]:
            s = _dealer(srv.address)
            out: dict[str, Any] = {"welcome": open_envelope(_handshake(s, token), 0)[0]}
            # a peer that does not check: too many frames, an oversize header
            s.send_multipart([*envelope(Kind.REQUEST, 1, codec.encode("z")), *[b"f"] * 12])
            out["frames"] = _reply(s)
            header = msgpack.packb("h" * 8000)
            s.send_multipart([pack_control(Kind.REQUEST, 2), header])
            out["header"] = _reply(s)
            # a frame past MAXMSGSIZE: ZeroMQ drops the connection; the server lives on
            s.send_multipart([pack_control(Kind.REQUEST, 3), b"\0" * (2 * 2**20)])
            s.close(linger=0)
            return out

        out = await asyncio.to_thread(raw)
        assert out["welcome"] is Kind.WELCOME
        assert out["frames"][0] is Kind.ERROR and isinstance(out["frames"][1], LimitError)
        assert out["header"][0] is Kind.ERROR and isinstance(out["header"][1], LimitError)
        assert srv.stats["over_limit"] == 2
        async with Client(srv.address, token=token) as client:
            assert await client.request(b"ok", timeout=5) == 2


# -- before the handshake -------------------------------------------------------------------

PREAUTH_RSS_BOUND = 32 * 2**20  # measured: +4 MiB peak for 4 x 256 MiB (docs/security.md)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


async def test_a_stranger_cannot_make_an_endpoint_hold_more_than_the_preauth_bound() -> None:
    """Four 128 MiB messages from a peer without the token: before the gate the server held
    each one whole (ZeroMQ reads a message completely before a ROUTER hands it over); now
    the connection is cut once it has sent ``max_preauth_bytes``, its buffers freed."""
    import threading
    import time

    from rayless.transport import echo

    token = new_token()
    proc, address = echo.spawn("tcp://127.0.0.1:0", token)
    stranger = _dealer(address)
    try:
        server = psutil.Process(proc.pid)
        async with Client(address, token=token) as client:
            assert await client.request("warm-up", timeout=10) == "warm-up"
        await asyncio.sleep(0.2)
        rss_before, hwm_before = server.memory_info().rss, _peak_rss(proc.pid)
        peak = [rss_before]
        done = threading.Event()

        def sample() -> None:  # psutil's RSS every 5 ms while the attack runs
            while not done.is_set():  # not a wait: a sampler that runs until `done`
                peak[0] = max(peak[0], server.memory_info().rss)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        blob = bytearray(128 * 2**20)
        try:
            for _ in range(4):  # each reconnect of the DEALER carries the next message
                stranger.send(blob, copy=False)
            stats: dict[str, Any] = {}
            async with Client(address, token=token) as client:

                async def all_cut() -> bool:  # all four strangers cut off
                    nonlocal stats
                    stats = await client.request("__stats__", timeout=10)
                    return bool(stats.get("preauth_bytes", 0) >= 4)

                await wait_until(all_cut, timeout=20, what="4 preauth cuts", interval=0.1)
                assert await client.request(("still", "serving"), timeout=10) == (
                    "still",
                    "serving",
                )
        finally:
            done.set()
            sampler.join()
        growth = peak[0] - rss_before
        hwm_growth = _peak_rss(proc.pid) - hwm_before
        assert growth < PREAUTH_RSS_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB"
        assert hwm_growth < PREAUTH_RSS_BOUND, f"peak RSS grew by {hwm_growth / 2**20:.1f} MiB"
        assert stats.get("preauth_bytes", 0) >= 4, stats
        assert stats.get("requests", 0) >= 1 and "dropped" not in stats, stats  # none got in
    finally:
        stranger.close(linger=0)
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()
            proc.wait()


async def test_unauthenticated_connections_are_dropped_after_the_handshake_timeout() -> None:
    """A silent TCP connection and a DEALER that sent HELLO but no AUTH are both cut after
    ``handshake_timeout``, their descriptors and half-open handshakes released; an
    authenticated client is not affected."""
    import socket

    token = new_token()
    limits = Limits(handshake_timeout=0.5)
    me = psutil.Process()
    async with (
        Server(token=token, handler=lambda r: r.body, limits=limits) as srv,
        Client(srv.address, token=token) as client,
    ):
        assert await client.request("before", timeout=5) == "before"
        fds_before = me.num_fds()
        host, port = srv.address[len("tcp://") :].rsplit(":", 1)

        def silent() -> bytes:  # connects, says nothing; returns what it read until EOF
            with socket.create_connection((host, int(port)), timeout=30) as s:
                got = b""
                while chunk := s.recv(4096):
                    got += chunk
                return got

        def hello_only(s: zmq.Socket[Any]) -> Kind:
            s.send_multipart(
                [pack_control(Kind.HELLO), msgpack.packb({"v": PROTOCOL, "nonce": new_nonce()})]
            )
            return _reply(s)[0]

        greeting = await asyncio.to_thread(silent)  # before: never returned (no EOF)
        assert len(greeting) <= 64  # the server's ZMTP greeting, nothing more
        half_open = _dealer(srv.address)
        try:
            assert await asyncio.to_thread(hello_only, half_open) is Kind.CHALLENGE
            assert srv._pending
            await wait_until(
                lambda: srv.stats["handshake_timeout"] >= 2 and not srv._pending,
                timeout=10,
                what="the half-open connection to be cut",
                interval=0.1,
            )
            assert srv.stats["handshake_timeout"] >= 2, dict(srv.stats)
            assert not srv._pending  # the HELLO's state went with its connection
        finally:
            half_open.close(linger=0)
        await wait_until(
            lambda: me.num_fds() <= fds_before, timeout=5, what="the fds back", interval=0.1
        )
        assert me.num_fds() <= fds_before
        # the authenticated client outlived the timeout several times over
        assert await client.request("after", timeout=5) == "after"
        assert srv._gate is not None and srv._gate.waiting == 0


def test_limits_from_the_environment() -> None:
    env = {"RAYLESS_MAX_MESSAGE_BYTES": "1024", "RAYLESS_MAX_PEERS": "3"}
    limits = Limits.from_env(env)
    assert limits.max_message_bytes == 1024 and limits.max_peers == 3
    assert limits.max_frames == Limits().max_frames
    assert Limits.from_env({}) == Limits()
    with pytest.raises(ValueError, match="RAYLESS_MAX_FRAMES"):
        Limits.from_env({"RAYLESS_MAX_FRAMES": "many"})
    with pytest.raises(ValueError, match="max_peers"):
        Limits.from_env({"RAYLESS_MAX_PEERS": "0"})
    pre = Limits.from_env({"RAYLESS_MAX_PREAUTH_BYTES": "8192", "RAYLESS_HANDSHAKE_TIMEOUT": "2.5"})
    assert pre.max_preauth_bytes == 8192 and pre.handshake_timeout == 2.5
    with pytest.raises(ValueError, match="RAYLESS_HANDSHAKE_TIMEOUT"):
        Limits.from_env({"RAYLESS_HANDSHAKE_TIMEOUT": "soon"})


# -- CURVE ---------------------------------------------------------------------------------


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
async def test_curve_encrypts_and_shuts_out_plain_peers() -> None:
    token = new_token()
    async with Server(token=token, handler=lambda r: r.body, curve=True) as srv:
        async with Client(srv.address, token=token, curve=True) as client:
            assert await client.request({"secret": b"payload"}, timeout=5) == {"secret": b"payload"}
        with pytest.raises(Timeout):  # a plaintext peer cannot even start the handshake
            async with Client(srv.address, token=token, curve=False, connect_timeout=1) as c:
                await c.request("x", timeout=1)
        with pytest.raises(Timeout):  # nor can a CURVE peer with another cluster's keys
            async with Client(srv.address, token=new_token(), curve=True, connect_timeout=1) as c:
                await c.request("x", timeout=1)
        assert srv.peers == [] or len(srv.peers) == 0


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
async def test_a_whole_cluster_configured_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAYLESS_CURVE", "1")
    monkeypatch.setenv("RAYLESS_MAX_MESSAGE_BYTES", str(4 * 2**20))
    async with Cluster.local(nodes=1) as cluster:
        counter = await cluster.spawn(Counter)
        assert await counter.add(3) == 3
        with pytest.raises(LimitError, match="RAYLESS_MAX_MESSAGE_BYTES"):
            await counter.add(b"x" * (5 * 2**20))
        assert await counter.add(1) == 4
        monkeypatch.delenv("RAYLESS_CURVE")
        with pytest.raises(Timeout):  # the head speaks CURVE only
            async with Client(cluster.address, token=cluster.token, connect_timeout=1) as c:
                await c.request(ListNodes(), timeout=1)
    assert os.environ.get("RAYLESS_CURVE") is None


# -- the same-host path cannot be filled -----------------------------------------------------

# A stranger opens ``count`` idle connections to a UNIX name and holds them ``hold`` seconds;
# it reports how many the kernel accepted.
_UNIX_FILL = r"""
import socket, time
socks = []
for _ in range(int(ARGS["count"])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(ARGS["name"])
    except OSError:
        s.close()
        continue
    socks.append(s)
time.sleep(float(ARGS["hold"]))
for s in socks:
    s.close()
RESULT = len(socks)
"""


async def _until(pred: Any, timeout: float, what: str) -> None:
    await wait_until(pred, timeout, what, interval=0.05)


async def test_idle_strangers_cannot_fill_the_unix_path() -> None:
    """The auditor filled the listener with 5,200 idle tokenless connections; a legit client
    then failed with ECONNRESET. Now one uid holds at most a quarter of the pending share,
    a full listener pushes out its oldest stranger, and the client is served."""
    from rayless.transport import stream
    from tests.integration.strangers import run_stranger

    limits = Limits(max_peers=8, max_pending_handshakes=8, handshake_timeout=30.0)
    token = new_token()
    async with Server(token=token, handler=lambda r: r.body, limits=limits) as srv:
        name = stream.unix_name(srv.address)
        assert name is not None and srv._unix is not None
        unix = srv._unix
        attack = asyncio.create_task(
            asyncio.to_thread(run_stranger, _UNIX_FILL, {"name": name, "count": 64, "hold": 6})
        )
        try:
            await _until(lambda: unix.refused >= 8, 60, "the listener to refuse strangers")
            async with Client(srv.address, token=token, connect_timeout=10) as client:
                assert await client.request("in", timeout=10) == "in"
                assert client.via_unix, (client.unix_fallback, unix.refused, unix.accept_failed)
        finally:
            run = await attack
        assert run.result == 64  # the kernel accepted them all; the listener kept few
        if run.uid != os.geteuid():  # nobody's share: a quarter of the pending bound
            assert len(unix.conns) <= 2 + 1


async def test_a_client_refused_by_a_full_unix_path_falls_back_to_zeromq() -> None:
    token = new_token()
    async with Server(token=token, handler=lambda r: r.body) as srv:
        assert srv._unix is not None
        srv._unix._max_conns = 0  # full of sessions: every new connection is closed at once
        async with Client(srv.address, token=token, connect_timeout=10) as client:
            assert await client.request("via zmq", timeout=10) == "via zmq"
            assert not client.via_unix


UNIX_FD_HOG = """
import asyncio, os, resource, sys, time
from rayless.transport.unix_listener import UnixListener

async def main():
    name = "\\0" + sys.argv[1]
    listener = UnixListener(
        name, lambda conn, msgs: None, authenticated=lambda rid: False,
        on_gone=lambda rid: None, queue_limit=64, max_message=1 << 20,
        max_preauth_bytes=1 << 16, handshake_timeout=600, max_conns=64,
    )
    await asyncio.to_thread(lambda: None)  # the executor's thread, before the fds run out
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, limit))
    hog = []
    try:
        while True:  # every fd the process may have: as strangers' connections would
            hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    print("full", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # clients are waiting to be accepted
    await asyncio.sleep(2)
    for fd in hog:
        os.close(fd)
    end = time.monotonic() + 30
    while len(listener.conns) < 2 and time.monotonic() < end:
        await asyncio.sleep(0.01)
    print(len(listener.conns), flush=True)

asyncio.run(main())
"""


def test_the_unix_path_out_of_fds_neither_spins_nor_floods_the_log(tmp_path: Any) -> None:
    import socket
    import subprocess
    import sys

    name = f"\0rayless-fd-test-{os.getpid()}"
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", UNIX_FD_HOG, name[1:]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert proc.stdin is not None and proc.stdout is not None
    socks = []
    try:
        assert proc.stdout.readline().strip() == "full", err.read_text()
        for _ in range(2):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(name)
            socks.append(sock)
        proc.stdin.write("\n")
        proc.stdin.flush()
        accepted = proc.stdout.readline().strip()
        assert accepted == "2", err.read_text()[-2000:]  # accepted once fds are back
        lines = err.read_text().splitlines()
        assert len(lines) < 5, (len(lines), lines[:3])  # no spinning on accept(), one line
    finally:
        for sock in socks:
            sock.close()
        proc.kill()
        proc.wait(timeout=30)


# -- strangers cannot run a server out of descriptors -----------------------------------------

# An echo server whose descriptor limit is 256 (the default is often 1,024, less than the
# 2 x 1,024 descriptors the default max_pending_handshakes of ZeroMQ strangers would take).
# The hard limit too: every rayless process raises its soft limit to the hard one.
_SMALL_ECHO = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
sys.argv = ["echo", sys.argv[1]]
runpy.run_module("rayless.transport.echo", run_name="__main__")
"""

# A stranger opens ``count`` idle TCP connections and holds them ``hold`` seconds.
_TCP_FILL = r"""
import socket, time
host, port = ARGS["host"], int(ARGS["port"])
socks = []
for _ in range(int(ARGS["count"])):
    try:
        socks.append(socket.create_connection((host, port), timeout=2))
    except OSError:
        pass
time.sleep(float(ARGS["hold"]))
RESULT = len(socks)
"""


@pytest.mark.slow  # 600 strangers held for 20 s
async def test_idle_tcp_strangers_cannot_run_a_server_out_of_descriptors() -> None:
    import subprocess
    import sys

    from tests.integration.strangers import run_stranger

    token = new_token()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SMALL_ECHO, "tcp://127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RAYLESS_TOKEN": token},
    )
    try:
        assert proc.stdout is not None
        address = await asyncio.to_thread(proc.stdout.readline)
        address = address.strip()
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        flood = asyncio.create_task(
            asyncio.to_thread(
                run_stranger, _TCP_FILL, {"host": host, "port": port, "count": 600, "hold": 20}
            )
        )
        server = psutil.Process(proc.pid)

        async def flooded() -> bool:  # the server has taken in the strangers it will hold
            stats: dict[str, int] = {}
            async with Client(address, token=token, connect_timeout=10) as client:
                stats = await client.request("__stats__", timeout=10)
            return stats.get("pending_handshakes", 0) > 0

        await wait_until(flooded, timeout=30, what="strangers pushed out by newer ones")
        async with Client(address, token=token, connect_timeout=10) as client:
            assert await client.request("still here", timeout=10) == "still here"
        assert server.num_fds() < 256
        held = await flood
        assert held.result == 600  # the kernel took them all: the server shed the oldest
    finally:
        proc.kill()
        proc.wait(timeout=30)
