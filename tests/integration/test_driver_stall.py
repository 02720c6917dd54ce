"""A driver whose own event loop stalls past the cluster's node_timeout keeps its cluster.

Over ZeroMQ the head forgets a connection it has not heard for max(2 s, node_timeout); these
clusters use node_timeout=1, and the drivers block their loop for 3-6 s (``time.sleep``, a
first import of torch and tensordict), so the head has expired the loop's connection and the
runtime resumes it. On the same-host path the head keeps a silent peer while its connection
is open, so nothing needs resuming.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rayless.actors import ActorDiedError, Cluster
from rayless.actors.api.runtime import get_runtime
from tests.integration.actor_classes import Counter
from tests.integration.edge_classes import Parent
from tests.waiting import wait_until as _wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    """``tests.waiting.wait_until``, polling every 50 ms."""
    await _wait_until(pred, timeout, what, interval=0.05)


@pytest.fixture(params=["same-host", "zeromq"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The transport of the driver's and the cluster's connections (set before the cluster
    starts: list it before ``local_cluster``)."""
    if request.param == "zeromq":
        monkeypatch.setenv("RAYLESS_UNIX", "0")
    return str(request.param)


def _resumed_as_expected(path: str, resumes: int) -> bool:
    # ZeroMQ: the head forgot the silent connection and the runtime resumed it; same host:
    # the connection stayed open, so the head kept the session
    return resumes >= 1 if path == "zeromq" else resumes == 0


@pytest.mark.timeout(180)
@pytest.mark.local_cluster(nodes=1, gpus_per_node=0, node_timeout=1.0, isolated=True)
async def test_a_driver_blocked_past_node_timeout_keeps_its_actor_and_can_spawn(
    path: str, local_cluster: Cluster
) -> None:
    counter = await local_cluster.spawn(Counter)
    assert await counter.add(1) == 1
    runtime = await get_runtime()
    # the driver's own loop is blocked; over ZeroMQ the head expires its connection after 2 s
    # (with room for a loaded machine's late sweep)
    time.sleep(3.0 if path == "same-host" else 6.0)
    assert await asyncio.wait_for(counter.add(1), 60) == 2  # the same actor, state kept
    other = await asyncio.wait_for(local_cluster.spawn(Counter, 10), 120)
    assert await asyncio.wait_for(other.add(1), 60) == 11
    assert runtime.lost is None and _resumed_as_expected(path, runtime.resumes)
    keeper = runtime.keeper
    assert keeper is not None and keeper.registrations == 1  # heard all along


@pytest.mark.timeout(180)
@pytest.mark.local_cluster(nodes=1, gpus_per_node=0, node_timeout=1.0, isolated=True)
async def test_an_actor_that_died_while_the_driver_was_blocked_fails_its_calls(
    path: str, local_cluster: Cluster
) -> None:
    counter = await local_cluster.spawn(Counter)
    pid = await counter.pid()
    runtime = await get_runtime()
    # killed once the head has forgotten the blocked loop's connection: its death event
    # never reaches that connection; the resumed session learns it from the head
    killer = threading.Timer(3.0, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        time.sleep(6.0)
    finally:
        killer.join()
    with pytest.raises(ActorDiedError) as info:
        await asyncio.wait_for(counter.add(1), 30)  # never a hang
    assert info.value.pid == pid
    assert runtime.lost is None and _resumed_as_expected(path, runtime.resumes)
    await wait_until(lambda: runtime.conns[counter.actor_id].state == "dead", 30, "the death")
    with pytest.raises(ActorDiedError):
        await asyncio.wait_for(counter.add(1), 30)


_FIRST_STORE_USE = textwrap.dedent(
    """
    import asyncio, sys, time
    import rayless.actors as actors
    import rayless.store
    from rayless.actors.api.runtime import get_runtime

    class Plain(actors.Actor):
        def add(self, a, b):
            return a + b

    async def lag_probe(lags):
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            lags.append(now - last - 0.05)
            last = now

    async def main():
        async with actors.Cluster.local(nodes=1, node_timeout=1.0) as cluster:
            plain = await cluster.spawn(Plain)
            assert await plain.add(1, 2) == 3
            print("torch loaded before:", "torch" in sys.modules, flush=True)
            lags = []
            probe = asyncio.ensure_future(lag_probe(lags))
            await asyncio.sleep(0.2)
            store_cls = rayless.store.Store  # the first use: imports torch and tensordict
            await asyncio.sleep(0.2)
            probe.cancel()
            print("store class:", store_cls.__name__, flush=True)
            print(f"max loop lag: {max(lags):.2f}s", flush=True)
            print("call:", await plain.add(2, 3), flush=True)
            other = await cluster.spawn(Plain)
            print("spawn:", await other.add(4, 5), flush=True)
            runtime = await get_runtime()
            print("lost:", runtime.lost is not None, flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_first_store_use_does_not_cost_the_driver_its_session(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_FIRST_STORE_USE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAYLESS_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
        cwd=tmp_path,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "torch loaded before: False" in out  # the import happened on the running loop
    lag = float(out.split("max loop lag: ")[1].split("s")[0])
    print(f"the first Store use held the driver's loop for {lag:.2f}s")
    assert "call: 5" in out and "spawn: 9" in out and "lost: False" in out, out


@pytest.mark.timeout(180)
@pytest.mark.local_cluster(nodes=1, gpus_per_node=0, node_timeout=1.0, isolated=True)
async def test_an_actor_whose_loop_is_held_keeps_the_actors_it_spawned(
    local_cluster: Cluster,
) -> None:
    parent = await local_cluster.spawn(Parent)
    assert await asyncio.wait_for(parent.adopt(), 120) == 1
    # past the head's expiry of the parent's connection and the owner grace after it
    assert await asyncio.wait_for(parent.hold(4.0), 60) == "held"
    assert await asyncio.wait_for(parent.child_add(), 60) == 2
