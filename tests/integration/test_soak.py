"""Start/stop cycles of a local cluster leak nothing (scripts/soak.py runs 200 of them)."""

from __future__ import annotations

import pytest

from tests.chaos.scenarios import Snapshot, descendants, growth, start_stop_cycle, until

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]

CYCLES = 2  # after the warm-up: a per-cycle leak shows as growth of 2; scripts/soak.py runs 200


async def test_start_stop_cycles_leak_no_process_fd_thread_or_shm_segment() -> None:
    # clusters shared by other tests of the session may be running: only new ones count
    baseline = descendants()

    def ours() -> set[int]:
        return descendants() - baseline

    seen: set[int] = set()  # the cycles' processes: only their shm segments count
    await start_stop_cycle(seen=seen)  # warm-up: ZeroMQ's context and I/O threads, imports
    assert await until(lambda: not ours(), 20), ours()
    first = Snapshot.take(seen)
    snapshots = [first]
    for _ in range(CYCLES):
        await start_stop_cycle(seen=seen)
        assert await until(lambda: not ours(), 20), f"left behind: {ours()}"
        snapshots.append(Snapshot.take(seen))
    grew = growth(first, snapshots[-1])
    assert grew["children"] == 0, snapshots
    assert grew["fds"] <= 0, snapshots
    assert grew["threads"] <= 0, snapshots
    assert grew["shm_files"] <= 0, snapshots
    assert grew["rss_mb"] < 64, snapshots  # generous: allocator noise, not a leak
