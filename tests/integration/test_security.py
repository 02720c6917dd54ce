"""Hostile input and access: fuzz every endpoint of a cluster, authentication, pickle.

Builds on tests/integration/test_transport_fuzz.py (which fuzzes one echo server): here every
listening endpoint of a real cluster (head, node agent, actor, store controller, storage unit)
gets random and mutated messages before and after a real handshake. Limits, the
pre-handshake gate and CURVE are in tests/integration/test_security_limits.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
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
from rayless.actors.protocol.messages import AgentStatus, ListNodes, Spawn, SpawnSpec
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


def _dealer(
    address: str, timeout_ms: int = 5000, ctx: zmq.Context[Any] | None = None
) -> zmq.Socket[Any]:
    sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
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
    # a context of its own, used and ended in this thread only (libzmq aborted once in a
    # socket close here when the blast shared the process's global context)
    ctx: zmq.Context[Any] = zmq.Context()
    strangers = [_dealer(address, ctx=ctx) for _ in range(4)]
    insiders = [_dealer(address, ctx=ctx) for _ in range(2)]
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
        ctx.term()
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
            return await client.request(AgentStatus(), timeout=10)

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
            await c.request(ListNodes(), timeout=5)


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


# -- sessions are bound to their connection ------------------------------------------------

# A tokenless stranger (run as uid nobody, tests/integration/strangers.py) connects with a
# routing id of its choosing to each target and sends a ready-made request; it reports the
# kind and reject code of each answer (None: no answer within wait_ms).
_SPOOF = r"""
import struct, zmq
ctx = zmq.Context()
out = []
for target in ARGS["targets"]:
    frames = [bytes.fromhex(h) for h in target["frames"]]
    for rid in target["rids"]:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, bytes.fromhex(rid))
        s.setsockopt(zmq.RCVTIMEO, int(ARGS["wait_ms"]))
        s.connect(target["address"])
        s.send_multipart(frames)
        try:
            reply = s.recv_multipart()
            out.append([target["name"], [f.hex() for f in reply]])
        except zmq.Again:
            out.append([target["name"], None])
        s.close()
ctx.term()
RESULT = out
"""


def _request_frames(body: Any, req_id: int = 7) -> list[str]:
    return [bytes(f).hex() for f in envelope(Kind.REQUEST, req_id, codec.encode(body))]


def _unix_rids(n: int) -> list[str]:
    """The first ``n`` routing ids a process gives its same-host connections."""
    return [(b"\x01unix" + i.to_bytes(8, "little")).hex() for i in range(1, n + 1)]


async def _claim_as_stranger(address: str, rid: bytes) -> None:
    """A stranger sends a request with routing id ``rid``; it must be rejected."""
    from tests.integration.strangers import run_stranger

    targets = [
        {"name": "server", "address": address, "rids": [rid.hex()], "frames": _request_frames("x")}
    ]
    run = await asyncio.to_thread(run_stranger, _SPOOF, {"targets": targets, "wait_ms": 5000})
    _assert_all_rejected(run.result)


def _assert_all_rejected(found: list[list[Any]]) -> None:
    for name, reply in found:
        assert reply is not None, f"{name}: no answer to a spoofed routing id"
        kind, _, payload = open_envelope([bytes.fromhex(f) for f in reply], 0)
        assert kind is Kind.REJECT, f"{name}: a spoofed routing id got {kind!r}, not REJECT"
        code = msgpack.unpackb(bytes(payload[0]))["code"]
        assert code == RejectCode.NEED_HANDSHAKE, (name, code)


async def test_a_spoofed_same_host_routing_id_is_rejected_and_reaches_no_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:

    token = new_token()
    handler = _Recorder()
    async with (
        Server(token=token, handler=handler, name="bound") as srv,
        Client(srv.address, token=token) as client,
    ):
        assert client.via_unix  # the session runs on the same-host path
        assert await client.request("mine", timeout=10) == "mine"
        rid = srv.peers[0].routing_id
        await _claim_as_stranger(srv.address, rid)
        assert handler.calls == ["mine"], "a spoofed request reached the handler"
        assert srv.stats["unbound"] >= 1
        assert await client.request("still mine", timeout=10) == "still mine"


async def test_a_closed_sessions_routing_id_is_not_served_to_a_new_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ZeroMQ session whose connection closed without BYE: another connection that claims
    its routing id is a stranger (before, it was served as the session until it expired)."""

    monkeypatch.setenv("RAYLESS_UNIX", "0")
    token = new_token()
    handler = _Recorder()
    async with Server(token=token, handler=handler, name="bound") as srv:
        client = Client(
            srv.address, token=token, heartbeat_interval=3600.0, heartbeat_timeout=7200.0
        )
        await client.connect()
        assert not client.via_unix
        assert await client.request("mine", timeout=10) == "mine"
        rid = srv.peers[0].routing_id
        assert client._pump is not None
        client._pump.sock.close(linger=0)  # gone without a word (kill -9 of a process)
        client._pump = None
        await client.aclose()
        await _claim_as_stranger(srv.address, rid)
        assert handler.calls == ["mine"], "a request on another connection reached the handler"
        assert srv.peers == []


async def test_spoofed_routing_ids_reach_no_endpoint_of_a_cluster(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses, tmp_path: Path
) -> None:
    """The auditor's attack on every server of a cluster: a stranger claims the same-host
    path's routing ids and asks the head to start ``/bin/sh`` (and every other endpoint for
    something it serves). Each answer is REJECT; no file appears; every endpoint serves on."""
    from tests.integration.strangers import run_stranger

    procs = local_cluster_processes
    st = await Store.create(local_cluster, num_units=1, name="spoof-store")
    meta = await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    counter = await local_cluster.spawn(Counter, node="node-0")
    assert await counter.add(1) == 1
    agent_address = (await counter.env("RAYLESS_AGENT_ADDRESS"))["RAYLESS_AGENT_ADDRESS"]
    marker = tmp_path / "pwned"
    os.chmod(tmp_path, 0o777)
    spec = SpawnSpec(
        cls=("subprocess", "Popen", None),
        cls_name="Popen",
        init=tuple(bytes(f) for f in codec.encode(((["/bin/sh", "-c", f"id > {marker}"],), {}))),
        owner="x",
        cpus=0.0,
        cwd="/",
        timeout=30.0,
    )
    targets = [
        {"name": "head", "address": procs.address, "frames": _request_frames(Spawn(spec))},
        {"name": "agent", "address": agent_address, "frames": _request_frames(AgentStatus())},
        {"name": "actor", "address": counter.address, "frames": _request_frames(("add", 100))},
        {
            "name": "controller",
            "address": st.controller.address,
            "frames": _request_frames(("stats",)),
        },
        {
            "name": "unit",
            "address": st.units[0]["handle"].address,
            "frames": _request_frames(("stats",)),
        },
    ]
    for t in targets:
        t["rids"] = _unix_rids(12)
    run = await asyncio.to_thread(run_stranger, _SPOOF, {"targets": targets, "wait_ms": 5000})
    _assert_all_rejected(run.result)
    await asyncio.sleep(1.5)  # the auditor's file appeared 1.3 s after the spawn request
    assert not marker.exists(), "a stranger ran a command on the head's machine"
    assert await counter.add(1) == 2, "a spoofed call reached the actor"
    assert (await st.get(meta))["x"].tolist() == [0, 1, 2, 3]
    assert len(await local_cluster.nodes()) >= 1


# A stranger sends one BATCH frame of many empty entries without a handshake, ``tries``
# times on new connections.
_BATCH_FLOOD = r"""
import struct, zmq
ctx = zmq.Context()
control = struct.Struct(ARGS["control"])
entries = int(ARGS["entries"])
frame = control.pack(1, 32, 0, entries) + b"\0\0\0\0" * entries
for _ in range(int(ARGS["tries"])):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 2000)
    s.connect(ARGS["address"])
    s.send(frame)
    s.close()
ctx.term()
RESULT = len(frame)
"""


async def test_a_strangers_batch_is_never_split_or_parsed() -> None:
    from rayless.transport.protocol import CONTROL
    from tests.integration.strangers import run_stranger

    token = new_token()
    handler = _Recorder()
    async with Server(token=token, handler=handler, name="batched") as srv:
        # 3 MiB (the gate cuts the connection past 64 KiB, but ZeroMQ may have the whole
        # message by then), and just under the pre-auth bound (the gate lets it in whole)
        for entries in (786_432, 15_000):
            args = {
                "address": srv.address,
                "entries": entries,
                "tries": 4,
                "control": CONTROL.format,
            }
            run = await asyncio.to_thread(run_stranger, _BATCH_FLOOD, args)
            assert run.result > entries * 4
        async with Client(srv.address, token=token) as client:
            assert await client.request("after", timeout=10) == "after"
        await asyncio.sleep(0.5)  # let whatever got in be processed
        async with Client(srv.address, token=token) as client:
            assert await client.request("later", timeout=10) == "later"
        # each try's batch is at most one dropped message, never 786,432 of them
        assert srv.stats["dropped"] <= 8, srv.stats
        assert handler.calls == ["after", "later"]


async def test_port_probes_do_not_cut_a_peer_in_the_middle_of_its_handshake() -> None:
    # A TCP probe connects and closes at once (a health check, a launcher waiting for the
    # port): libzmq has closed its descriptor by the time the gate reads its accept. That
    # once counted as "out of descriptors", and each one shut the oldest waiting stranger,
    # which may be a legitimate peer between its HELLO and its AUTH.
    import socket

    token = new_token()
    async with Server(token=token, handler=_Recorder(), address="tcp://127.0.0.1:0") as srv:
        host, port = srv.address.removeprefix("tcp://").rsplit(":", 1)

        def peer_with_probes_between() -> tuple[Kind, Any]:
            nonce_c = new_nonce()
            peer = _dealer(srv.address)
            try:
                peer.send_multipart(
                    [pack_control(Kind.HELLO), msgpack.packb({"v": PROTOCOL, "nonce": nonce_c})]
                )
                challenge = msgpack.unpackb(open_envelope(peer.recv_multipart(), 0)[2][0])
                for _ in range(200):
                    socket.create_connection((host, int(port)), timeout=5).close()
                proof = client_proof(token.encode(), challenge["nonce"], nonce_c)
                peer.send_multipart([pack_control(Kind.AUTH), msgpack.packb({"proof": proof})])
                return _reply(peer)
            finally:
                peer.close(linger=0)

        kind, _ = await asyncio.to_thread(peer_with_probes_between)
        assert kind is Kind.WELCOME
        assert srv.stats["out_of_fds"] == 0 and srv.stats["pending_handshakes"] == 0
