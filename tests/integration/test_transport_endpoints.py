"""Server/Client over real sockets on loopback: requests, limits, failures, the handshake."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
import zmq

from rayless.placement.errors import PlacementError
from rayless.transport.client import Client
from rayless.transport.errors import (
    AuthError,
    BrokenError,
    ClosedError,
    LimitError,
    RemoteError,
    Timeout,
)
from rayless.transport.protocol import (
    PROTOCOL,
    Kind,
    Limits,
    RejectCode,
    client_proof,
    new_nonce,
    new_token,
    open_envelope,
    pack_control,
)
from rayless.transport.server import Request, Server
from tests.waiting import scaled, wait_until

pytestmark = pytest.mark.integration
TOKEN = new_token()


def handler(req: Request) -> Any:
    body = req.body
    if isinstance(body, dict) and "sleep" in body:
        return asyncio.sleep(body["sleep"], result="slept")
    if body == "value-error":
        raise ValueError("bad value")
    if body == "placement":
        raise PlacementError("no node has 9 GPUs")
    if body == "deep-error":  # an argument past the codec's nesting bound
        deep: list[Any] = []
        for _ in range(3000):
            deep = [deep]
        raise PlacementError(deep)
    return body


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with Server(token=TOKEN, handler=handler, name="test-server") as srv:
        yield srv


async def test_port_zero_reports_the_bound_port(server: Server) -> None:
    assert server.address.startswith("tcp://127.0.0.1:")
    assert int(server.address.rsplit(":", 1)[1]) > 0


async def test_request_reply_and_many_in_flight(server: Server) -> None:
    async with Client(server.address, token=TOKEN) as client:
        assert await client.request({"a": [1, 2.5, "x", b"y", None]}) == {
            "a": [1, 2.5, "x", b"y", None]
        }
        futures = [client.submit(i) for i in range(2000)]
        assert await asyncio.gather(*futures) == list(range(2000))
        assert client.pending == 0


async def test_ipc_transport(tmp_path: Any) -> None:
    address = f"ipc://{tmp_path}/sock"
    async with (
        Server(address, token=TOKEN, handler=handler) as srv,
        Client(srv.address, token=TOKEN) as client,
    ):
        assert await client.request("over ipc") == "over ipc"


async def test_remote_errors_keep_their_type(server: Server) -> None:
    async with Client(server.address, token=TOKEN) as client:
        with pytest.raises(PlacementError, match="9 GPUs"):
            await client.request("placement")
        with pytest.raises(RemoteError) as info:
            await client.request("value-error")
        assert info.value.remote_type == "builtins.ValueError"
        assert "bad value" in info.value.remote_message
        assert "Traceback" in info.value.remote_traceback
        assert await client.request("still serving") == "still serving"


async def test_an_error_that_cannot_be_encoded_still_ends_its_call(server: Server) -> None:
    # its encoding failed inside the reply path: no reply was sent, the caller waited for good
    async with Client(server.address, token=TOKEN) as client:
        with pytest.raises(RemoteError, match="could not be sent whole") as info:
            await client.request("deep-error", timeout=60)
        assert info.value.remote_type == "rayless.placement.errors.PlacementError"
        assert await client.request("still serving") == "still serving"


async def test_timeout_then_late_reply_is_ignored(server: Server) -> None:
    async with Client(server.address, token=TOKEN) as client:
        with pytest.raises(Timeout, match=r"within 0\.05s"):
            await client.request({"sleep": 0.3}, timeout=0.05)
        assert isinstance(Timeout("x"), TimeoutError)
        await asyncio.sleep(0.4)  # the late reply arrives and is dropped
        assert await client.request(7, timeout=5) == 7
        assert client.pending == 0


async def test_close_fails_pending_and_is_idempotent(server: Server) -> None:
    client = await Client(server.address, token=TOKEN).connect()
    pending = client.submit({"sleep": 10})
    await asyncio.sleep(0.05)
    await client.aclose()
    await client.aclose()
    with pytest.raises(ClosedError):
        await pending
    with pytest.raises(ClosedError):
        await client.request(1)
    assert client.closed


async def test_cancelled_request_is_forgotten(server: Server) -> None:
    async with Client(server.address, token=TOKEN) as client:
        task = asyncio.ensure_future(client.request({"sleep": 0.2}))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.pending == 0


async def test_wrong_token_is_rejected_counted_and_others_keep_working(server: Server) -> None:
    with pytest.raises(AuthError):
        async with Client(server.address, token=new_token(), connect_timeout=scaled(20)):
            pass
    assert server.stats["auth_failures"] == 1
    async with Client(server.address, token=TOKEN) as client:
        assert await client.request("ok") == "ok"


async def test_server_with_another_token_cannot_impersonate() -> None:
    async with Server(token=new_token(), handler=handler) as impostor:
        with pytest.raises(AuthError, match="could not prove"):
            await Client(impostor.address, token=TOKEN, connect_timeout=scaled(20)).connect()


def _raw(address: str) -> zmq.Socket[Any]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(address)
    return sock


async def _recv(sock: zmq.Socket[Any]) -> tuple[Kind, int, list[Any]]:
    """One message from a raw socket, parsed: (kind, request id, payload frames)."""
    return open_envelope(await asyncio.to_thread(sock.recv_multipart), 0)


async def test_no_handshake_reaches_no_handler() -> None:
    calls: list[Any] = []

    def spy(req: Request) -> Any:
        calls.append(req.body)
        return req.body

    async with Server(token=TOKEN, handler=spy) as srv:
        sock = _raw(srv.address)
        try:
            sock.send_multipart([pack_control(Kind.REQUEST, 5), msgpack.packb("hi")])
            kind, req_id, _ = await _recv(sock)
            assert (kind, req_id) == (Kind.REJECT, 5)
            assert srv.stats["unauthenticated"] == 1
            assert calls == []
        finally:
            sock.close()


async def test_replayed_handshake_is_rejected(server: Server) -> None:
    # A legitimate handshake, recorded by an eavesdropper...
    sock = _raw(server.address)
    nonce_c = new_nonce()
    hello = [
        pack_control(Kind.HELLO),
        msgpack.packb({"v": PROTOCOL, "nonce": nonce_c, "name": "a"}),
    ]
    sock.send_multipart(hello)
    challenge = msgpack.unpackb((await _recv(sock))[2][0])
    auth = [
        pack_control(Kind.AUTH),
        msgpack.packb({"proof": client_proof(TOKEN.encode(), challenge["nonce"], nonce_c)}),
    ]
    sock.send_multipart(auth)
    assert (await _recv(sock))[0] is Kind.WELCOME
    sock.close()
    # ... and replayed on a new connection: the server's fresh nonce defeats it.
    replay = _raw(server.address)
    try:
        replay.send_multipart(hello)
        assert (await _recv(replay))[0] is Kind.CHALLENGE
        replay.send_multipart(auth)
        kind, _, payload = await _recv(replay)
        assert kind is Kind.REJECT
        assert msgpack.unpackb(payload[0])["code"] == RejectCode.AUTH
        assert server.stats["auth_failures"] == 1
    finally:
        replay.close()


async def test_inflight_limit_answers_with_limit_error() -> None:
    limits = Limits(max_inflight_per_peer=2)
    async with (
        Server(token=TOKEN, handler=handler, limits=limits) as srv,
        Client(srv.address, token=TOKEN) as client,
    ):
        client._window = 10  # a peer that ignores the bound the server advertised
        slow = [client.submit({"sleep": 0.3}) for _ in range(2)]
        with pytest.raises(LimitError, match="2 requests in flight"):
            await client.request({"sleep": 0.3}, timeout=5)
        assert await asyncio.gather(*slow) == ["slept", "slept"]
        assert srv.stats["over_limit"] == 1


async def test_requests_past_the_window_wait_in_the_client_in_order() -> None:
    running, most, order = 0, 0, []

    async def counting(req: Request) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        order.append(req.body)
        await asyncio.sleep(0.001)
        running -= 1
        return req.body

    async with (
        Server(token=TOKEN, handler=counting, limits=Limits(max_inflight_per_peer=8)) as srv,
        Client(srv.address, token=TOKEN) as client,
    ):
        futures = [client.submit(i) for i in range(2000)]  # far past the server's bound
        assert client.held == 2000 - 4  # half the advertised bound is sent
        assert await asyncio.gather(*futures) == list(range(2000))
        assert srv.stats["over_limit"] == 0 and most <= 4 and order == list(range(2000))
        assert (client.pending, client.held) == (0, 0)


async def test_a_request_cancelled_while_held_never_reaches_the_server() -> None:
    async with (
        Server(token=TOKEN, handler=handler, limits=Limits(max_inflight_per_peer=4)) as srv,
        Client(srv.address, token=TOKEN) as client,
    ):
        slow = [client.submit({"sleep": 0.2}) for _ in range(2)]
        held = client.submit("never")
        timed = asyncio.ensure_future(client.request("late", timeout=0.05))
        after = client.submit("after")
        held.cancel()
        with pytest.raises(Timeout):
            await timed
        assert await asyncio.gather(*slow, after) == ["slept", "slept", "after"]
        assert srv.stats["requests"] == 3  # the two slow ones and "after"
        assert (client.pending, client.held) == (0, 0)


async def test_peer_limit_rejects_new_connections() -> None:
    async with (
        Server(token=TOKEN, handler=handler, limits=Limits(max_peers=1)) as srv,
        Client(srv.address, token=TOKEN) as first,
    ):
        with pytest.raises(LimitError):
            await Client(srv.address, token=TOKEN, connect_timeout=5).connect()
        assert await first.request(1) == 1


async def test_oversize_message_is_refused_and_server_keeps_serving() -> None:
    limits = Limits(max_message_bytes=1 << 16)
    async with (
        Server(token=TOKEN, handler=handler, limits=limits) as srv,
        Client(srv.address, token=TOKEN, heartbeat_timeout=3) as client,
    ):
        with pytest.raises(LimitError):  # the server advertised its limit in the handshake
            await client.request(b"x" * (1 << 17), timeout=1.0)
        async with Client(srv.address, token=TOKEN) as other:
            assert await other.request("fine") == "fine"


def _sized(req: Request) -> Any:
    kind, n = req.body
    if kind == "bytes":
        return bytes(n)
    import torch

    return torch.zeros(n, dtype=torch.uint8)


async def test_a_reply_over_the_callers_limit_is_a_limit_error_at_once() -> None:
    """The client announces its limits in HELLO; the server checks each reply against them
    (before: ZeroMQ dropped the connection on the big reply, and the caller waited for the
    heartbeat to break the session: ``BrokenError: no heartbeat for 10.0s``)."""
    small = Limits(max_message_bytes=2**20)
    async with (
        Server(token=TOKEN, handler=_sized, name="sized") as srv,
        Client(srv.address, token=TOKEN, limits=small, heartbeat_timeout=30) as client,
    ):
        with pytest.raises(LimitError, match="1048576 bytes of caller"):
            await client.request(("tensor", 2 * 2**20), timeout=20)
        assert srv.stats["reply_over_limit"] == 1
        # the session is intact: the next request is answered
        assert (await client.request(("tensor", 1000), timeout=5)).numel() == 1000


async def test_a_big_bytes_value_is_refused_before_it_travels() -> None:
    """bytes travel in the msgpack header: a reply whose header is over the caller's
    ``max_header_bytes`` is a LimitError from the server, a request one from the client,
    both before anything is sent (before: the reply was sent and accepted)."""
    limits = Limits(max_header_bytes=2**16)
    async with (
        Server(token=TOKEN, handler=_sized, name="sized") as srv,
        Client(srv.address, token=TOKEN, limits=limits) as client,
    ):
        with pytest.raises(LimitError, match=r"header of \d+ bytes exceeds the limit of 65536"):
            await client.request(("bytes", 2**20), timeout=20)
        with pytest.raises(LimitError, match="header"):
            await client.request(("bytes", bytes(2**20)), timeout=20)
        assert await client.request(("bytes", 1000), timeout=5) == bytes(1000)
        # one-way pushes are checked too: the server's caller gets the error
        peer = srv.peers[0]
        with pytest.raises(LimitError, match="header"):
            srv.send_oneway(peer, bytes(2**20))


async def test_one_way_messages_in_both_directions() -> None:
    got: list[Any] = []
    pushed: asyncio.Queue[Any] = asyncio.Queue()

    def on_oneway(peer: Any, body: Any) -> None:
        got.append(body)
        srv.send_oneway(peer, ("echo", body))

    async with (
        Server(token=TOKEN, handler=handler, on_oneway=on_oneway) as srv,
        Client(srv.address, token=TOKEN, on_oneway=pushed.put_nowait) as client,
    ):
        client.send_oneway("ping!")
        assert await asyncio.wait_for(pushed.get(), 5) == ("echo", "ping!")
        assert got == ["ping!"]


async def test_vanished_server_breaks_pending_requests() -> None:
    from rayless.transport import echo

    proc, address = echo.spawn("tcp://127.0.0.1:0", TOKEN)
    try:
        async with Client(
            address, token=TOKEN, heartbeat_interval=0.1, heartbeat_timeout=0.5
        ) as client:
            assert await client.request("up") == "up"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            start = time.monotonic()
            # ZeroMQ: the heartbeat notices; the same-host UNIX path: the closed connection
            with pytest.raises(BrokenError, match=r"no heartbeat|connection lost"):
                await client.request("anyone?", timeout=10)
            assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.wait()


async def test_restarted_server_gets_a_fresh_handshake() -> None:
    srv = await Server(token=TOKEN, handler=handler).start()
    address = srv.address
    client = await Client(address, token=TOKEN).connect()
    try:
        assert await client.request(1) == 1
        await srv.aclose()

        async def rebound() -> bool:  # ZeroMQ releases the port on its I/O thread after close
            nonlocal srv
            try:
                srv = await Server(address, token=TOKEN, handler=handler).start()
            except zmq.ZMQError:
                return False
            return True

        await wait_until(rebound, timeout=5, what=f"{address} bindable again", interval=0.05)
        outcome: list[Any] = []
        for _ in range(50):
            try:
                outcome.append(await client.request(2, timeout=1))
                break
            except (BrokenError, Timeout) as exc:
                outcome.append(type(exc))
        assert outcome[-1] == 2, outcome
    finally:
        await client.aclose()
        await srv.aclose()


async def test_backpressure_on_a_stopped_server() -> None:
    from rayless.transport import echo

    proc, address = echo.spawn("tcp://127.0.0.1:0", TOKEN)
    limits = Limits(hwm=8, send_queue=16)
    try:
        async with Client(address, token=TOKEN, limits=limits, heartbeat_timeout=60) as client:
            os.kill(proc.pid, signal.SIGSTOP)
            payload = b"x" * 200_000  # big enough to fill the kernel buffers quickly
            futures = []
            with pytest.raises(Timeout, match="did not take messages"):
                for _ in range(10_000):
                    await client.wait_room(0.2)
                    futures.append(client.submit(payload))
            assert 0 < client.queued <= limits.send_queue
            os.kill(proc.pid, signal.SIGCONT)
            done = await asyncio.wait_for(asyncio.gather(*futures), 30)
            assert all(len(d) == len(payload) for d in done)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


async def test_bad_arguments_are_rejected_up_front() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Server(token="short", handler=handler)
    with pytest.raises(ValueError, match="positive"):
        Limits(max_peers=0)
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        Client("tcp://127.0.0.1:1", token=TOKEN, heartbeat_interval=2, heartbeat_timeout=1)


async def test_an_error_hook_that_fails_never_leaves_the_call_waiting(server: Server) -> None:
    """The reply's future was popped and its timer cancelled before the hook ran: a hook that
    raised left the call waiting forever, its own timeout too."""

    def hook(exc: BaseException) -> BaseException:
        raise TypeError("cannot rebuild this one")

    async with Client(server.address, token=TOKEN, error_hook=hook) as client:
        with pytest.raises(RemoteError, match="bad value"):
            await asyncio.wait_for(client.request("value-error", timeout=30), 10)
        assert client.pending == 0
        assert await client.request("still serving", timeout=10) == "still serving"
