"""Fault injection: kill -9 actors, agents, the head and drivers; nothing hangs or leaks."""

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
from typing import Any

import psutil
import pytest
import torch

import rayless.actors as actors
from rayless.actors import ActorDiedError, Cluster
from rayless.actors.api.runtime import get_runtime
from rayless.actors.launch.local import LocalProcesses
from rayless.transport.errors import ClosedError, LimitError, Timeout
from tests.integration.actor_classes import Counter, Relay
from tests.integration.edge_classes import SlowInitMarksTerm
from tests.waiting import eventually, scaled, wait_until

pytestmark = pytest.mark.integration


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def _until(predicate: Callable[[], object], timeout: float) -> bool:
    return await eventually(predicate, timeout=timeout, interval=0.05)


async def test_kill_9_fails_pending_and_later_calls_fast(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter, name="victim")
    pid = await counter.pid()
    pending = [counter.sleep.submit(60) for _ in range(5)]
    await asyncio.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    for fut in pending:
        with pytest.raises(ActorDiedError) as info:
            await asyncio.wait_for(fut, scaled(10))
    err = info.value
    assert err.actor == "victim" and err.pid == pid and err.exitcode == -signal.SIGKILL
    assert err.node in ("node-0", "node-1")
    assert "SIGKILL" in str(err)
    # the exit status shows the agent's notice of the exit failed them, not a heartbeat
    # timeout (how fast is benchmarked: scripts/chaos.py)
    with pytest.raises(ActorDiedError):
        await counter.add(1)


async def test_max_restarts_brings_the_actor_back(local_cluster: Cluster) -> None:
    counter = await local_cluster.spawn(Counter, 10, max_restarts=2)
    await counter.add(5)
    first = await counter.pid()
    pending = counter.sleep.submit(60)
    await asyncio.sleep(0.1)
    os.kill(first, signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        await asyncio.wait_for(pending, 10)
    assert await asyncio.wait_for(counter.add(1), 30) == 11  # a fresh instance: state reset
    second = await counter.pid()
    assert second != first
    assert await counter.get_setups() == 1  # setup ran again in the new process
    records = [a for n in await local_cluster.nodes() for a in n["actors"]]
    (record,) = [a for a in records if a["actor_id"] == counter.actor_id]
    assert record["restarts"] == 1 and record["state"] == "alive"
    os.kill(second, signal.SIGKILL)
    # a call racing the death fails with ActorDiedError; calls after the restart succeed
    assert await _call_after_restart(counter, second) == 11
    os.kill(await counter.pid(), signal.SIGKILL)  # the third death: no restarts left
    await asyncio.sleep(0.5)
    with pytest.raises(ActorDiedError):
        await asyncio.wait_for(counter.add(1), 30)


async def _restarted(cluster: Cluster, actor_id: str, old_pid: int) -> bool:
    records = [a for n in await cluster.nodes() for a in n["actors"]]
    (record,) = [a for a in records if a["actor_id"] == actor_id]
    return bool(record["state"] == "alive" and record["pid"] and record["pid"] != old_pid)


async def test_a_handle_from_before_a_restart_reaches_the_new_process(
    local_cluster: Cluster,
) -> None:
    # The relay never called the counter: its first call connects to the address the handle
    # carries, the dead process's. Nothing was sent there, so it connects to the new one.
    counter = await local_cluster.spawn(Counter, 10, max_restarts=1)
    relay = await local_cluster.spawn(Relay)
    old = await counter.pid()
    os.kill(old, signal.SIGKILL)
    await wait_until(
        lambda: _restarted(local_cluster, counter.actor_id, old), timeout=30, what="the restart"
    )
    assert await asyncio.wait_for(relay.via(counter, 1), scaled(30)) == 11


async def test_a_broken_call_fails_as_died_when_the_restart_outran_the_events(
    local_cluster: Cluster,
) -> None:
    # The session under a call breaks on our side (as when the kernel refuses a send) after
    # the actor's process died, and the actor runs again elsewhere before the head's
    # RESTARTING/READY events reach us: the call the dead process had fails with
    # ActorDiedError, as when the events come first; later calls reach the new process.
    counter = await local_cluster.spawn(Counter, 10, max_restarts=1)
    old = await counter.pid()
    runtime = await get_runtime()
    held: list[Any] = []
    on_event = runtime._on_event

    def hold(ev: Any) -> None:
        if ev.actor_id == counter.actor_id:
            held.append(ev)
        else:
            on_event(ev)

    runtime._on_event = hold  # type: ignore[method-assign]
    try:
        pending = asyncio.ensure_future(counter.sleep.options(timeout=120)(60))
        await asyncio.sleep(0.2)
        os.kill(old, signal.SIGKILL)
        await wait_until(
            lambda: _restarted(local_cluster, counter.actor_id, old), timeout=30, what="restart"
        )
        client = runtime.conns[counter.actor_id].client
        assert client is not None and not pending.done()
        client._break("injected: a send failed", "lost")
        with pytest.raises(ActorDiedError, match="restarted at"):
            await asyncio.wait_for(pending, scaled(30))
    finally:
        runtime._on_event = on_event  # type: ignore[method-assign]
        for ev in held:
            on_event(ev)
    assert await asyncio.wait_for(counter.add(1), scaled(30)) == 11
    assert await counter.pid() != old


async def _call_after_restart(counter: actors.ActorHandle, old_pid: int) -> int:
    async def restarted() -> bool:
        try:
            return bool(await counter.pid() != old_pid)
        except ActorDiedError:
            return False

    await wait_until(restarted, timeout=30, what="the actor back with a new pid", interval=0.05)
    return int(await counter.add(1))


@pytest.mark.local_cluster(nodes=2, gpus_per_node=1, node_timeout=1.0, isolated=True)
async def test_dead_node_agent_takes_its_actors_and_others_keep_working(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    on0 = await local_cluster.spawn(Counter, node="node-0")
    on1 = await local_cluster.spawn(Counter, node="node-1")
    victim_pid = await on1.pid()
    pending = on1.sleep.submit(60)
    await asyncio.sleep(0.1)
    agent = local_cluster_processes.agents[1]
    start = time.monotonic()
    agent.kill()
    with pytest.raises(ActorDiedError):
        await asyncio.wait_for(pending, 15)
    assert time.monotonic() - start < 10
    assert await _until(lambda: _gone(victim_pid), 10), "the node's actor outlived its agent"
    nodes = {n["node_id"]: n for n in await local_cluster.nodes()}
    assert nodes["node-1"]["alive"] is False
    assert await on0.add(1) == 1
    with pytest.raises(ActorDiedError):
        await on1.add(1)


@pytest.mark.local_cluster(nodes=2, gpus_per_node=0, node_timeout=1.0, isolated=True)
async def test_head_loss_shuts_agents_and_actors_down(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    counter = await local_cluster.spawn(Counter)
    actor_pid = await counter.pid()
    agent_pids = [a.pid for a in local_cluster_processes.agents]
    assert local_cluster_processes.head is not None
    local_cluster_processes.head.kill()
    assert await _until(lambda: all(_gone(p) for p in agent_pids), 20), "agents outlived head"
    assert await _until(lambda: _gone(actor_pid), 10), "actor outlived its agent"


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _threads() -> tuple[int, int]:
    """(Python threads but the loop's default executor's, ZeroMQ's I/O threads) of this
    process.

    The executor's ``asyncio_N`` threads are the loop's own (bounded, ended with the loop),
    and torch's intra-op pool starts with the process's first parallel op: neither is a leak.
    A leaked ZeroMQ context shows as its ``ZMQbg/*`` threads."""
    python = [t for t in threading.enumerate() if not t.name.startswith("asyncio_")]
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return len(python), sum(1 for n in names if n.startswith("ZMQbg/"))


def _listening() -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections()
        if c.status == "LISTEN" and c.laddr
    }


@pytest.mark.own_fork_templates  # it counts every process the cluster started
async def test_local_cluster_exit_leaves_nothing_behind() -> None:
    before = _descendants()
    threads_before = _threads()
    # what this process listened on before (another test's driver listener under xdist)
    listening_before = _listening()
    async with Cluster.local(nodes=2, gpus_per_node=1) as cluster:
        handles = [await cluster.spawn(Counter) for _ in range(3)]
        pids = [await h.pid() for h in handles]
        assert len(_descendants() - before) >= 6  # head, zygote, 2 agents, 3 actors
    assert await _until(lambda: _descendants() <= before, 10), _descendants() - before
    assert all(_gone(p) for p in pids)
    python, native = _threads()
    assert python <= threads_before[0], threading.enumerate()  # the keeper's thread ended too
    assert native <= max(threads_before[1], 2)  # at most the one shared context's I/O + reaper
    assert _listening() <= listening_before, _listening() - listening_before


DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    from rayless import actors
    from tests.integration.actor_classes import Counter, Relay
    async def main():
        cluster = await actors.connect(sys.argv[1], token=sys.argv[2])
        c = await cluster.spawn(Counter)
        print(await c.pid(), flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
    """
)


async def test_a_driver_killed_with_9_leaves_no_actor(
    local_cluster: Cluster, local_cluster_processes: LocalProcesses
) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DRIVER,
            local_cluster_processes.address,
            local_cluster_processes.token,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        actor_pid = int(line)
        assert not _gone(actor_pid)
        proc.kill()
        proc.wait()
        # the head notices the silent session (heartbeat timeout + owner grace) and kills it
        assert await _until(lambda: _gone(actor_pid), 30), "a dead driver's actor lived on"
    finally:
        proc.kill()
        proc.wait()


def test_sync_facade() -> None:
    with actors.Cluster.local_sync(nodes=1) as cluster:
        counter = cluster.spawn(Counter, 1)
        assert counter.add.call(2) == 3
        futures = [cluster.submit(counter, "aadd", 1) for _ in range(10)]
        done, pending = cluster.wait(futures, num_returns=10, timeout=30)
        assert len(done) == 10 and not pending
        assert sorted(cluster.get(futures)) == list(range(4, 14))
        remote = [counter.aadd.remote(1) for _ in range(3)]  # plain thread: concurrent futures
        done, _ = cluster.wait(remote, num_returns=3, timeout=30)
        assert len(done) == 3 and sorted(cluster.get(remote)) == [14, 15, 16]
        assert cluster.wait(remote, num_returns=1) == (remote[:1], remote[1:])  # as ray.wait
        assert cluster.get_actor(counter.name) == counter
        assert cluster.nodes()[0]["node_id"] == "node-0"
        assert cluster.kill(counter)
        with pytest.raises(ActorDiedError):
            counter.add.call(1, timeout=30)
    with pytest.raises(ClosedError):
        cluster.nodes()


async def test_a_spawn_past_its_timeout_kills_the_starting_process_at_once(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    warm = await local_cluster.spawn(Counter)  # the fork template is warm
    await local_cluster.kill(warm)
    pid_file = tmp_path / "pid"
    with pytest.raises(Timeout, match="did not start within its spawn timeout of 8"):
        await asyncio.wait_for(
            local_cluster.spawn(SlowInitMarksTerm, str(pid_file), 120.0, timeout=8.0), 120
        )
    pid = int(pid_file.read_text())
    assert _gone(pid)  # gone before the spawn raised
    # killed with SIGKILL at once: no SIGTERM and grace period past the spawn's timeout
    assert not Path(f"{pid_file}.term").exists()


async def test_an_oversize_argument_fails_unsent_naming_the_argument(
    local_cluster: Cluster,
) -> None:
    small = {"RAYLESS_MAX_MESSAGE_BYTES": str(2**20)}  # this actor takes at most 1 MiB
    counter = await local_cluster.spawn(Counter, env=small)
    assert await counter.add(1) == 1
    with pytest.raises(LimitError, match=r"argument 0 of add\(\.\.\.\) holds 4194304 bytes"):
        await counter.add(torch.zeros(2**20))
    with pytest.raises(LimitError, match=r"keyword argument 'k' of add\(\.\.\.\) holds"):
        await counter.add(k=[b"x" * 2**20, b"y" * 2**20])
    assert await counter.add(1) == 2  # neither call reached the actor
