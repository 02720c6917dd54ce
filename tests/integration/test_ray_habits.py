"""Ray's habits on a real local cluster: cancellation reaches the actor, per-call timeouts,
threaded actors, futures as arguments, gather of a list, user-facing encoding errors, total
timeouts in the sync facade, spawns that wait for busy GPUs."""

from __future__ import annotations

import asyncio
import time

import pytest

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.errors import PlacementError, ResourcesBusyError, Timeout
from tests.integration.habits_classes import Adder, Blocker, Gate, Threaded

pytestmark = pytest.mark.integration


async def test_timed_out_calls_are_cancelled_and_free_the_actor(local_cluster: Cluster) -> None:
    # five timed-out calls to a blocking async method used to wedge max_concurrency=4 for good
    blocker = await local_cluster.spawn(Blocker, max_concurrency=4)
    calls = [blocker.block.options(timeout=0.5)() for _ in range(5)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(r, Timeout) for r in results), results
    counts = await asyncio.wait_for(blocker.wait_cancelled(4), 30)
    assert counts["cancelled"] >= 4 and counts["started"] <= 5  # each one that ran, cancelled
    assert await asyncio.wait_for(blocker.ping(), 30) == "pong"


async def test_cancelling_a_call_cancels_it_in_the_actor(local_cluster: Cluster) -> None:
    blocker = await local_cluster.spawn(Blocker, max_concurrency=2)
    call = blocker.block()
    await asyncio.wait_for(blocker.wait_started(1), 30)
    call.cancel()
    assert (await asyncio.wait_for(blocker.wait_cancelled(1), 30))["cancelled"] == 1
    second = blocker.block()  # both slots: the cancelled call holds none
    await asyncio.wait_for(blocker.wait_started(2), 30)
    second.cancel()


async def test_handle_default_timeout_and_gather_timeout_cancel(local_cluster: Cluster) -> None:
    blocker = await local_cluster.spawn(Blocker, max_concurrency=2)
    short = blocker.with_timeout(0.3)
    with pytest.raises(Timeout, match="block"):
        await short.block()
    with pytest.raises(Timeout):
        await actors.gather([blocker.block()], timeout=0.3)  # gather's timeout cancels too
    assert (await asyncio.wait_for(blocker.wait_cancelled(2), 30))["cancelled"] == 2
    assert await short.ping() == "pong"
    with pytest.raises(ValueError):
        blocker.with_timeout(0)


async def test_sync_calls_queued_are_dropped_running_ones_keep_their_slot(
    local_cluster: Cluster,
) -> None:
    blocker = await local_cluster.spawn(Blocker)  # def methods one at a time
    running = blocker.hold("a")  # starts and blocks
    with pytest.raises(Timeout):  # queued behind "a", then given up: never runs
        await blocker.hold.options(timeout=0.3)("b")
    await blocker.let_go()
    assert await asyncio.wait_for(running, 30) == "a"
    assert await blocker.hold("c") == "c"
    assert await blocker.ran() == ["a", "c"]
    # a running call whose caller gave up keeps the only slot until it returns (as in Ray)
    other = await local_cluster.spawn(Blocker)
    with pytest.raises(Timeout, match="def method cannot be cancelled"):
        await other.hold.options(timeout=0.3)("x")
    later = other.hold("y")  # waits for "x" to return
    assert await other.ran() == ["x"]
    await other.let_go()
    assert await asyncio.wait_for(later, 30) == "y"
    assert await other.ran() == ["x", "y"]


async def test_def_methods_run_on_threads_with_max_concurrency(local_cluster: Cluster) -> None:
    threaded = await local_cluster.spawn(Threaded, 4, max_concurrency=4)
    idents = await asyncio.wait_for(asyncio.gather(*(threaded.meet() for _ in range(4))), 30)
    assert len(set(idents)) == 4  # four calls inside the method at once, on four threads


async def test_futures_as_arguments_and_gather_of_a_list(local_cluster: Cluster) -> None:
    adder = await local_cluster.spawn(Adder)
    first = adder.add(1, 2)
    assert await adder.add(first, b=adder.add(10)) == 13  # Ray resolves refs before the call
    assert await actors.gather([adder.add(1), adder.add(2)]) == [1, 2]
    assert await actors.gather(adder.add(1), adder.add(2)) == [1, 2]
    failing = adder.add("a", 1)  # TypeError in the actor: the dependent call is not sent
    with pytest.raises(TypeError):
        await adder.add(failing)


async def test_concurrency_groups_run_beside_each_other(local_cluster: Cluster) -> None:
    """A ``def`` method that blocks its group's thread leaves the other groups and the
    default group serving (Ray's concurrency groups, on threads of each group's own); a
    method in a group the spawn does not define, or a malformed limit, is a ValueError at
    once."""
    groups = {"waiting": 1, "opening": 1}
    gate = await local_cluster.spawn(Gate, concurrency_groups=groups)
    waiting = gate.wait()
    await asyncio.sleep(0.2)
    assert not waiting.done()
    default = await asyncio.wait_for(gate.thread(), 30)  # served while "waiting" is held
    opener = await asyncio.wait_for(gate.open(), 30)
    assert await asyncio.wait_for(waiting, 30) is True
    assert "opening" in opener and "opening" not in default
    # a call's own group: a default-group method on the "opening" group's threads
    own = await asyncio.wait_for(gate.thread.options(concurrency_group="opening")(), 30)
    assert "opening" in own
    with pytest.raises(ValueError, match="has no concurrency group 'nope'"):
        await asyncio.wait_for(gate.thread.options(concurrency_group="nope")(), 30)
    # a def generator of a group steps on its group's threads: the default thread is held
    gate = await local_cluster.spawn(Gate, concurrency_groups=groups)
    held = gate.hold()
    items = [x async for x in await asyncio.wait_for(gate.count(3), 30)]
    assert [i for i, _ in items] == [0, 1, 2] and all("opening" in t for _, t in items)
    assert not held.done()
    await asyncio.wait_for(gate.open(), 30)
    assert await asyncio.wait_for(held, 30) is True
    with pytest.raises(ValueError, match=r"Gate\.count runs in concurrency group 'opening'"):
        await local_cluster.spawn(Gate, concurrency_groups={"waiting": 1})
    with pytest.raises(ValueError, match="must allow an int >= 1"):
        await local_cluster.spawn(Gate, concurrency_groups={"waiting": 0, "opening": 1})


async def test_encoding_errors_name_the_argument(local_cluster: Cluster) -> None:
    adder = await local_cluster.spawn(Adder)
    await adder.echo(1)  # connected: the fast path
    with pytest.raises(TypeError, match=r"^argument 0 \['a'\]\[1\]: cannot encode range"):
        await adder.echo({"a": [1, range(2)]})
    with pytest.raises(TypeError, match=r"^keyword argument 'b': cannot encode range"):
        await adder.add(1, b=range(3))
    fresh = await local_cluster.spawn(Adder)  # not connected yet: the slow path
    with pytest.raises(TypeError, match=r"^argument 1: cannot encode range"):
        await fresh.add(1, range(2))


def test_sync_get_timeout_is_total(local_cluster_processes: LocalProcesses) -> None:
    procs = local_cluster_processes
    with actors.Cluster.connect_sync(procs.address, token=procs.token) as cluster:
        adder = cluster.spawn(Adder)  # def methods one at a time: results 0.5 s apart
        futures = [adder.slow.remote(i, 0.5) for i in range(12)]
        started = time.monotonic()
        with pytest.raises(Timeout, match="of 12 results"):  # per future, none would time out
            cluster.get(futures, timeout=1.0)
        assert time.monotonic() - started < 4.0
        assert cluster.get(futures, timeout=60) == list(range(12))
        assert cluster.get(adder.slow.remote(7, 0), timeout=30) == 7  # one future: its value


@pytest.mark.local_cluster(nodes=1, gpus_per_node=1, isolated=True)
async def test_spawn_waits_for_busy_gpus(local_cluster: Cluster) -> None:
    holder = await local_cluster.spawn(Adder, gpus=1)
    with pytest.raises(ResourcesBusyError):  # the default: fail at once
        await local_cluster.spawn(Adder, gpus=1)
    with pytest.raises(ResourcesBusyError, match=r"waited 0.5s .*gpus=1"):
        await local_cluster.spawn(Adder, gpus=1, wait_for_resources=0.5)
    with pytest.raises(PlacementError, match="can ever hold"):  # infeasible: never waits
        await local_cluster.spawn(Adder, gpus=2, wait_for_resources=60)
    waiting = asyncio.ensure_future(local_cluster.spawn(Adder, gpus=1, wait_for_resources=60))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await local_cluster.kill(holder)  # frees the GPU: the waiting spawn is woken
    started = await asyncio.wait_for(waiting, 50)
    assert await started.add(1) == 1
