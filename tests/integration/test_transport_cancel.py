"""CANCEL: a caller that times out or is cancelled cancels its request at a cancellable server."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import pytest

from rayless.transport.client import ENDED, Client
from rayless.transport.errors import BrokenError, Timeout
from rayless.transport.protocol import new_token
from rayless.transport.server import Request, Server
from tests.waiting import eventually

pytestmark = pytest.mark.integration
TOKEN = new_token()


class Slow:
    """A handler whose requests wait until cancelled, counting starts and cancellations."""

    def __init__(self) -> None:
        self.started = 0
        self.cancelled = 0
        self.changed = asyncio.Condition()

    async def _bump(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)
        async with self.changed:
            self.changed.notify_all()

    async def _run(self, body: Any) -> Any:
        if body == "quick":
            return "quick"
        await self._bump("started")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.shield(self._bump("cancelled"))
            raise

    def __call__(self, req: Request) -> Any:
        return self._run(req.body)

    async def until(self, name: str, n: int) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: getattr(self, name) >= n), 20)


async def test_timeout_and_cancel_reach_a_cancellable_server() -> None:
    slow = Slow()
    async with (
        Server(token=TOKEN, handler=slow, cancellable=True) as server,
        Client(server.address, token=TOKEN) as client,
    ):
        with pytest.raises(Timeout):
            await client.request("wait", timeout=0.2)
        await slow.until("cancelled", 1)
        fut = client.submit("wait")
        await slow.until("started", 2)
        fut.cancel()
        await slow.until("cancelled", 2)
        task = asyncio.ensure_future(client.request("wait"))
        await slow.until("started", 3)
        task.cancel()
        await slow.until("cancelled", 3)
        assert server.stats["cancelled"] == 3
        # requests cancelled before their handler ever ran (REQUEST and CANCEL in one batch)
        for _ in range(50):
            req_id, _fut = client._send_request("wait", None)
            client._abandon(req_id)
        assert await client.request("quick") == "quick"
        assert await _until(lambda: [p.inflight for p in server.peers] == [0])
        assert client.pending == 0 and server.stats["cancelled"] == 53


async def _until(check: Any, timeout: float = 20.0) -> bool:
    return await eventually(check, timeout=timeout)


async def test_a_server_not_cancellable_lets_the_handler_run() -> None:
    slow = Slow()
    async with (
        Server(token=TOKEN, handler=slow) as server,
        Client(server.address, token=TOKEN) as client,
    ):
        with pytest.raises(Timeout):
            await client.request("wait", timeout=0.2)
        assert await client.request("quick") == "quick"  # the CANCEL came before it
        assert server.stats["cancel_ignored"] == 1 and slow.cancelled == 0


async def test_a_traced_client_records_how_each_request_ended() -> None:
    """``Client.trace`` gets one ENDED record per request: replied (no error), failed with the
    handler's error, timed out, cancelled, or failed with the session."""
    slow = Slow()

    def handler(req: Request) -> Any:
        if req.body == "fail":
            raise ValueError("boom")
        return slow(req)

    ring: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=100)
    async with Server(token=TOKEN, handler=handler, cancellable=True) as server:
        client = Client(server.address, token=TOKEN)
        await client.connect()
        client.trace = ring
        # both ends know the session's key: with a request id it names the request (flows)
        assert [p.trace_key for p in server.peers] == [client.trace_key] != [0]
        ended: dict[str, int] = {}

        async def sent(body: Any, **kw: Any) -> None:
            task = asyncio.ensure_future(client.request(body, **kw))
            await asyncio.sleep(0)
            ended[f"{body}{len(ended)}"] = client.last_request_id
            with contextlib.suppress(Exception):
                await task

        await sent("quick")
        await sent("fail")
        await sent("wait", timeout=0.2)
        fut = client.submit("wait")
        ended["cancelled"] = client.last_request_id
        await slow.until("started", 2)
        fut.cancel()
        await slow.until("cancelled", 2)
        client.submit("wait")
        ended["broken"] = client.last_request_id
        await slow.until("started", 3)
        client.fail_pending(BrokenError("gone"))
        await client.aclose()
    by_id = {r[2]: r for r in ring}
    assert len(ring) == 5 and all(r[0] is ENDED and r[1] == client.trace_key for r in ring)
    assert by_id[ended["quick0"]][4] is None
    assert by_id[ended["fail1"]][4] is not None and "boom" in by_id[ended["fail1"]][4]
    assert by_id[ended["wait2"]][4].startswith("Timeout: ")
    assert by_id[ended["cancelled"]][4] == "cancelled"
    assert by_id[ended["broken"]][4] == "BrokenError: gone"
    assert all(isinstance(r[3], int) and r[3] > 0 for r in ring)


async def test_a_cancel_or_bye_from_a_peer_the_server_does_not_know_is_ignored_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A peer cut off as it cancels or leaves (its session ended at a shutdown) may send
    # CANCEL or BYE after the server forgot it: nothing to do, and no warning (newcomers'
    # scripts printed one at their exit); a stranger's request is still refused.
    from rayless.transport.protocol import Kind, RejectCode, envelope
    from tests.integration.test_security import _dealer, _reply

    async with Server(token=TOKEN, handler=Slow(), cancellable=True) as srv:

        def stranger() -> Any:
            s = _dealer(srv.address)
            try:
                s.send_multipart(envelope(Kind.CANCEL, 9))
                s.send_multipart(envelope(Kind.BYE, 0))
                s.send_multipart(envelope(Kind.REQUEST, 10, [b"\x00"]))
                return _reply(s)
            finally:
                s.close(linger=0)

        with caplog.at_level("WARNING", logger="rayless.transport"):
            kind, body = await asyncio.to_thread(stranger)
        assert kind is Kind.REJECT and body["code"] == RejectCode.NEED_HANDSHAKE
        assert srv.stats["dropped"] == 0 and srv.stats["unauthenticated"] == 3
        assert not [r for r in caplog.records if "CANCEL" in r.getMessage()]
        assert not [r for r in caplog.records if "BYE" in r.getMessage()]
