"""Routers: min-load, node affinity, their sync-mode forms, probes and create_router."""

from __future__ import annotations

import heapq
import inspect
import threading
import time
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayless.placement import (
    NodeAffinityRouter,
    Policy,
    SimpleRouter,
    SyncNodeAffinityRouter,
    SyncSimpleRouter,
    create_router,
    env_worker_index,
    probe_loads,
)
from rayless.placement.errors import NodeAffinityError, PlacementError
from rayless.transport.errors import Timeout


class FakePolicy:
    """Exposes what the routers need: node_id, async check_idle and num_requests."""

    def __init__(self, node_id: str, load: int = 0, idle: bool = True, hang: bool = False) -> None:
        self.node_id, self.load, self.idle, self.hang = node_id, load, idle, hang
        self.idle_probes = 0

    async def check_idle(self) -> bool:
        self.idle_probes += 1
        if self.hang:
            await anyio.sleep(10)
        return self.idle

    async def num_requests(self) -> int:
        if self.hang:
            await anyio.sleep(10)
        return self.load


def reference_heap(loads: list[int], n: int) -> list[int]:
    heap = [(v, i) for i, v in enumerate(loads)]
    heapq.heapify(heap)
    out = []
    for _ in range(n):
        load, idx = heapq.heappop(heap)
        out.append(idx)
        heapq.heappush(heap, (load + 1, idx))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=20), st.integers(0, 600))
def test_simple_router_matches_reference_heap(loads: list[int], n: int) -> None:
    before = list(loads)
    assert SimpleRouter().assign(loads, n) == reference_heap(loads, n)
    assert loads == before


def test_simple_router_errors() -> None:
    with pytest.raises(ValueError, match="No policies"):
        SimpleRouter().assign([], 1)
    with pytest.raises(ValueError):
        SimpleRouter().assign([0], -1)


def test_env_id_rule() -> None:
    assert env_worker_index("env-3") == 3
    assert env_worker_index("walker-2-17") == 17
    for bad in ["cartpole", "env-x", "env-", "env-+3", "env-٣", 5, None]:
        assert env_worker_index(bad) is None


DIST = {
    "a": {"env": {"count": 2, "ids": [0, 1]}, "eval": {"count": 2, "ids": [0, 1]}},
    "b": {"env": {"count": 2, "ids": [2, 3]}, "eval": {"count": 1, "ids": [2]}},
    "c": {"env": {"count": 1, "ids": [4]}},
}


def test_node_affinity_router_prefers_node_and_does_not_mutate() -> None:
    r = NodeAffinityRouter(DIST, ["a", "a", "b"])
    loads = [5, 0, 0]
    got = r.assign(loads, 0, ["env-0", "env-1", "env-2", "env-2", "env-4", "weird"])
    assert loads == [5, 0, 0]
    # env-0/1 → node a (idx 1 least loaded, then 1 again: 1 < 5); env-2 → b (2);
    # env-4 on c (no policy) and "weird" → global least loaded
    assert got == [1, 1, 2, 2, 1, 2]
    assert r.assign([1, 0, 0], 3) == [1, 2, 0]
    with pytest.raises(ValueError):
        r.assign([0, 0], 1, ["env-0"])


async def test_route_probes_loads_with_timeout() -> None:
    pols = [FakePolicy("a", 3), FakePolicy("a", hang=True), FakePolicy("b", 1)]
    with anyio.fail_after(2):
        assert await probe_loads(pols, probe_timeout=0.05) == [3, 1 << 40, 1]
        assert await SimpleRouter().route(pols, 3, probe_timeout=0.05) == [2, 2, 0]
    assert isinstance(pols[0], Policy)
    r = NodeAffinityRouter.from_policies(DIST, pols)
    assert await r.route(pols, 0, ["env-0"], probe_timeout=0.05) == [0]


def test_sync_simple_router_is_plain_and_waits_without_spinning() -> None:
    pols = [FakePolicy("a"), FakePolicy("b")]
    r = SyncSimpleRouter(pols, probe_timeout=0.05, timeout=0.3)
    assert r.select_policy() is pols[0]  # a plain call, as the reference's rollout threads do
    assert r.select_policy() is pols[1]
    pols[0].idle = pols[1].idle = False
    with pytest.raises(Timeout):
        r.select_policy()
    assert 2 <= pols[0].idle_probes <= 40  # back-off, not a busy loop
    pols[1].idle = True
    assert r.select_policy() is pols[1]
    r.release(pols[0])
    assert r.select_policy() is pols[0]


def test_sync_simple_router_hanging_probe_counts_busy() -> None:
    pols = [FakePolicy("a", hang=True), FakePolicy("b")]
    r = SyncSimpleRouter(pols, probe_timeout=0.02)
    r.select_policy()
    r.select_policy()
    pols[1].idle = True
    t0 = time.monotonic()
    assert r.select_policy() is pols[1]
    assert time.monotonic() - t0 < 2


async def test_sync_simple_router_async_form() -> None:
    pols = [FakePolicy("a"), FakePolicy("b")]
    r = SyncSimpleRouter(pols, probe_timeout=0.02, timeout=0.2)
    assert await r.aselect_policy() is pols[0]
    assert await r.aselect_policy("env-1") is pols[1]
    pols[0].idle = False
    with anyio.fail_after(2):
        assert await r.aselect_policy() is pols[1]
    with pytest.raises(RuntimeError, match="aselect_policy"):
        r.select_policy()  # would block this loop's thread


def test_sync_simple_router_plain_probe_and_local_policies() -> None:
    calls: list[int] = []

    def probe(policies: Any) -> list[bool]:
        calls.append(len(policies))
        return [True] * len(policies)

    r = SyncSimpleRouter(["x", "y"], probe=probe)
    assert [r.select_policy() for _ in range(5)] == ["x", "y", "x", "y", "x"]
    assert calls and all(n == 2 for n in calls)
    local = SyncSimpleRouter(["p", "q"])  # no check_idle: always idle (the reference's local)
    assert [local.select_policy() for _ in range(3)] == ["p", "q", "p"]


def test_sync_simple_router_from_8_threads() -> None:
    pols = [FakePolicy(f"n{i}") for i in range(3)]
    r = SyncSimpleRouter(pols, probe_timeout=0.05, timeout=5)
    got: list[Any] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(50):
            p = r.select_policy()
            with lock:
                got.append(p)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 400 and {id(p) for p in got} == {id(p) for p in pols}


def test_sync_node_affinity_round_robin_and_fallback() -> None:
    pols: list[Any] = ["p0", "p1", "p2"]
    with pytest.raises(NodeAffinityError, match="node c"):
        SyncNodeAffinityRouter(pols, DIST)  # the reference's assert: env node without eval
    with pytest.raises(ValueError):  # ... which ported code may catch as ValueError
        SyncNodeAffinityRouter(pols, DIST)
    r = SyncNodeAffinityRouter(pols, DIST, strict=False)
    assert r.num_nodes == 2 and r.env_worker_num == 5
    assert [r.select_policy(e) for e in ["env-0", "env-1", "env-0", "env-3"]] == [
        "p0",
        "p1",
        "p0",
        "p2",
    ]
    assert [r.select_policy(e) for e in ["env-4", "x", "env-4", "env-4"]] == [
        "p0",
        "p1",
        "p2",
        "p0",
    ]
    with pytest.raises(PlacementError, match="do not index"):
        SyncNodeAffinityRouter(pols[:2], DIST, strict=False)


async def test_sync_node_affinity_async_form() -> None:
    dist = {k: v for k, v in DIST.items() if k != "c"}
    r = SyncNodeAffinityRouter(["p0", "p1", "p2"], dist)
    assert [await r.aselect_policy(e) for e in ["env-2", "env-3", "env-0"]] == ["p2", "p2", "p0"]


def test_sync_node_affinity_from_8_threads() -> None:
    """Per node, the picks are a round-robin whatever the threads' interleaving."""
    dist = {
        "a": {"env": {"ids": [0, 1, 2, 3]}, "eval": {"ids": [0, 1]}},
        "b": {"env": {"ids": [4, 5, 6, 7]}, "eval": {"ids": [2, 3, 4]}},
    }
    pols = [f"p{i}" for i in range(5)]
    r = SyncNodeAffinityRouter(pols, dist)
    got: dict[int, list[str]] = {i: [] for i in range(8)}
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(300):
            got[i].append(r.select_policy(f"env-{i}"))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    on_a = [p for i in range(4) for p in got[i]]
    on_b = [p for i in range(4, 8) for p in got[i]]
    assert set(on_a) == {"p0", "p1"} and set(on_b) == {"p2", "p3", "p4"}
    assert on_a.count("p0") == on_a.count("p1") == 600  # exactly even: no pick lost or doubled
    assert on_b.count("p2") == on_b.count("p3") == on_b.count("p4") == 400


def test_create_router() -> None:
    pols = [FakePolicy("a"), FakePolicy("a"), FakePolicy("b")]

    class Manager:
        def get_component_distribution(self) -> Any:
            return DIST

    assert isinstance(create_router("async", "simple", pols), SimpleRouter)
    assert isinstance(create_router("sync", "simple", pols), SyncSimpleRouter)
    with pytest.raises(NodeAffinityError):
        create_router("sync", "node_affinity", pols, Manager())
    sna = create_router("sync", "node_affinity", pols, Manager(), strict=False)
    assert isinstance(sna, SyncNodeAffinityRouter)
    assert not inspect.iscoroutinefunction(sna.select_policy)
    assert not inspect.iscoroutinefunction(SyncSimpleRouter.select_policy)
    na = create_router("async", "node_affinity", pols, component_distribution=DIST)
    assert isinstance(na, NodeAffinityRouter) and na.target_node("env-3") == "b"
    for args in [("batch", "simple"), ("sync", "fancy")]:
        with pytest.raises(ValueError, match="Invalid"):
            create_router(*args, pols)
    with pytest.raises(ValueError, match="component_distribution"):
        create_router("sync", "node_affinity", pols)
