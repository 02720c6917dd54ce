"""Store.create returns before its units serve: the first operation waits for them, a failed
start surfaces at the first operation (or at close), closing while they start leaves nothing,
and a client connecting meanwhile gets the whole unit table.

The units are held at their spawn by stopping the torch fork template (SIGSTOP: their fork
requests wait in its socket) until the test lets them go (SIGCONT), so every "still starting"
below is a state, not a race.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.errors import NameTakenError
from rayless.actors.launch.local import LocalProcesses
from rayless.placement.errors import PlacementError
from rayless.store import Store, StoreError, StoreTimeoutError, SyncStore
from rayless.store.client.loader import StreamingLoader
from rayless.transport.errors import ClosedError
from rayless.transport.shm import pid_alive
from tests.integration.actor_classes import Counter
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@contextlib.contextmanager
def held_units(procs: LocalProcesses) -> Iterator[None]:
    """The torch fork template stopped (no unit can start) until the block ends."""
    assert procs.zygote_proc is not None
    pid = procs.zygote_proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def _actors(cluster: Cluster, prefix: str) -> dict[str, int]:
    """The live actors whose name starts with ``prefix``: name -> pid."""
    names = {a["name"]: a.get("pid") for n in await cluster.nodes() for a in n["actors"]}
    return {k: int(v or 0) for k, v in names.items() if k.startswith(prefix)}


async def test_create_returns_before_the_units_serve_and_the_first_put_waits(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    td = TensorDict({"x": torch.arange(6)}, [6])
    with held_units(local_cluster_processes):
        st = await Store.create(local_cluster, num_units=2, name="start-early")
        stats = await st.controller.stats()  # the controller serves; no unit registered yet
        assert stats.units_starting and stats.units == []
        with pytest.raises(StoreError, match="still starting"):
            st.units  # noqa: B018
        with pytest.raises(StoreTimeoutError, match="did not serve"):
            await st.put(td, partition="p", timeout=0.2)  # its own timeout bounds the wait
        with pytest.raises(StoreTimeoutError):
            await st.ready(0.1)
        loader = StreamingLoader(st, "p", ["x"], batch_size=2, task="t", timeout=0.2)
        with pytest.raises(StoreTimeoutError, match="did not serve"):
            await loader.fetch(0)
        first = asyncio.ensure_future(st.put(td, partition="p"))
        await asyncio.sleep(0)
        assert not first.done()
    meta = await first  # it waited for the units, then wrote
    assert (await st.get(meta))["x"].tolist() == list(range(6))
    assert len(st.units) == 2 and all(u["handle"] is not None and u["alive"] for u in st.units)
    stats = await st.controller.stats()
    assert not stats.units_starting and len(stats.units) == 2
    await st.aclose()


async def test_connect_while_the_units_start_gets_the_whole_table(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    with held_units(local_cluster_processes):
        st = await Store.create(local_cluster, num_units=2, name="start-connect")
        with pytest.raises(StoreTimeoutError, match="still starting"):
            await st.controller.units(0.1)  # never a partial table: a deadline instead
        joining = asyncio.ensure_future(Store.connect("start-connect", local_cluster))
        await wait_until(
            lambda: _waiters(st), timeout=30, what="connect() waiting in the controller's units()"
        )
        assert not joining.done()
    other = await joining
    assert len(other.units) == 2
    assert all(u["handle"] is not None and u["alive"] for u in other.units)
    meta = await other.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    assert (await st.get(meta))["x"].tolist() == [0, 1, 2, 3]
    await other.aclose()
    await st.aclose()


async def _waiters(st: Store) -> bool:
    return int((await st.controller.stats()).units_waiters) == 1


async def test_closing_while_the_units_start_kills_them_all(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    with held_units(local_cluster_processes):
        st = await Store.create(local_cluster, num_units=2, name="start-close")
        assert set(await _actors(local_cluster, "start-close")) == {"start-close"}
        pending = asyncio.ensure_future(st.put(TensorDict({"x": torch.arange(2)}, [2]), "p"))
        await asyncio.sleep(0)
        closing = asyncio.ensure_future(st.aclose())
        await asyncio.sleep(0)
        assert not closing.done()  # it waits for the spawns the head is running
    await closing
    with pytest.raises(StoreError, match="shut down while its units started"):
        await pending  # the put that waited for them: the table was never completed
    assert st.closed and st._link.start is not None and st._link.start.done()
    assert await _actors(local_cluster, "start-close") == {}
    with pytest.raises(ClosedError):
        await st.put(TensorDict({"x": torch.arange(2)}, [2]), partition="p")
    # the names are free again, and a store started then closed at once leaves nothing
    again = await Store.create(local_cluster, num_units=2, name="start-close")
    await again.aclose()
    assert await _actors(local_cluster, "start-close") == {}


async def test_a_unit_that_cannot_start_fails_the_first_operation_and_leaves_nothing(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="start-bad", nodes=["node-0", "nope"])
    with pytest.raises(PlacementError, match="nope"):
        await st.put(TensorDict({"x": torch.arange(2)}, [2]), partition="p")
    with pytest.raises(PlacementError):  # every later operation too
        await st.partitions()
    with pytest.raises(PlacementError):
        st.units  # noqa: B018
    await wait_until(
        lambda: _none_left(local_cluster, "start-bad"), timeout=30, what="the store's actors gone"
    )
    await st.aclose()  # it surfaced already: closing does not raise it again
    assert st.closed


async def test_a_start_error_no_operation_saw_is_raised_by_aclose(local_cluster: Cluster) -> None:
    # unit 1's name is taken: unit 0 starts, then is killed with the controller
    squatter = await local_cluster.spawn(Counter, name="start-unseen-unit-1", cpus=0)
    st = await Store.create(local_cluster, num_units=2, name="start-unseen")
    pids: dict[str, int] = {}

    async def unit0_up() -> bool:
        pids.update(await _actors(local_cluster, "start-unseen-unit-0"))
        return bool(pids) or (st._link.start is not None and st._link.start.done())

    await wait_until(unit0_up, timeout=30, what="unit 0 started (or the start ended)")
    with pytest.raises(NameTakenError, match="start-unseen-unit-1"):
        await st.aclose()
    assert st.closed
    assert set(await _actors(local_cluster, "start-unseen")) == {"start-unseen-unit-1"}
    for pid in pids.values():
        await wait_until(
            lambda pid=pid: not pid_alive(pid), timeout=30, what=f"unit pid {pid} gone"
        )
    await local_cluster.kill(squatter)


async def _none_left(cluster: Cluster, prefix: str) -> bool:
    return not await _actors(cluster, prefix)


def _sync_before_ready(cluster: Cluster) -> list[int]:
    with SyncStore.create(cluster, num_units=2, name="start-sync") as st:
        assert len(st.units) == 2  # blocking code may read the units at once: it waits
        meta = st.put(TensorDict({"x": torch.arange(3)}, [3]), partition="p")
        return list(st.get(meta)["x"].tolist())


async def test_sync_store_operations_wait_for_the_units_too(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    with held_units(local_cluster_processes):
        running = asyncio.ensure_future(asyncio.to_thread(_sync_before_ready, local_cluster))
        await wait_until(
            lambda: _actors(local_cluster, "start-sync"), timeout=30, what="the controller up"
        )
        assert not running.done()
    assert await running == [0, 1, 2]
    assert await _actors(local_cluster, "start-sync") == {}
