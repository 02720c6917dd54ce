"""Machine-independent budgets of an actor call: socket sends and cross-thread wake-ups per
call, counted on both sides (``transport.counters``) while a real local cluster serves N calls
to a ``def`` and an ``async def`` method, one at a time and pipelined. The budgets are the
ones docs/performance.md states ("Call budgets"); no timing is asserted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rayless.actors import Cluster
from rayless.transport.counters import COUNTERS
from tests.integration.budget_classes import Pinger

pytestmark = pytest.mark.integration

N_PIPELINED = 2000
WINDOW = 200
N_SYNC = 300

# per call, pipelined (WINDOW in flight); docs/performance.md, "Call budgets"
PIPELINED = {
    "actor.loop_wakeups": 0.1,  # def: worker thread -> loop
    "actor.thread_handoffs": 0.1,  # def: loop -> worker thread
    "actor.socket_sends": 0.1,  # replies
    "actor.socket_reads": 0.1,  # requests
    "driver.socket_sends": 0.1,
    "driver.socket_reads": 0.1,
}
# per call, one call in flight: each message is its own send and wake-up, one hand-off each way
SYNC = {
    "actor.loop_wakeups": 1.05,
    "actor.thread_handoffs": 1.05,
    "actor.socket_sends": 1.05,
    "actor.socket_reads": 1.05,
    "driver.socket_sends": 1.05,
    "driver.socket_reads": 1.05,
}
THREAD_KEYS = ("actor.loop_wakeups", "actor.thread_handoffs")


async def _pipelined(call: Callable[[], Awaitable[Any]], n: int, window: int) -> None:
    """``n`` calls, ``window`` in flight (windows issued back to back, as the benchmark)."""
    for start in range(0, n, window):
        results = await asyncio.gather(*[call() for _ in range(min(window, n - start))])
        assert set(results) == {1}


async def _one_by_one(call: Callable[[], Awaitable[Any]], n: int) -> None:
    for _ in range(n):
        assert await call() == 1


async def _per_call(actor: Any, run: Callable[[], Awaitable[None]], n: int) -> dict[str, float]:
    """Counts per call on both sides while ``run()`` makes ``n`` calls."""
    before_actor, before_driver = await actor.counters(), COUNTERS.snapshot()
    await run()
    after_actor, after_driver = await actor.counters(), COUNTERS.snapshot()
    per: dict[str, float] = {}
    for side, (a, b) in {
        "actor": (before_actor, after_actor),
        "driver": (before_driver, after_driver),
    }.items():
        for key in a:
            per[f"{side}.{key}"] = (b[key] - a[key]) / n
    return per


def _over(per: dict[str, float], budget: dict[str, float]) -> dict[str, str]:
    return {k: f"{per[k]:.3f} > {limit}" for k, limit in budget.items() if per[k] > limit}


async def _spawned(cluster: Cluster) -> Any:
    actor = await cluster.spawn(Pinger, cpus=0)
    await _pipelined(actor.ping, 2 * WINDOW, WINDOW)  # connected, threads started, warm
    await _pipelined(actor.aping, 2 * WINDOW, WINDOW)
    return actor


async def test_pipelined_def_calls_batch_their_hand_offs_and_sends(local_cluster: Cluster) -> None:
    actor = await _spawned(local_cluster)
    per = await _per_call(actor, lambda: _pipelined(actor.ping, N_PIPELINED, WINDOW), N_PIPELINED)
    assert per["actor.def_calls"] >= 1.0, per  # they ran on the worker thread
    assert not _over(per, PIPELINED), (_over(per, PIPELINED), per)


async def test_pipelined_async_def_calls_batch_their_sends(local_cluster: Cluster) -> None:
    actor = await _spawned(local_cluster)
    per = await _per_call(actor, lambda: _pipelined(actor.aping, N_PIPELINED, WINDOW), N_PIPELINED)
    assert per["actor.def_calls"] == 0 and per["actor.thread_handoffs"] == 0, per
    assert not _over(per, PIPELINED), (_over(per, PIPELINED), per)


async def test_one_call_at_a_time_costs_one_message_and_one_hand_off_each_way(
    local_cluster: Cluster,
) -> None:
    actor = await _spawned(local_cluster)
    per = await _per_call(actor, lambda: _one_by_one(actor.ping, N_SYNC), N_SYNC)
    assert not _over(per, SYNC), (_over(per, SYNC), per)
    per = await _per_call(actor, lambda: _one_by_one(actor.aping, N_SYNC), N_SYNC)
    budget = {k: v for k, v in SYNC.items() if k not in THREAD_KEYS}
    assert per["actor.loop_wakeups"] == 0 and per["actor.thread_handoffs"] == 0, per
    assert not _over(per, budget), (_over(per, budget), per)
