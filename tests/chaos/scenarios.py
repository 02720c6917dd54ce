"""Chaos scenarios shared by tests/chaos (small sizes) and scripts/chaos.py (large sizes).

Each scenario injects faults into a live local cluster (kill -9 of actors, storage units,
node agents, the head), measures how long rayless takes to notice (polling the head's or the
store controller's view every few milliseconds) and returns a report. The tests assert on
the outcomes; the script prints the figures that docs/reliability.md quotes.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from tensordict import TensorDict

from rayless.actors import ActorDiedError, ActorHandle, Cluster
from rayless.actors.launch.local import LocalProcesses
from rayless.demo.config import PipelineConfig
from rayless.demo.pipeline import Pipeline, RunResult
from rayless.store import Store, StoreError, StoreInputError, UnitLostError
from tests.integration.actor_classes import Counter
from tests.waiting import eventually

POLL = 0.01


def gone(pid: int) -> bool:
    """Whether ``pid`` exited (a zombie counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def descendants() -> set[int]:
    """Pids of this process's live descendants."""
    return {p.pid for p in psutil.Process().children(recursive=True) if not gone(p.pid)}


async def until(predicate: Callable[[], Any], timeout: float, interval: float = POLL) -> bool:
    """Whether ``predicate`` (sync or async) comes true within ``timeout`` s."""
    return await eventually(predicate, timeout=timeout, interval=interval)


def summary(times: list[float]) -> dict[str, float]:
    """p50 and max of detection times in seconds (empty: zeros)."""
    if not times:
        return {"n": 0, "p50": 0.0, "max": 0.0}
    return {"n": len(times), "p50": statistics.median(times), "max": max(times)}


@dataclass
class Kill:
    """One injected fault and when rayless noticed it."""

    what: str
    name: str
    pid: int
    detected_s: float | None = None


@dataclass
class PipelineChaosReport:
    """What a chaos run of the demo pipeline did and lost."""

    kills: list[Kill] = field(default_factory=list)
    result: RunResult | None = None
    error: BaseException | None = None
    killed_unit: str | None = None
    acked_puts: int = 0
    acked_lost_with_unit: int = 0
    acked_unreadable: list[str] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)
    leftover_pids: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    def detection(self, what: str) -> dict[str, float]:
        """p50/max detection time of the kills of kind ``what``."""
        return summary([k.detected_s for k in self.kills if k.what == what and k.detected_s])


async def _records(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for n in await cluster.nodes() for a in n["actors"]}


async def _kill_actor(cluster: Cluster, name: str, what: str, timeout: float) -> Kill | None:
    """kill -9 the live actor ``name``; wait until the head saw it die (or restart)."""
    record = (await _records(cluster)).get(name)
    if record is None or record["state"] != "alive" or not record["pid"]:
        return None
    pid = int(record["pid"])
    kill = Kill(what, name, pid)
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    async def noticed() -> bool:
        rec = (await _records(cluster)).get(name)
        return rec is None or rec["state"] != "alive" or rec["pid"] != pid

    if await until(noticed, timeout):
        kill.detected_s = time.monotonic() - start
    return kill


async def _unit_pid(cluster: Cluster, unit_name: str) -> int | None:
    record = (await _records(cluster)).get(unit_name)
    return None if record is None or record["state"] != "alive" else int(record["pid"])


async def _kill_unit(store: Store, cluster: Cluster, shard: int, timeout: float) -> Kill | None:
    """kill -9 a storage unit; wait until the store's controller marked it lost."""
    unit_id = str(store.units[shard]["unit_id"])
    pid = await _unit_pid(cluster, unit_id)
    if pid is None:
        return None
    kill = Kill("unit", unit_id, pid)
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    async def lost() -> bool:
        units = {u.unit_id: u for u in await store.controller.units()}
        return not units[unit_id].alive

    if await until(lost, timeout):
        kill.detected_s = time.monotonic() - start
    return kill


async def _acked_writer(
    stores: list[Store], acked: list[tuple[Store, Any, int]], stop: asyncio.Event, pause: float
) -> None:
    """Put small batches into ``stores`` until ``stop``; remember every put that returned."""
    k = 0
    while not stop.is_set() and k < 100_000:  # not a wait: a load generator, stopped by `stop`
        k += 1
        for st in stores:
            td = TensorDict({"v": torch.full((4, 3), float(k))}, [4])
            try:
                meta = await st.put(td, "chaos-acked", timeout=5)
            except StoreInputError:
                raise
            except (StoreError, ActorDiedError):
                continue  # not acknowledged (a unit is lost, or every unit): nothing to check
            acked.append((st, meta, k))
        await asyncio.sleep(pause)


async def _check_acked(
    acked: list[tuple[Store, Any, int]], lost_units: set[str], report: PipelineChaosReport
) -> None:
    report.acked_puts = len(acked)
    for st, meta, k in acked:
        try:
            back = await st.get(meta)
        except UnitLostError as exc:
            if exc.unit in lost_units:
                report.acked_lost_with_unit += 1
                continue
            report.acked_unreadable.append(f"put {k}: {exc}")
            continue
        except Exception as exc:
            report.acked_unreadable.append(f"put {k}: {type(exc).__name__}: {exc}")
            continue
        if not torch.equal(back["v"], torch.full((4, 3), float(k))):
            report.acked_unreadable.append(f"put {k}: wrong data")


async def _first(*waits: Any) -> None:
    """Wait until the first of ``waits`` (coroutines or futures) is done; cancel the others.

    A future among them (the pipeline's run) is never cancelled, only no longer waited for.
    """
    futures = [asyncio.ensure_future(w) for w in waits]
    owned = [f for f, w in zip(futures, waits, strict=True) if f is not w]
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in owned:
            f.cancel()


async def pipeline_chaos(
    cluster: Cluster,
    cfg: PipelineConfig,
    *,
    seed: int = 0,
    actor_kills: int = 3,
    kill_every: float = 1.0,
    first_kill_after: float = 1.0,
    kill_unit: bool = True,
    max_restarts: int = 3,
    run_timeout: float = 150.0,
    log: Callable[[str], None] | None = None,
) -> PipelineChaosReport:
    """Run the pipeline; kill -9 random env/eval workers, then one storage unit of the
    pipeline's store and one of a side store that takes acknowledged puts.

    The pipeline's outcome (a result, or its error) and everything measured are in the report.
    """
    rng = random.Random(seed)
    report = PipelineChaosReport()
    say = log or (lambda _msg: None)
    t0 = time.monotonic()
    # The run is held at two iterations until the kills meant for it are done, so a fast run
    # can never end before them (the scenario waits for events, never on a race).
    if cfg.algo.iterations < 4:
        raise ValueError("pipeline_chaos needs at least 4 iterations")
    actors_done, units_done = asyncio.Event(), asyncio.Event()
    hold = {1: actors_done, cfg.algo.iterations - 2: units_done}
    started = asyncio.Event()

    async def gate(row: Any, _cfg: Any) -> None:
        started.set()
        event = hold.get(row.iteration)
        if event is not None:
            await event.wait()

    pipeline = Pipeline(cfg, cluster, max_restarts=max_restarts, on_iteration=gate)
    side: Store | None = None
    seen_pids: set[int] = set()
    try:
        await pipeline.setup()
        assert pipeline.store is not None
        side = await Store.create(cluster, num_units=2, name=f"chaos-side-{seed}")
        acked: list[tuple[Store, Any, int]] = []
        stop = asyncio.Event()
        writer = asyncio.ensure_future(_acked_writer([side, pipeline.store], acked, stop, 0.05))
        run = asyncio.ensure_future(pipeline.run())
        lost_units: set[str] = set()
        await _first(started.wait(), asyncio.sleep(first_kill_after), run)
        for i in range(actor_kills):  # not a wait: the kill schedule, stopped by the run
            if run.done():
                break
            records = await _records(cluster)
            seen_pids.update(int(r["pid"]) for r in records.values() if r["pid"])
            victims = sorted(
                n
                for n, r in records.items()
                if n.split("-")[0] in ("env", "eval") and r["state"] == "alive"
            )
            if victims:
                name = rng.choice(victims)
                kill = await _kill_actor(cluster, name, name.split("-")[0], 15.0)
                if kill is not None:
                    report.kills.append(kill)
                    say(f"killed {kill.what} {name} (pid {kill.pid}), noticed {kill.detected_s}s")
            if i == 0:
                actors_done.set()  # the first kill is in: let the run go on
            if i < actor_kills - 1:
                await _first(asyncio.sleep(kill_every), run)
        actors_done.set()
        side_kill = await _kill_unit(side, cluster, rng.randrange(len(side.units)), 15.0)
        if side_kill is not None:
            report.kills.append(side_kill)
            lost_units.add(side_kill.name)
            say(f"killed side unit {side_kill.name}, noticed {side_kill.detected_s}s")
        if kill_unit and not run.done():
            await _first(asyncio.sleep(kill_every), run)
            shard = rng.randrange(len(pipeline.store.units))
            unit_kill = await _kill_unit(pipeline.store, cluster, shard, 15.0)
            if unit_kill is not None:
                report.kills.append(unit_kill)
                report.killed_unit = unit_kill.name
                lost_units.add(unit_kill.name)
                say(f"killed unit {unit_kill.name}, noticed {unit_kill.detected_s}s")
        units_done.set()
        try:
            report.result = await asyncio.wait_for(run, run_timeout)
        except asyncio.TimeoutError:
            raise
        except Exception as exc:
            report.error = exc
        stop.set()
        await asyncio.wait_for(writer, 30)
        records = await _records(cluster)
        seen_pids.update(int(r["pid"]) for r in records.values() if r["pid"])
        report.restarts = {n: int(r["restarts"]) for n, r in records.items() if r["restarts"]}
        await _check_acked(acked, lost_units, report)
    finally:
        actors_done.set()
        units_done.set()
        await pipeline.aclose()
        if side is not None:
            await side.shutdown()
    ok = await until(lambda: all(gone(p) for p in seen_pids), 20.0, 0.05)
    report.leftover_pids = [] if ok else [p for p in seen_pids if not gone(p)]
    report.wall_s = time.monotonic() - t0
    return report


@dataclass
class NodeLossReport:
    """What losing a node agent did."""

    detected_s: float
    error: BaseException | None
    victim_pids_gone: bool
    survivors_ok: bool


async def node_loss(
    cluster: Cluster, procs: LocalProcesses, victim: int, *, per_node: int = 1
) -> NodeLossReport:
    """kill -9 node agent ``victim`` while calls are pending on every node.

    ``detected_s``: from the kill until a pending call on the victim's actor failed.
    """
    nodes = [n["node_id"] for n in await cluster.nodes() if n["alive"]]
    handles: dict[str, list[ActorHandle]] = {
        n: [await cluster.spawn(Counter, node=n, cpus=0) for _ in range(per_node)] for n in nodes
    }
    victim_node = f"node-{victim}"
    victim_pids = [await h.pid() for h in handles[victim_node]]
    pending = [h.sleep.submit(120) for h in handles[victim_node]]
    await asyncio.sleep(0.1)
    start = time.monotonic()
    procs.agents[victim].kill()
    error: BaseException | None = None
    for fut in pending:
        try:
            await asyncio.wait_for(fut, 60)
        except Exception as exc:
            error = error or exc
    detected = time.monotonic() - start
    pids_gone = await until(lambda: all(gone(p) for p in victim_pids), 20.0, 0.05)
    survivors_ok = True
    for node in nodes:
        if node == victim_node:
            continue
        for h in handles[node]:
            survivors_ok &= await asyncio.wait_for(h.add(1), 30) == 1
        fresh = await cluster.spawn(Counter, 5, node=node, cpus=0)
        survivors_ok &= await asyncio.wait_for(fresh.add(1), 30) == 6
    return NodeLossReport(detected, error, pids_gone, survivors_ok)


async def head_loss(cluster: Cluster, procs: LocalProcesses, *, per_node: int = 1) -> float:
    """kill -9 the head; seconds until every agent and actor of the cluster exited (or -1)."""
    nodes = [n["node_id"] for n in await cluster.nodes() if n["alive"]]
    actor_pids = []
    for n in nodes:
        for _ in range(per_node):
            actor_pids.append(await (await cluster.spawn(Counter, node=n, cpus=0)).pid())
    pids = [a.pid for a in procs.agents] + actor_pids
    assert procs.head is not None
    start = time.monotonic()
    procs.head.kill()
    if await until(lambda: all(gone(p) for p in pids), 60.0, 0.05):
        return time.monotonic() - start
    return -1.0


def _pooled_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("asyncio_"))


@dataclass(frozen=True)
class Snapshot:
    """What a leak would grow: this process's children, fds, threads, RSS; /dev/shm files."""

    children: int
    fds: int
    threads: int
    shm_files: int
    rss_mb: float

    @classmethod
    def take(cls, pids: set[int] | None = None) -> Snapshot:
        """Measure now (rayless shared-memory segments are /dev/shm/rayless-<creator pid>-*):
        with ``pids``, only the segments those processes and this one made (other test
        processes on the machine may hold theirs), else all of them."""
        me = psutil.Process()
        prefixes = tuple(f"rayless-{p}-" for p in {*pids, os.getpid()}) if pids else ("rayless-",)
        try:
            shm = sum(1 for n in os.listdir("/dev/shm") if n.startswith(prefixes))
        except OSError:
            shm = 0
        return cls(
            children=len(descendants()),
            fds=me.num_fds(),
            # minus the loop's default executor workers ("asyncio_N"): a bounded pool
            # (min(32, cpus + 4)) that grows on demand, which a cycle may touch first
            threads=me.num_threads() - _pooled_threads(),
            shm_files=shm,
            rss_mb=me.memory_info().rss / 2**20,
        )


async def start_stop_cycle(nodes: int = 1, seen: set[int] | None = None) -> None:
    """Start a local cluster, spawn an actor, call it, store a batch, stop everything; adds the
    pids of this process's descendants while it ran to ``seen``."""
    async with Cluster.local(nodes=nodes) as cluster:
        counter = await cluster.spawn(Counter, 1)
        if await counter.add(1) != 2:
            raise AssertionError("the actor answered wrongly")
        st = await Store.create(cluster, num_units=1, name="soak-store")
        meta = await st.put(TensorDict({"x": torch.arange(1024.0)}, [1024]), partition="p")
        if (await st.get(meta))["x"].sum().item() != sum(range(1024)):
            raise AssertionError("the store returned wrong data")
        if seen is not None:
            seen |= descendants()


def growth(first: Snapshot, last: Snapshot) -> dict[str, float]:
    """How much each count grew from ``first`` to ``last``."""
    return {k: getattr(last, k) - getattr(first, k) for k in first.__dataclass_fields__}
