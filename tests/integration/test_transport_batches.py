"""Coalesced batches on real sockets, and peers of another protocol version."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayless.transport import client as client_hs
from rayless.transport import server as server_hs
from rayless.transport.client import Client
from rayless.transport.errors import ProtocolError
from rayless.transport.protocol import (
    Kind,
    RejectCode,
    new_nonce,
    new_token,
    open_envelope,
    pack_control,
)
from rayless.transport.server import Peer, Request, Server

pytestmark = pytest.mark.integration
TOKEN = new_token()

# a request body: small (coalesced), big bytes (a header too big to batch) or a tensor (its
# own frames): every kind in one burst, so coalesced and plain messages interleave
bodies = st.one_of(
    st.integers(),
    st.binary(max_size=64),
    st.builds(lambda n: b"b" * n, st.integers(30_000, 70_000)),
    st.builds(lambda n: torch.arange(n), st.integers(0, 3000)),
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return bool(a == b)


@contextlib.contextmanager
def _path(unix: bool) -> Iterator[None]:
    """Run on the same-host UNIX path, or on ZeroMQ (where batches are)."""
    old = os.environ.get("RAYLESS_UNIX")
    os.environ["RAYLESS_UNIX"] = "1" if unix else "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["RAYLESS_UNIX"]
        else:
            os.environ["RAYLESS_UNIX"] = old


async def _burst(values: list[Any], unix: bool) -> tuple[list[Any], list[Any], int, int]:
    """Send ``values`` as requests and as one-way pushes both ways, each in one iteration."""
    pushed: list[Any] = []
    got_oneway: list[Any] = []
    done = asyncio.Event()
    n = len(values)

    def on_oneway(peer: Peer, body: Any) -> None:
        pushed.append(body)
        if len(pushed) == n:
            for v in values:  # answer with a burst of pushes the other way
                srv.send_oneway(peer, v)

    def on_client_oneway(body: Any) -> None:
        got_oneway.append(body)
        if len(got_oneway) == n:
            done.set()

    async with (
        Server(token=TOKEN, handler=lambda r: r.body, on_oneway=on_oneway) as srv,
        Client(srv.address, token=TOKEN, on_oneway=on_client_oneway) as c,
    ):
        replies = await asyncio.gather(*[c.submit(v) for v in values])
        for v in values:
            c.send_oneway(v)
        await asyncio.wait_for(done.wait(), 60)
        assert srv._pump is not None and c._pump is not None
        assert c.via_unix is unix
        batches = srv._pump.batches_sent + c._pump.batches_sent
        assert srv._pump.dropped_batches == c._pump.dropped_batches == 0
    return replies, got_oneway, batches, len(pushed)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(bodies, min_size=1, max_size=120), st.booleans())
def test_bursts_split_back_into_every_message_in_order(values: list[Any], unix: bool) -> None:
    with _path(unix):
        replies, oneway, _, pushed = asyncio.run(_burst(values, unix))
    assert pushed == len(values)
    assert all(_same(a, b) for a, b in zip(replies, values, strict=True))
    assert all(_same(a, b) for a, b in zip(oneway, values, strict=True))  # order kept


def test_a_burst_of_small_requests_travels_in_batches() -> None:
    values = list(range(500))
    with _path(False):
        replies, oneway, batches, _ = asyncio.run(_burst(values, False))
    assert replies == values and oneway == values
    assert batches > 0


def _echo(req: Request) -> Any:
    return req.body


async def test_an_old_client_is_refused_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with Server(token=TOKEN, handler=_echo) as srv:
        monkeypatch.setattr(client_hs, "PROTOCOL", 1)
        with pytest.raises(ProtocolError, match=r"version 1.*speaks 3.*same rayless version"):
            await Client(srv.address, token=TOKEN, connect_timeout=60).connect()
        assert srv.stats["version_mismatch"] == 1
        monkeypatch.undo()
        async with Client(srv.address, token=TOKEN) as c:  # the server keeps serving
            assert await c.request("ok") == "ok"


async def test_an_old_server_is_refused_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_hs, "PROTOCOL", 1)
    monkeypatch.setattr(server_hs, "check_version", lambda v, peer: None)  # an old server
    async with Server(token=TOKEN, handler=_echo) as srv:
        c = Client(srv.address, token=TOKEN, connect_timeout=60)
        try:
            with pytest.raises(ProtocolError, match=r"server at .* version 1"):
                await c.connect()
        finally:
            await c.aclose()


async def test_a_raw_hello_without_a_version_gets_a_protocol_rejection() -> None:
    async with Server(token=TOKEN, handler=_echo) as srv:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 60_000)
        sock.connect(srv.address)
        try:
            sock.send_multipart([pack_control(Kind.HELLO), msgpack.packb({"nonce": new_nonce()})])
            msg = await asyncio.to_thread(sock.recv_multipart)
            kind, _, payload = open_envelope(msg, 0)
            body = msgpack.unpackb(bytes(payload[0]))
            assert kind is Kind.REJECT and body["code"] == RejectCode.PROTOCOL
            assert "version None" in body["reason"]
        finally:
            sock.close()
