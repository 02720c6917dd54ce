"""The same-host UNIX path (``transport.stream``) when either side is killed with SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap

import pytest

from rayless.transport import stream
from rayless.transport.client import Client
from rayless.transport.errors import AuthError, BrokenError, Timeout
from rayless.transport.protocol import Limits, new_token
from rayless.transport.server import Peer, Request, Server
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract UNIX sockets"),
]
TOKEN = new_token()

_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from rayless.transport.server import Server

    def handler(req):
        return asyncio.sleep(3600) if req.body == "hang" else req.body

    async def main():
        async with Server(token=sys.argv[1], handler=handler) as srv:
            print(srv.address, flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)

_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    from rayless.transport.client import Client

    async def main():
        async with Client(sys.argv[1], token=sys.argv[2]) as c:
            assert c.via_unix, "expected the UNIX path"
            assert await c.request("hi") == "hi"
            print("ok", flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.fixture(autouse=True)
def _unix_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYLESS_UNIX", "1")


def _spawn(code: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


async def test_a_killed_server_fails_pending_calls_at_once_and_leaves_no_socket() -> None:
    proc, address = _spawn(_SERVER, TOKEN)
    try:
        # heartbeats would take 10 minutes: only the closed connection can fail the call
        async with Client(
            address, token=TOKEN, heartbeat_interval=60, heartbeat_timeout=600, connect_timeout=1
        ) as c:
            assert c.via_unix
            assert await c.request("up") == "up"
            pending = c.submit("hang")
            os.kill(proc.pid, signal.SIGKILL)
            with pytest.raises(BrokenError, match="connection lost"):
                await asyncio.wait_for(pending, 60)
            await asyncio.to_thread(proc.wait)  # every descriptor of it is closed now
            name = stream.unix_name(address)
            assert name is not None
            with pytest.raises(ConnectionRefusedError):  # the abstract name went with it
                stream.connect(name)
            # Nothing to reconnect to, on either path: no answer (Timeout), or, when another
            # test's server took the freed TCP port meanwhile, a stranger that cannot prove
            # it knows our token (AuthError); never the killed server.
            with pytest.raises((Timeout, AuthError)):
                await c.request("anyone?")
    finally:
        proc.kill()
        proc.wait()


async def test_a_killed_client_is_forgotten_by_the_server_at_once() -> None:
    gone: asyncio.Queue[Peer] = asyncio.Queue()

    def handler(req: Request) -> object:
        return req.body

    async with Server(
        token=TOKEN, handler=handler, on_peer_gone=gone.put_nowait, peer_idle_timeout=3600
    ) as srv:
        proc, line = await asyncio.to_thread(_spawn, _CLIENT, srv.address, TOKEN)
        try:
            assert line == "ok"
            assert len(srv.peers) == 1
            os.kill(proc.pid, signal.SIGKILL)
            peer = await asyncio.wait_for(gone.get(), 60)
            assert peer.name == "client" and srv.peers == []
            assert srv._unix is not None and not srv._unix.conns
            async with Client(srv.address, token=TOKEN) as c:  # and keeps serving
                assert c.via_unix and await c.request(1) == 1
        finally:
            proc.kill()
            proc.wait()


async def test_the_path_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    async with Server(token=TOKEN, handler=lambda r: r.body) as srv:
        monkeypatch.setenv("RAYLESS_UNIX", "0")
        async with Client(srv.address, token=TOKEN) as c:
            assert not c.via_unix and await c.request("z") == "z"


async def test_closing_a_client_whose_server_just_went_away() -> None:
    srv = await Server(token=TOKEN, handler=lambda r: r.body).start()
    c = await Client(srv.address, token=TOKEN).connect()
    assert c.via_unix
    await srv.aclose()  # the connection is gone; the client has not read the EOF yet
    await c.aclose()  # its BYE fails to send: still a clean close
    assert c.closed


def _recv_until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(60)
    got = b""
    while True:
        data = sock.recv(65536)
        if not data:
            return got
        got += data


async def test_strangers_on_the_unix_path_get_the_tcp_bounds() -> None:
    limits = Limits(handshake_timeout=0.5, max_preauth_bytes=4096)
    async with Server(token=TOKEN, handler=lambda r: r.body, limits=limits) as srv:
        name = stream.unix_name(srv.address)
        assert name is not None
        silent = stream.connect(name)
        chatty = stream.connect(name)
        try:
            chatty.setblocking(True)
            header, _ = stream.pack_header([b"x" * 8192])
            chatty.sendall(header + b"x" * 8192)  # more than a handshake, unauthenticated
            silent.setblocking(True)
            assert await asyncio.to_thread(_recv_until_closed, chatty) == b""  # dropped
            assert await asyncio.to_thread(_recv_until_closed, silent) == b""  # timed out
            assert srv._unix is not None and not srv._unix.conns and srv.peers == []
        finally:
            silent.close()
            chatty.close()


async def test_a_stranger_cannot_announce_a_huge_message() -> None:
    limits = Limits(handshake_timeout=3600)  # only the size bound can end the connection
    async with Server(token=TOKEN, handler=lambda r: r.body, limits=limits) as srv:
        name = stream.unix_name(srv.address)
        assert name is not None
        sock = stream.connect(name)
        try:
            sock.setblocking(True)
            sock.sendall(struct.pack("<I", 2**31) + b"x" * 100)  # 2 GiB "coming"
            assert await asyncio.to_thread(_recv_until_closed, sock) == b""
        finally:
            sock.close()
        async with Client(srv.address, token=TOKEN) as c:  # others are served, big or small
            assert c.via_unix and await c.request(b"y" * 300_000) == b"y" * 300_000


async def test_a_connection_lost_between_two_handshake_steps_is_a_broken_error() -> None:
    # The stream ended after the server's CHALLENGE, before the client sent its AUTH (a
    # unit shut down while the store's controller connected to it): a typed BrokenError,
    # not an AssertionError from deep inside the handshake.
    async with Server(token=TOKEN, handler=lambda r: r.body) as srv:
        c = Client(srv.address, token=TOKEN)
        exchange = c._exchange
        steps = []

        async def lose_after_hello(*args: object) -> object:
            if steps:
                c._on_stream_lost("peer went away")
            steps.append(args[1])
            return await exchange(*args)  # type: ignore[arg-type]

        c._exchange = lose_after_hello  # type: ignore[method-assign]
        with pytest.raises(BrokenError, match="during the handshake"):
            await c.connect()
        await c.aclose()


async def test_a_silent_same_host_peer_is_kept_while_its_connection_is_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller whose loop is held past the idle timeout (a driver in ``time.sleep``) kept
    its UNIX connection open, yet was forgotten, and its next call broke; a ZeroMQ peer still
    expires when silent (its connection may be half-open across a network)."""
    async with Server(token=TOKEN, handler=lambda r: r.body, peer_idle_timeout=0.3) as srv:
        quiet = Client(srv.address, token=TOKEN, heartbeat_interval=100, heartbeat_timeout=1000)
        async with quiet:
            assert quiet.via_unix and await quiet.request("a", timeout=10) == "a"
            await asyncio.sleep(1.2)  # four sweeps of silence
            assert len(srv.peers) == 1
            assert await quiet.request("b", timeout=10) == "b"
    monkeypatch.setenv("RAYLESS_UNIX", "0")
    async with Server(token=TOKEN, handler=lambda r: r.body, peer_idle_timeout=0.3) as srv:
        quiet = Client(srv.address, token=TOKEN, heartbeat_interval=100, heartbeat_timeout=1000)
        async with quiet:
            assert not quiet.via_unix and await quiet.request("a", timeout=10) == "a"
            await wait_until(lambda: not srv.peers, 30, "the ZeroMQ peer to expire", interval=0.1)
