"""Messages of many buffers (a state dict of thousands of tensors) on both paths, and a send
that fails under a connection: the call fails at once with a typed error, the next one works.

One ``sendmsg`` takes at most IOV_MAX (1,024) buffers; a message of 1,023 tensors is 1,024
frames plus its framing header, so these sizes sit on both sides of that bound.
"""

from __future__ import annotations

import asyncio
import errno
import math
from typing import Any

import pytest
import torch

from rayless.actors import Actor, Cluster
from rayless.store import Store
from rayless.transport.client import Client
from rayless.transport.errors import BrokenError
from rayless.transport.protocol import new_token
from rayless.transport.server import Request, Server
from rayless.weights import WeightSync

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
TOKEN = new_token()
COUNTS = [1, 1023, 1024, pytest.param(10_000, marks=pytest.mark.slow)]


def state_dict(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``n`` tensors of mixed sizes and dtypes: mostly tiny, some 16 KiB, a few 1 MiB."""
    out: dict[str, torch.Tensor] = {}
    for i in range(n):
        if i % 997 == 5:
            t = torch.arange(1 << 18, dtype=torch.float32) + seed  # 1 MiB
        elif i % 37 == 1:
            t = torch.full((4096,), float(i + seed), dtype=torch.float32)  # 16 KiB
        elif i % 3 == 0:
            t = torch.full((3,), i + seed, dtype=torch.int64)
        else:
            t = torch.full((2, 2), float(i + seed), dtype=torch.bfloat16)
        out[f"layers.{i}.w"] = t
    return out


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    for key, t in a.items():
        assert b[key].dtype == t.dtype and torch.equal(b[key], t), key


class Echo(Actor):
    """Echoes values; makes state dicts of its own."""

    def echo(self, x: Any) -> Any:
        return x

    def make(self, n: int, seed: int) -> dict[str, torch.Tensor]:
        return state_dict(n, seed)

    def ping(self) -> str:
        return "pong"


# -- the transport alone, on each path ------------------------------------------------------


@pytest.mark.parametrize("unix", ["1", "0"], ids=["unix", "zeromq"])
@pytest.mark.parametrize("n", COUNTS)
async def test_a_message_of_n_tensors_round_trips(
    n: int, unix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYLESS_UNIX", unix)
    sd = state_dict(n)
    async with (
        Server(token=TOKEN, handler=lambda r: r.body) as srv,
        Client(srv.address, token=TOKEN) as c,
    ):
        assert c.via_unix is (unix == "1")
        back = await asyncio.wait_for(c.request(sd), 60)
        assert_equal(sd, back)
        assert await c.request("after") == "after"  # the connection still serves


class _FailingSock:
    """A socket whose next ``sendmsg`` fails with ``err`` (then it is the socket again)."""

    def __init__(self, sock: Any, err: int) -> None:
        self._sock, self._err, self.failed = sock, err, 0

    def sendmsg(self, bufs: Any, *args: Any) -> int:
        if not self.failed:
            self.failed += 1
            raise OSError(self._err, "forced")
        return int(self._sock.sendmsg(bufs, *args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


async def test_a_failed_send_of_the_caller_fails_its_call_at_once_and_the_next_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAYLESS_UNIX", "1")
    # an actor's caller: no heartbeat can notice anything, only the failure itself
    async with (
        Server(token=TOKEN, handler=lambda r: r.body) as srv,
        Client(srv.address, token=TOKEN, heartbeat_timeout=math.inf) as c,
    ):
        assert c.via_unix and await c.request(1) == 1
        pump: Any = c._pump
        pump.sock = _FailingSock(pump.sock, errno.ENOBUFS)
        with pytest.raises(BrokenError, match="send failed"):
            await asyncio.wait_for(c.request("lost"), 30)
        assert await asyncio.wait_for(c.request(2), 30) == 2  # reconnected


async def test_a_failed_send_of_the_server_fails_the_call_at_once_and_the_next_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAYLESS_UNIX", "1")

    def handler(req: Request) -> Any:
        if req.body == "break my reply":
            assert srv._unix is not None
            (conn,) = srv._unix.conns.values()
            conn.sock = _FailingSock(conn.sock, errno.EMSGSIZE)  # type: ignore[assignment]
        return req.body

    async with (
        Server(token=TOKEN, handler=handler) as srv,
        Client(srv.address, token=TOKEN, heartbeat_timeout=math.inf) as c,
    ):
        assert c.via_unix and await c.request(1) == 1
        with pytest.raises(BrokenError, match="connection lost"):
            await asyncio.wait_for(c.request("break my reply"), 30)
        assert await asyncio.wait_for(c.request(3), 30) == 3


# -- actors, the store and weight sync on a real cluster ----------------------------------


@pytest.mark.local_cluster(nodes=1, gpus_per_node=0)
@pytest.mark.parametrize(
    ("unix", "counts"),
    [
        ("1", [1, 1023, 1024]),
        ("0", [1024]),
        pytest.param("1", [10_000], marks=pytest.mark.slow),
        pytest.param("0", [1, 1023, 10_000], marks=pytest.mark.slow),
    ],
    ids=["unix", "zeromq", "unix-10000", "zeromq-more"],
)
async def test_actor_calls_with_state_dicts_of_many_tensors_both_ways(
    local_cluster: Cluster, unix: str, counts: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the caller picks the path when it first connects to an actor: a fresh actor each time
    monkeypatch.setenv("RAYLESS_UNIX", unix)
    h = await local_cluster.spawn(Echo)
    try:
        for n in counts:
            sd = state_dict(n, seed=n)
            assert_equal(sd, await h.echo.options(timeout=60)(sd))  # argument and result
            assert_equal(state_dict(n, 7), await h.make.options(timeout=60)(n, 7))  # result
            assert await h.ping.options(timeout=30)() == "pong"
    finally:
        await local_cluster.kill(h)


@pytest.mark.local_cluster(nodes=1, gpus_per_node=0)
@pytest.mark.parametrize("n", [1100, pytest.param(10_000, marks=pytest.mark.slow)])
async def test_store_and_weight_sync_carry_thousands_of_tensors(
    local_cluster: Cluster, n: int
) -> None:
    from tensordict import TensorDict

    st = await Store.create(local_cluster, num_units=1)
    try:
        fields = {f"f{i}": torch.full((4, 2), float(i)) for i in range(min(n, 1100))}
        td = TensorDict(fields, batch_size=[4])
        meta = await st.put(td, "p")
        got = await st.get(meta)
        for key, value in fields.items():
            assert torch.equal(got[key], value), key
    finally:
        await st.aclose()
    sd = state_dict(n, seed=3)
    name = f"many-{n}"
    async with WeightSync.create(local_cluster, name=name) as ws:
        sub = await local_cluster.spawn(_Puller, name, n)
        try:
            await ws.publish(sd, version=1)
            assert await sub.pull_and_check.options(timeout=120)(1, 3) == n
        finally:
            await local_cluster.kill(sub)


class _Puller(Actor):
    """Pulls a published state dict into tensors of its own and checks it."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.tensors = name, state_dict(n, seed=-1)

    async def pull_and_check(self, version: int, seed: int) -> int:
        async with await WeightSync.connect(self.name) as ws:
            await ws.pull(self.tensors, version, timeout=60)
        assert_equal(state_dict(len(self.tensors), seed), self.tensors)
        return len(self.tensors)
