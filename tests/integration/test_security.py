"""Hostile input and access: fuzz every endpoint of a cluster, authentication, pickle.

Builds on tests/integration/test_transport_fuzz.py (which fuzzes one echo server): here every
listening endpoint of a real cluster (head, node agent, actor, store controller, storage unit)
gets random and mutated messages before and after a real handshake. Limits, the
pre-handshake gate and CURVE are in tests/integration/test_security_limits.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import torch
import zmq
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.store import Store
from rayless.transport import codec
from rayless.transport.client import Client
from rayless.transport.errors import (
    AuthError,
    ProtocolError,
    RaylessError,
    RemoteError,
)
from rayless.transport.protocol import (
    PROTOCOL,
    Kind,
    RejectCode,
    client_proof,
    envelope,
    new_nonce,
    new_token,
    open_envelope,
    pack_control,
)
from rayless.transport.server import Request, Server
from tests.integration.actor_classes import Counter
from tests.integration.test_transport_fuzz import _garbage

pytestmark = pytest.mark.integration


def _dealer(address: str, timeout_ms: int = 5000) -> zmq.Socket[Any]:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
    sock.connect(address)
    return sock


def _handshake(sock: zmq.Socket[Any], token: str, nonce_c: bytes | None = None) -> list[Any]:
    """A real handshake by hand; returns the frames of the server's last answer."""
    nonce_c = nonce_c or new_nonce()
    sock.send_multipart(
        [pack_control(Kind.HELLO), msgpack.packb({"v": PROTOCOL, "nonce": nonce_c})]
    )
    kind, _, payload = open_envelope(sock.recv_multipart(), 0)
    assert kind is Kind.CHALLENGE
    challenge = msgpack.unpackb(payload[0])
    proof = client_proof(token.encode(), challenge["nonce"], nonce_c)
    sock.send_multipart([pack_control(Kind.AUTH), msgpack.packb({"proof": proof})])
    return sock.recv_multipart()


def _reply(sock: zmq.Socket[Any]) -> tuple[Kind, Any]:
    kind, _, payload = open_envelope(sock.recv_multipart(copy=True), 0)
    if kind in (Kind.REJECT, Kind.CHALLENGE, Kind.WELCOME):
        return kind, msgpack.unpackb(bytes(payload[0]))
    return kind, codec.decode([bytes(p) for p in payload])


def _blast(address: str, token: str, n: int, seed: int) -> int:
    """``n`` garbage messages from 4 strangers and 2 authenticated peers; returns how many."""
    rng = random.Random(seed)
    strangers = [_dealer(address) for _ in range(4)]
    insiders = [_dealer(address) for _ in range(2)]
    sent = 0
    try:
        for s in insiders:
            _handshake(s, token)
        for i in range(n):
            sock = insiders[i % 2] if i % 2 else strangers[i % 4]
            try:
                sock.send_multipart(_garbage(rng), zmq.NOBLOCK, copy=True)
                sent += 1
            except zmq.Again:
                pass
            if i % 200 == 199:
                for s in strangers + insiders:  # drain replies so nothing backs up
                    while True:
                        try:
                            s.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
    finally:
        for s in strangers + insiders:
            s.close(linger=0)
    return sent


async def test_fuzz_every_endpoint_keeps_it_serving_with_bounded_memory(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    procs = local_cluster_processes
    st = await Store.create(local_cluster, num_units=1, name="fuzz-store")
    meta = await st.put(TensorDict({"x": torch.arange(6)}, [6]), partition="p")
    counter = await local_cluster.spawn(Counter, node="node-0")
    agent_address = (await counter.env("RAYLESS_AGENT_ADDRESS"))["RAYLESS_AGENT_ADDRESS"]
    assert agent_address
    records = {a["name"]: a for n in await local_cluster.nodes() for a in n["actors"]}
    unit = st.units[0]
    assert procs.head is not None

    async def agent_status() -> Any:
        async with Client(agent_address, token=procs.token) as client:
            return await client.request(("status",), timeout=10)

    async def read_back() -> bool:
        return bool((await st.get(meta))["x"].tolist() == list(range(6)))

    endpoints: dict[str, tuple[str, int, Callable[[], Awaitable[Any]]]] = {
        "head": (procs.address, procs.head.pid, local_cluster.nodes),
        "agent": (agent_address, procs.agents[0].pid, agent_status),
        "actor": (counter.address, int(records[counter.name]["pid"]), lambda: counter.add(1)),
        "controller": (
            st.controller.address,
            int(records[st.controller.name]["pid"]),
            st.stats,
        ),
        "unit": (unit["handle"].address, int(records[unit["unit_id"]]["pid"]), read_back),
    }
    for seed, (what, (address, pid, check)) in enumerate(endpoints.items()):
        proc = psutil.Process(pid)
        assert await asyncio.wait_for(check(), 30), what
        rss_before = proc.memory_info().rss
        sent = await asyncio.to_thread(_blast, address, procs.token, 1500, seed)
        assert sent > 1000, (what, sent)
        await asyncio.sleep(0.2)
        assert proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE, f"{what} died"
        assert await asyncio.wait_for(check(), 30), f"{what} stopped serving"
        growth = proc.memory_info().rss - rss_before
        assert growth < 64 * 2**20, f"{what} RSS grew by {growth / 2**20:.1f} MiB"
    assert await counter.add(1) == 3  # one add per check of the actor: the state is intact


# -- authentication ------------------------------------------------------------------------


class _Recorder:
    """A handler that remembers whether anything ever reached it."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, req: Request) -> Any:
        self.calls.append(req.body)
        return req.body


async def test_wrong_token_and_another_clusters_token_are_rejected_counted_and_logged(
    caplog: pytest.LogCaptureFixture, local_cluster_processes: LocalProcesses
) -> None:
    token, other = new_token(), new_token()
    handler = _Recorder()
    caplog.set_level(logging.WARNING, logger="rayless.transport")
    async with Server(token=token, handler=handler, name="guarded") as srv:
        for wrong in (other, "x" * 16):
            with pytest.raises(AuthError):
                async with Client(srv.address, token=wrong, connect_timeout=5) as client:
                    await client.request("let me in", timeout=5)
        assert srv.stats["auth_failures"] == 2
        assert "wrong cluster token" in caplog.text and "guarded" in caplog.text
        assert handler.calls == [] and srv.peers == []
        async with Client(srv.address, token=token) as client:
            assert await client.request("ok", timeout=5) == "ok"
    # A real cluster's head refuses another cluster's token.
    with pytest.raises(AuthError):
        async with Client(local_cluster_processes.address, token=other, connect_timeout=5) as c:
            await c.request(("nodes",), timeout=5)


async def test_no_token_and_replayed_handshakes_reach_nothing() -> None:
    token = new_token()
    handler = _Recorder()
    async with Server(token=token, handler=handler) as srv:

        def attack() -> dict[str, Any]:
            out: dict[str, Any] = {}
            # no handshake at all: a request is refused
            s = _dealer(srv.address)
            s.send_multipart(envelope(Kind.REQUEST, 7, codec.encode("hi")))
            out["no_token"] = _reply(s)
            s.close(linger=0)
            # a legitimate handshake, recorded
            nonce_c = new_nonce()
            legit = _dealer(srv.address)
            legit.send_multipart(
                [pack_control(Kind.HELLO), msgpack.packb({"v": PROTOCOL, "nonce": nonce_c})]
            )
            challenge = msgpack.unpackb(open_envelope(legit.recv_multipart(), 0)[2][0])
            auth = [
                pack_control(Kind.AUTH),
                msgpack.packb({"proof": client_proof(token.encode(), challenge["nonce"], nonce_c)}),
            ]
            legit.send_multipart(auth)
            out["legit"] = _reply(legit)
            legit.close(linger=0)
            # replay: the same HELLO and the recorded AUTH from another connection
            r = _dealer(srv.address)
            r.send_multipart(
                [pack_control(Kind.HELLO), msgpack.packb({"v": PROTOCOL, "nonce": nonce_c})]
            )
            out["replay_challenge"] = _reply(r)
            r.send_multipart(auth)
            out["replay"] = _reply(r)
            r.send_multipart(envelope(Kind.REQUEST, 8, codec.encode("hi")))
            out["after_replay"] = _reply(r)
            r.close(linger=0)
            # the recorded AUTH alone
            a = _dealer(srv.address)
            a.send_multipart(auth)
            out["auth_alone"] = _reply(a)
            a.close(linger=0)
            return out

        out = await asyncio.to_thread(attack)
        assert out["no_token"][0] is Kind.REJECT
        assert out["no_token"][1]["code"] == RejectCode.NEED_HANDSHAKE
        assert out["legit"][0] is Kind.WELCOME
        assert out["replay_challenge"][0] is Kind.CHALLENGE
        assert out["replay"] == (
            Kind.REJECT,
            {"code": RejectCode.AUTH, "reason": out["replay"][1]["reason"]},
        )
        assert out["after_replay"][1]["code"] == RejectCode.NEED_HANDSHAKE
        assert out["auth_alone"][1]["code"] == RejectCode.NEED_HANDSHAKE
        assert handler.calls == []
        assert srv.stats["unauthenticated"] >= 2 and srv.stats["auth_failures"] == 1


class _Evil:
    """Unpickling this creates a file: proof that code ran in the receiver."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


async def test_no_code_execution_through_pickle_or_private_methods(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    counter = await local_cluster.spawn(Counter)
    marker = tmp_path / "pwned"
    token = local_cluster_processes.token
    async with Client(counter.address, token=token, allow_pickle=True) as client:
        with pytest.raises(ProtocolError, match="pickle"):
            await client.request(("c", "add", (_Evil(str(marker)),), {}), timeout=10)
        assert not marker.exists()
        for name in ("_private", "__init__", "__class__", "__reduce__", "setup", "teardown"):
            with pytest.raises(RemoteError, match="no public method"):
                await client.request(("c", name, (), {}), timeout=10)
        with pytest.raises(RaylessError, match="malformed call"):
            await client.request(("c", "add"), timeout=10)
    assert await counter.add(2) == 2
