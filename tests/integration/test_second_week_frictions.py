"""A Ray user's second week, continued: the frictions of a longer trial, on real processes.

Each test is one defect a Ray user hit, with what Ray does: ``max_concurrency`` holds while
timed-out ``def`` calls still run; a driver killed by SIGTERM, SIGHUP or SIGKILL leaves no
process and no published file behind; ...
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from rayless.actors import Cluster
from rayless.errors import Timeout
from tests.integration.week2_classes import Slow

pytestmark = pytest.mark.integration


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll the async ``pred`` until it is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_timed_out_def_calls_keep_their_slots_until_they_return(
    local_cluster: Cluster,
) -> None:
    h = await local_cluster.spawn(Slow, max_concurrency=2)
    work = h.work.options(timeout=0.2)
    for _ in range(4):
        with pytest.raises(Timeout, match="def method cannot be cancelled"):
            await work(2.0)

    async def idle() -> bool:
        counts = await h.counts()
        return counts["now"] == 0 and counts["finished"] >= 2

    await wait_until(idle, timeout=60, what="the two started calls to return")
    counts = await h.counts()
    # Ray: two at a time (here, before: all four ran at once); the two that timed out while
    # queued were dropped without running
    assert counts["peak"] == 2 and counts["finished"] == 2
    assert await h.work(0.0) == "done"
