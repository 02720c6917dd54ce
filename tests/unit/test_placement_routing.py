"""Routers: min-load, node affinity, their sync-mode forms, probes and create_router."""

from __future__ import annotations

import heapq
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
from rayless.placement.errors import PlacementError
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


async def test_sync_simple_router_waits_without_spinning() -> None:
    pols = [FakePolicy("a"), FakePolicy("b")]
    r = SyncSimpleRouter(pols, probe_timeout=0.05, timeout=0.3)
    assert await r.select_policy() is pols[0]
    assert await r.select_policy() is pols[1]
    pols[0].idle = pols[1].idle = False
    with pytest.raises(Timeout):
        await r.select_policy()
    assert 2 <= pols[0].idle_probes <= 40  # back-off, not a busy loop
    pols[1].idle = True
    with anyio.fail_after(2):
        assert await r.select_policy() is pols[1]
    r.release(pols[0])
    assert await r.select_policy() is pols[0]


async def test_sync_simple_router_hanging_probe_counts_busy() -> None:
    pols = [FakePolicy("a", hang=True), FakePolicy("b")]
    r = SyncSimpleRouter(pols, probe_timeout=0.02)
    await r.select_policy()
    await r.select_policy()
    pols[1].idle = True
    with anyio.fail_after(2):
        assert await r.select_policy() is pols[1]


async def test_sync_node_affinity_round_robin_and_fallback() -> None:
    pols: list[Any] = ["p0", "p1", "p2"]
    r = SyncNodeAffinityRouter(pols, DIST)
    assert r.num_nodes == 2 and r.env_worker_num == 5
    assert [await r.select_policy(e) for e in ["env-0", "env-1", "env-0", "env-3"]] == [
        "p0",
        "p1",
        "p0",
        "p2",
    ]
    assert [r.select_policy_nowait(e) for e in ["env-4", "x", "env-4", "env-4"]] == [
        "p0",
        "p1",
        "p2",
        "p0",
    ]
    with pytest.raises(PlacementError, match="node c"):
        SyncNodeAffinityRouter(pols, DIST, strict=True)
    with pytest.raises(PlacementError, match="do not index"):
        SyncNodeAffinityRouter(pols[:2], DIST)


def test_create_router() -> None:
    pols = [FakePolicy("a"), FakePolicy("a"), FakePolicy("b")]

    class Manager:
        def get_component_distribution(self) -> Any:
            return DIST

    assert isinstance(create_router("async", "simple", pols), SimpleRouter)
    assert isinstance(create_router("sync", "simple", pols), SyncSimpleRouter)
    assert isinstance(
        create_router("sync", "node_affinity", pols, Manager()), SyncNodeAffinityRouter
    )
    na = create_router("async", "node_affinity", pols, component_distribution=DIST)
    assert isinstance(na, NodeAffinityRouter) and na.target_node("env-3") == "b"
    for args in [("batch", "simple"), ("sync", "fancy")]:
        with pytest.raises(ValueError, match="Invalid"):
            create_router(*args, pols)
    with pytest.raises(ValueError, match="component_distribution"):
        create_router("sync", "node_affinity", pols)
