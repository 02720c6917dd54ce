"""``actors.core.callstats``: the queue probe counts every concurrency group's calls."""

from __future__ import annotations

import collections
from types import SimpleNamespace

from rayless.actors.core.callstats import CallStats


def _worker(waiting: int, running: int) -> SimpleNamespace:
    return SimpleNamespace(_waiting=collections.deque(range(waiting)), running=running)


def _semaphore(waiters: int) -> SimpleNamespace:
    return SimpleNamespace(_waiters=collections.deque(range(waiters)))


def test_queues_count_the_default_group_and_every_concurrency_group() -> None:
    """A call waiting in a concurrency group (its threads, or its async limit) is queued too;
    the probe read the default group's alone."""
    host = SimpleNamespace(
        worker=_worker(2, 1),
        semaphore=_semaphore(1),
        groups={"io": (_semaphore(3), _worker(4, 1)), "release": (_semaphore(0), _worker(0, 2))},
        monitor=SimpleNamespace(running={1: ("m", 0.0)}),
    )
    stats = CallStats()
    assert stats.queues() == {"queued": 0, "running": 0}
    stats.watch(host)
    assert stats.queues() == {"queued": 2 + 1 + 3 + 4, "running": 1 + 1 + 2 + 1}
    host.groups = {}
    assert stats.queues() == {"queued": 3, "running": 2}
