"""Benchmark rayless actors against Ray 2.60 actors, side by side in one run.

Rows (each measured ``--repeats`` times, the median is reported):

* 1:1 sync: one caller, one call in flight (``await handle.m()`` / ``ray.get(a.m.remote())``),
  calls/s and p50/p99 latency. Ours is measured on an ``async def`` and on a plain ``def``
  method (sync methods run in the actor's worker thread); Ray's on a normal (``def``) method.
* 1:1 async: ``--window`` calls in flight to one actor (``asyncio.gather`` of the handle
  calls / ``ray.get`` of a list of refs), calls/s.
* n:n async: 4 caller actors, each pipelining ``--window`` calls to its own target actor (8
  actor processes on both sides; Ray's callers are async actors awaiting refs), calls/s over
  all callers, timed by the driver.
* tensor argument: a CPU float32 torch tensor of 1, 64 and 256 MiB passed to an actor method
  that returns a scalar (its ``numel``); MB/s (10^6 bytes) of argument data. Ray's default
  path (pickled tensor through the object store) is the reference; its zero-copy numpy path
  (``t.numpy()`` argument, ``torch.from_numpy`` in the actor) is printed for information.
* spawn: time to start 8 new actors concurrently on an already started cluster and have each
  answer one call.
* start-up: seconds until ``Cluster.local(nodes=1)`` is entered (beside ``ray.init``), until
  ``Store.create(num_units=2)`` on it has returned too (it does not wait for the units), and
  until the store's first put has returned (``--startup`` only; it waits for the units).
* idle memory: the sum of PSS (the goal's figure: a page shared by the zygote and its
  children, or by every process that maps a library, is counted once, split among them),
  USS and RSS of every process
  of an idle cluster, driver excluded. Ours: ``Cluster.local(nodes=2)`` — the head, the zygote
  and the two node agents (``LocalProcesses.pids``) plus all their descendants (none when
  idle). Ray: every descendant of the process that called ``ray.init(num_cpus=8,
  include_dashboard=False)`` (gcs_server, raylet, its idle workers, the agents and monitors),
  measured once the process set has been stable for 2 s. Ray's is a *one*-node cluster.

Our calls run on ``Cluster.local(nodes=1)``; all our bench actors ask for ``cpus=0`` (the
node advertises this machine's 2 CPUs). Ray runs in a subprocess of this script (its own
event loop and signal handling never meet ours) that is started first and stays up, and always
ends with ``ray.shutdown()``; the call rows alternate, repeat by repeat (ours ``async def``,
ours ``def``, Ray's), so that on a shared machine both sides see the same load; Ray's other
rows run at the end.
Goals (ours / Ray): sync ≥ 3x, async ≥ 5x, 64 MiB tensor ≥ 5x, spawn ≤ 1/3, PSS ≤ 1/3;
start-up ≤ 1 s; pipelined ``def`` ≥ 0.8x pipelined ``async def``. Memory is measured with both
zygote modes (eager warm-up, the default, and lazy).

``--load N`` then measures the call rows (1:1 sync, pipelined, n:n) again, both sides, with N
CPU-burning processes (``while 1: pass``) beside them, and prints that table too: speed that
holds only on an idle machine is not a result. The burners are killed at the end, also on
Ctrl-C or SIGTERM (and die with this script if it is killed outright).

``--depths 200,3000,10000`` measures only the depth rows, both sides alternating: N calls to a
``def`` method submitted at once and then gathered (``handle.f()`` N times /
``ray.get`` of N refs), again and again (at least 30,000 calls per row), with the CPU each side
spent per call (µs: the driver's and the actor process's own, from ``time.process_time``), so
that a cost that grows with the calls in flight shows, and a raw asyncio UNIX-socket echo of
the same message at the same depths (``scripts/bench_raw_echo.py``: the physical anchor; goal
ours ≥ 0.3x of it, and the slowest depth within 20% of the fastest); ``--load N`` repeats them
beside N burners.

``--startup`` measures only our start-up and idle-memory rows (with the PSS and USS of each
process), and with ``--load N`` the start-up rows again beside N burners; no Ray.

    python scripts/bench_actors.py [--quick] [--skip-ray] [--repeats 3] [--load 2] [--json OUT]
    python scripts/bench_actors.py --startup [--repeats 3] [--load 2]
    python scripts/bench_actors.py --depths 200,3000,10000 [--repeats 3] [--load 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its report module
import torch
from bench_actors_report import (
    N_PAIRS,
    N_SPAWN,
    build_rows,
    call_rows,
    def_vs_async,
    median,
    percentile,
    print_table,
    tree_memory,
    wait_stable,
)
from bench_raw_echo import echo_server, raw_depth

MiB = 2**20
RAY_TIMEOUT = 900.0


@dataclass(frozen=True)
class Sizes:
    """Iteration counts of one run."""

    sync_calls: int
    window: int
    pipelined_calls: int
    nn_calls_per_caller: int
    tensor_mib: tuple[int, ...]
    tensor_iters: dict[int, int] = field(default_factory=dict)
    repeats: int = 3


def sizes_for(quick: bool, repeats: int | None) -> Sizes:
    """The iteration counts for ``--quick`` or a full run."""
    if quick:
        return Sizes(
            sync_calls=1000,
            window=200,
            pipelined_calls=3000,
            nn_calls_per_caller=1000,
            tensor_mib=(1, 64),
            tensor_iters={1: 30, 64: 5},
            repeats=repeats or 1,
        )
    return Sizes(
        sync_calls=3000,
        window=200,
        pipelined_calls=10000,
        nn_calls_per_caller=2500,
        tensor_mib=(1, 64, 256),
        tensor_iters={1: 100, 64: 10, 256: 4},
        repeats=repeats or 3,
    )


# -- actor classes of our side (importable by the actor processes as __mp_main__) ------------


class Target:
    """The callee: trivial sync and async methods and a tensor sink."""

    def ping(self) -> int:
        """A plain method: runs in the actor's worker thread."""
        return 1

    async def aping(self) -> int:
        """An async method: runs on the actor's loop."""
        return 1

    def take(self, t: torch.Tensor) -> int:
        """Receive a tensor, return a scalar."""
        return int(t.numel())

    async def atake(self, t: torch.Tensor) -> int:
        """Receive a tensor on the loop, return a scalar."""
        return int(t.numel())

    def cpu(self) -> float:
        """This actor process's CPU seconds so far."""
        return time.process_time()


class Caller:
    """An actor that pipelines calls to a target actor (for the n:n row)."""

    async def run(self, target: Any, method: str, n: int, window: int) -> float:
        """Make ``n`` calls with ``window`` in flight; returns the seconds it took."""
        start = time.perf_counter()
        await pipelined(lambda: getattr(target, method)(), n, window)
        return time.perf_counter() - start


async def pipelined(call: Callable[[], Awaitable[Any]], n: int, window: int) -> None:
    """Run ``n`` calls keeping at most ``window`` in flight (windows issued back to back)."""
    done = 0
    while done < n:
        k = min(window, n - done)
        await asyncio.gather(*[call() for _ in range(k)])
        done += k


# -- our side -------------------------------------------------------------------------------


def zygote_warm(pid: int) -> bool:
    """Whether the process ``pid`` has torch's shared library mapped (its warm-up is done)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False


async def ours_memory(preload: str) -> dict[str, float]:
    """Idle memory of ``Cluster.local(nodes=2, zygote_preload=preload)``: head, zygote, agents
    and descendants, once the zygote's warm-up (eager) has finished and things settled."""
    from rayless.actors import Cluster

    async with Cluster.local(nodes=2, zygote_preload=preload) as cluster:
        local = cluster._local
        if local is None or local.zygote_proc is None:
            raise RuntimeError("Cluster.local() has no LocalProcesses with a zygote")
        if preload == "eager":
            await until_warm(local.zygote_proc.pid)
        await asyncio.sleep(2.0)  # let startup allocations settle
        return tree_memory(local.pids)


async def until_warm(pid: int, timeout: float = 120.0) -> None:
    """Wait for the torch template ``pid`` to have finished its warm-up: torch's library
    mapped (the import under way) and then no CPU time spent for 1 s (tensordict in too).
    RuntimeError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    proc = psutil.Process(pid)
    last, still_since = -1.0, time.monotonic()
    while True:
        now = time.monotonic()
        if zygote_warm(pid):
            cpu = sum(proc.cpu_times()[:2])
            if cpu != last:
                last, still_since = cpu, now
            elif now - still_since >= 1.0:
                return
        if now > deadline:
            raise RuntimeError(f"the zygote did not finish its warm-up within {timeout:g} s")
        await asyncio.sleep(0.1)


def per_process(pids: Sequence[int]) -> list[str]:
    """``pid name PSS (USS) MB`` of each of ``pids`` and their descendants."""
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        p = psutil.Process(pid)
        procs[pid] = p
        procs.update({c.pid: c for c in p.children(recursive=True)})
    out = []
    for p in procs.values():
        info = p.memory_full_info()
        name = " ".join(p.cmdline()[2:4])[-50:]
        out.append(f"{p.pid} {name} {info.pss / 1e6:.1f} ({info.uss / 1e6:.1f})")
    return out


async def startup_rows(s: Sizes, log: Callable[[str], None], memory: bool) -> dict[str, Any]:
    """The start-up rows (and, with ``memory``, the idle-memory ones, per process too)."""
    from rayless.actors import Cluster
    from rayless.store import Store

    res: dict[str, Any] = {}
    reps = range(s.repeats)
    log("ours: start-up of Cluster.local(nodes=1) [+ Store.create(num_units=2)]")
    res["startup_runs"] = [await ours_startup(False) for _ in reps]
    res["startup_store_runs"] = [await ours_startup(True) for _ in reps]
    res["startup_store_put_runs"] = [await ours_startup(True, put=True) for _ in reps]
    if not memory:
        return res
    for preload in ("eager", "lazy"):
        log(f"ours: idle memory of Cluster.local(nodes=2, zygote_preload={preload!r})")
        async with Cluster.local(nodes=2, zygote_preload=preload) as cluster:
            local = cluster._local
            assert local is not None and local.zygote_proc is not None
            if preload == "eager":
                await until_warm(local.zygote_proc.pid)
            await asyncio.sleep(2.0)
            res[f"memory_{preload}"] = tree_memory(local.pids)
            res[f"per_process_{preload}"] = per_process(local.pids)
    log("ours: idle memory of Cluster.local(nodes=1) + Store.create(num_units=2)")
    async with Cluster.local(nodes=1) as cluster:
        store = await Store.create(cluster, num_units=2)
        await store.ready()
        local = cluster._local
        assert local is not None and local.zygote_proc is not None
        await until_warm(local.zygote_proc.pid)
        await asyncio.sleep(2.0)
        res["memory_store"] = tree_memory(local.pids)
        res["per_process_store"] = per_process(local.pids)
        await store.aclose()
    return res


def print_startup(res: dict[str, Any], title: str) -> None:
    """The start-up runs (and memory) of :func:`startup_rows`."""
    print(f"\n{title}")
    for key in ("startup_runs", "startup_store_runs", "startup_store_put_runs"):
        runs = res[key]
        print(f"{key}: median {median(runs):.2f} s of {', '.join(f'{r:.2f}' for r in runs)}")
    for key in ("eager", "lazy", "store"):
        if f"memory_{key}" in res:
            m = res[f"memory_{key}"]
            print(f"memory {key}: PSS {m.get('pss_mb', 0):.0f} MB, USS {m.get('uss_mb', 0):.0f}")
            for line in res[f"per_process_{key}"]:
                print(f"    {line}")


async def ours_startup(with_store: bool, put: bool = False) -> float:
    """Seconds until ``Cluster.local(nodes=1)`` is entered (and, with ``with_store``, a
    ``Store.create(num_units=2)`` on it has returned; with ``put``, its first put of 1,024
    tiny rows too, which waits for the units that create did not wait for)."""
    from tensordict import TensorDict

    from rayless.actors import Cluster
    from rayless.store import Store

    start = time.perf_counter()
    async with Cluster.local(nodes=1) as cluster:
        if with_store:
            store = await Store.create(cluster, num_units=2)
            if put:
                await store.put(TensorDict({"x": torch.arange(1024)}, [1024]), partition="p")
        elapsed = time.perf_counter() - start
        if with_store:
            await store.aclose()
    return elapsed


async def ours_sync(method: Any, n: int) -> dict[str, float]:
    """One call in flight: calls/s, p50 and p99 latency (µs)."""
    for _ in range(min(200, n)):
        await method()
    lat: list[float] = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await method()
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    return {
        "rate": n / total,
        "p50_us": percentile(lat, 0.5) * 1e6,
        "p99_us": percentile(lat, 0.99) * 1e6,
    }


async def ours_pipelined(method: Any, n: int, window: int) -> float:
    """Calls/s with ``window`` calls in flight to one actor."""
    await pipelined(method, min(n, 2 * window), window)
    start = time.perf_counter()
    await pipelined(method, n, window)
    return n / (time.perf_counter() - start)


async def ours_nn(callers: list[Any], targets: list[Any], method: str, s: Sizes) -> float:
    """Calls/s of N_PAIRS caller actors each pipelining to its own target."""
    warm = [c.run(t, method, s.window, s.window) for c, t in zip(callers, targets, strict=True)]
    await asyncio.gather(*warm)
    start = time.perf_counter()
    runs = [
        c.run(t, method, s.nn_calls_per_caller, s.window)
        for c, t in zip(callers, targets, strict=True)
    ]
    await asyncio.gather(*runs)
    return len(callers) * s.nn_calls_per_caller / (time.perf_counter() - start)


async def ours_tensor(method: Any, mib: int, iters: int) -> float:
    """MB/s of a ``mib`` MiB float32 tensor argument (the actor returns a scalar)."""
    t = torch.ones(mib * MiB // 4)
    if await method(t) != t.numel():
        raise RuntimeError("the actor saw a different tensor")
    start = time.perf_counter()
    for _ in range(iters):
        await method(t)
    return iters * t.nbytes / (time.perf_counter() - start) / 1e6


async def ours_spawn(cluster: Any) -> float:
    """Seconds to spawn N_SPAWN actors concurrently and have each answer one call."""
    start = time.perf_counter()
    handles = await asyncio.gather(*[cluster.spawn(Target, cpus=0) for _ in range(N_SPAWN)])
    await asyncio.gather(*[h.ping() for h in handles])
    elapsed = time.perf_counter() - start
    for h in handles:
        await cluster.kill(h)
    return elapsed


DEPTH_CALLS = 30_000  # calls per depth row at least


async def ours_depth(target: Any, depth: int) -> dict[str, float]:
    """``depth`` calls to a ``def`` method submitted at once, then gathered, repeated: calls/s
    and CPU µs per call of the driver and of the actor process."""
    total = max(DEPTH_CALLS, 3 * depth)
    await asyncio.gather(*[target.ping() for _ in range(min(depth, 1000))])  # warm
    actor0, driver0, start = await target.cpu(), time.process_time(), time.perf_counter()
    done = 0
    while done < total:
        await asyncio.gather(*[target.ping() for _ in range(depth)])
        done += depth
    elapsed = time.perf_counter() - start
    driver = time.process_time() - driver0
    actor = await target.cpu() - actor0
    return {
        "rate": done / elapsed,
        "driver_us": driver / done * 1e6,
        "actor_us": actor / done * 1e6,
    }


async def depth_rows(
    s: Sizes, depths: list[int], log: Callable[[str], None], ray: RayPeer | None
) -> dict[int, dict[str, dict[str, float]]]:
    """Each depth on both sides, alternating repeat by repeat; medians."""
    from rayless.actors import Cluster

    runs: dict[int, dict[str, list[dict[str, float]]]] = {
        d: {"ours": [], "ray": [], "raw": []} for d in depths
    }
    async with Cluster.local(nodes=1) as cluster:
        target = await cluster.spawn(Target, cpus=0)
        with echo_server() as raw_path:
            for _ in range(s.repeats):
                for depth in depths:
                    log(f"ours: depth {depth}")
                    runs[depth]["ours"].append(await ours_depth(target, depth))
                    if ray is not None:
                        log(f"ray: depth {depth}")
                        runs[depth]["ray"].append(await ray.row(f"depth:{depth}"))
                    log(f"raw asyncio echo: depth {depth}")
                    total = max(DEPTH_CALLS, 3 * depth)
                    runs[depth]["raw"].append(await raw_depth(raw_path, depth, total))
    return {
        d: {
            side: {k: median([r[k] for r in rs]) for k in rs[0]} for side, rs in sides.items() if rs
        }
        for d, sides in runs.items()
    }


def print_depths(res: dict[int, dict[str, dict[str, float]]], title: str) -> None:
    """The depth table: calls/s and CPU µs per call (driver / actor) on each side."""
    print(f"\ncalls submitted at once to one def method — {title}")
    print(f"{'in flight':>10} {'ours calls/s':>13} {'ours µs drv/actor':>18} "
          f"{'Ray calls/s':>12} {'Ray µs drv/actor':>17} {'ratio':>6}")  # fmt: skip
    for depth, sides in res.items():
        o, r = sides["ours"], sides.get("ray")
        line = f"{depth:>10,} {o['rate']:>13,.0f} {o['driver_us']:>8.1f} / {o['actor_us']:<7.1f}"
        if r:
            line += f" {r['rate']:>12,.0f} {r['driver_us']:>7.1f} / {r['actor_us']:<7.1f}"
            line += f" {o['rate'] / r['rate']:>5.2f}x"
        print(line)
    raw = {d: sides["raw"] for d, sides in res.items() if sides.get("raw")}
    if raw:
        print("raw asyncio UNIX-socket echo of the same message (scripts/bench_raw_echo.py):")
        for depth, w in raw.items():
            o = res[depth]["ours"]
            print(
                f"{depth:>10,} {w['rate']:>13,.0f} msgs/s, {w['driver_us']:.1f} µs client CPU; "
                f"ours / raw {o['rate'] / w['rate']:.2f}x"
            )
    rates = [sides["ours"]["rate"] for sides in res.values()]
    print(f"ours: slowest depth / fastest depth {min(rates) / max(rates):.2f} (goal >= 0.8)")


async def run_ours(
    s: Sizes, log: Callable[[str], None], ray: RayPeer | None, calls_only: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every row on our side (only the call rows with ``calls_only``), and Ray's call rows,
    measured in turn with ours, repeat by repeat (both see the same machine); values are
    medians over ``s.repeats`` runs."""
    from rayless.actors import Cluster

    res: dict[str, Any] = {}
    ray_runs: dict[str, list[Any]] = {"sync": [], "pipe": [], "nn": []}

    async def ray_row(name: str) -> None:
        if ray is not None:
            log(f"ray: {name}")
            ray_runs[name].append(await ray.row(name))

    reps = range(s.repeats)
    if not calls_only:
        for preload in ("eager", "lazy"):
            log(f"ours: idle memory of Cluster.local(nodes=2, zygote_preload={preload!r})")
            res["memory" if preload == "eager" else "memory_lazy"] = await ours_memory(preload)
        log("ours: start-up of Cluster.local(nodes=1) [+ Store.create(num_units=2)]")
        res["startup"] = median([await ours_startup(False) for _ in reps])
        res["startup_store"] = median([await ours_startup(True) for _ in reps])
    log("ours: starting Cluster.local(nodes=1)")
    async with Cluster.local(nodes=1) as cluster:
        target = await cluster.spawn(Target, cpus=0)
        methods = {"async_def": target.aping, "def": target.ping}
        sync: dict[str, list[dict[str, float]]] = {k: [] for k in methods}
        pipe: dict[str, list[float]] = {k: [] for k in methods}
        nn: dict[str, list[float]] = {k: [] for k in methods}
        for _ in reps:
            for kind, m in methods.items():
                log(f"ours: 1:1 sync ({kind})")
                sync[kind].append(await ours_sync(m, s.sync_calls))
            await ray_row("sync")
        for _ in reps:
            for kind, m in methods.items():
                log(f"ours: 1:1 pipelined ({kind})")
                pipe[kind].append(await ours_pipelined(m, s.pipelined_calls, s.window))
            await ray_row("pipe")
        callers = await asyncio.gather(*[cluster.spawn(Caller, cpus=0) for _ in range(N_PAIRS)])
        targets = await asyncio.gather(*[cluster.spawn(Target, cpus=0) for _ in range(N_PAIRS)])
        for _ in reps:
            for kind, meth in (("async_def", "aping"), ("def", "ping")):
                log(f"ours: n:n ({kind})")
                nn[kind].append(await ours_nn(callers, targets, meth, s))
            await ray_row("nn")
        for h in [*callers, *targets]:
            await cluster.kill(h)
        for kind in methods:
            res[f"sync_{kind}"] = {k: median([r[k] for r in sync[kind]]) for k in sync[kind][0]}
            res[f"pipe_{kind}"] = median(pipe[kind])
            res[f"nn_{kind}"] = median(nn[kind])
        ray_res: dict[str, Any] = {}
        if ray is not None:
            runs = ray_runs["sync"]
            ray_res["sync"] = {k: median([r[k] for r in runs]) for k in runs[0]}
            ray_res["pipe"] = median(ray_runs["pipe"])
            ray_res["nn"] = median(ray_runs["nn"])
        if calls_only:
            return res, ray_res
        for mib in s.tensor_mib:
            log(f"ours: tensor {mib} MiB")
            iters = s.tensor_iters[mib]
            res[f"tensor_{mib}"] = median(
                [await ours_tensor(target.take, mib, iters) for _ in reps]
            )
        log("ours: spawn")
        res["spawn"] = median([await ours_spawn(cluster) for _ in reps])
    return res, ray_res


# -- Ray's side (run in a subprocess: ``--ray-part``) ----------------------------------------


class RaySide:
    """Ray's actors and the measurement of each row on them (in the ``--ray-part`` child)."""

    def __init__(self, s: Sizes, log: Callable[[str], None]) -> None:
        import logging

        import ray

        @ray.remote
        class RayTarget:
            def ping(self) -> int:
                return 1

            def take(self, t: Any) -> int:
                return int(t.numel())

            def take_np(self, a: Any) -> int:
                return int(torch.from_numpy(a).numel())

            def cpu(self) -> float:
                return time.process_time()

        @ray.remote
        class RayPing:  # no torch reference: its workers need not import torch
            def ping(self) -> int:
                return 1

        @ray.remote
        class RayCaller:
            async def run(self, target: Any, n: int, window: int) -> float:
                start = time.perf_counter()
                done = 0
                while done < n:
                    k = min(window, n - done)
                    await asyncio.gather(*[target.ping.remote() for _ in range(k)])
                    done += k
                return time.perf_counter() - start

        self.ray, self.s, self.log = ray, s, log
        self.RayPing = RayPing
        log("ray: ray.init(num_cpus=8, include_dashboard=False)")
        t0 = time.perf_counter()
        ray.init(
            num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
        )
        self.init_s = time.perf_counter() - t0
        log("ray: waiting for an idle, stable process set")
        wait_stable(os.getpid())
        self.memory = tree_memory([c.pid for c in psutil.Process().children()])
        self.target = RayTarget.remote()  # type: ignore[attr-defined]
        self.get(self.target.ping.remote())
        self.callers = [RayCaller.remote() for _ in range(N_PAIRS)]  # type: ignore[attr-defined]
        self.targets = [RayPing.remote() for _ in range(N_PAIRS)]  # type: ignore[attr-defined]
        self._warm = False

    def get(self, x: Any) -> Any:
        """``ray.get`` with the benchmark's deadline."""
        return self.ray.get(x, timeout=120)

    def warm(self) -> None:
        """One round of every call row, unmeasured (workers started, connections made)."""
        if self._warm:
            return
        self._warm = True
        s = self.s
        for _ in range(min(200, s.sync_calls)):
            self.get(self.target.ping.remote())
        self.pipe_once(2 * s.window)
        pairs = zip(self.callers, self.targets, strict=True)
        self.get([c.run.remote(t, s.window, s.window) for c, t in pairs])

    def sync_once(self) -> dict[str, float]:
        """One call in flight: calls/s, p50 and p99 latency (µs)."""
        self.warm()
        n = self.s.sync_calls
        lat: list[float] = []
        start = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            self.get(self.target.ping.remote())
            lat.append(time.perf_counter() - t)
        total = time.perf_counter() - start
        return {
            "rate": n / total,
            "p50_us": percentile(lat, 0.5) * 1e6,
            "p99_us": percentile(lat, 0.99) * 1e6,
        }

    def pipe_once(self, n: int = 0) -> float:
        """Calls/s with ``window`` in flight to one actor."""
        s = self.s
        n = n or s.pipelined_calls
        start = time.perf_counter()
        done = 0
        while done < n:
            k = min(s.window, n - done)
            self.get([self.target.ping.remote() for _ in range(k)])
            done += k
        return n / (time.perf_counter() - start)

    def depth_once(self, depth: int) -> dict[str, float]:
        """``depth`` refs submitted at once, then ``ray.get``, repeated: calls/s and CPU µs
        per call of the driver and the actor."""
        total = max(DEPTH_CALLS, 3 * depth)
        self.get([self.target.ping.remote() for _ in range(min(depth, 1000))])
        actor0, driver0 = self.get(self.target.cpu.remote()), time.process_time()
        start = time.perf_counter()
        done = 0
        while done < total:
            self.get([self.target.ping.remote() for _ in range(depth)])
            done += depth
        elapsed = time.perf_counter() - start
        driver = time.process_time() - driver0
        actor = self.get(self.target.cpu.remote()) - actor0
        return {
            "rate": done / elapsed,
            "driver_us": driver / done * 1e6,
            "actor_us": actor / done * 1e6,
        }

    def nn_once(self) -> float:
        """Calls/s of N_PAIRS async caller actors each pipelining to its own target."""
        self.warm()
        n = self.s.nn_calls_per_caller
        start = time.perf_counter()
        pairs = zip(self.callers, self.targets, strict=True)
        self.get([c.run.remote(t, n, self.s.window) for c, t in pairs])
        return N_PAIRS * n / (time.perf_counter() - start)

    def other_rows(self) -> dict[str, Any]:
        """Memory, tensors and spawn (medians over ``repeats``)."""
        ray, s, log, get = self.ray, self.s, self.log, self.get
        reps = range(s.repeats)
        res: dict[str, Any] = {"init_s": self.init_s, "memory": self.memory}
        for h in [*self.callers, *self.targets]:
            ray.kill(h)
        self.callers, self.targets = [], []
        for mib in s.tensor_mib:
            log(f"ray: tensor {mib} MiB")
            t = torch.ones(mib * MiB // 4)
            a = t.numpy()
            iters = s.tensor_iters[mib]

            def tensor_once(method: Any, value: Any, t: torch.Tensor, iters: int) -> float:
                if get(method.remote(value)) != t.numel():
                    raise RuntimeError("the actor saw a different tensor")
                start = time.perf_counter()
                for _ in range(iters):
                    get(method.remote(value))
                return iters * t.nbytes / (time.perf_counter() - start) / 1e6

            res[f"tensor_{mib}"] = median(
                [tensor_once(self.target.take, t, t, iters) for _ in reps]
            )
            res[f"tensor_np_{mib}"] = median(
                [tensor_once(self.target.take_np, a, t, iters) for _ in reps]
            )
            del t, a

        def spawn_once() -> float:
            start = time.perf_counter()
            fresh = [self.RayPing.remote() for _ in range(N_SPAWN)]  # type: ignore[attr-defined]
            get([h.ping.remote() for h in fresh])
            elapsed = time.perf_counter() - start
            for h in fresh:
                ray.kill(h)
            return elapsed

        log("ray: spawn")
        res["spawn"] = median([spawn_once() for _ in reps])
        return res

    def close(self) -> None:
        """``ray.shutdown()``."""
        self.ray.shutdown()


def serve_ray(s: Sizes, log: Callable[[str], None]) -> int:
    """The ``--ray-part`` child: answer one row per line of stdin (``sync``, ``pipe``, ``nn``,
    ``other``; ``quit`` ends it) with a ``RAY_ROW <json>`` line, so that the parent can
    alternate Ray's measurements with its own (both then see the same machine)."""
    side = RaySide(s, log)
    try:
        rows: dict[str, Callable[[], Any]] = {
            "sync": side.sync_once,
            "pipe": side.pipe_once,
            "nn": side.nn_once,
            "other": side.other_rows,
        }
        print("RAY_READY", flush=True)
        for line in sys.stdin:
            name = line.strip()
            if name == "quit":
                break
            if name.startswith("depth:"):
                print("RAY_ROW " + json.dumps(side.depth_once(int(name[6:]))), flush=True)
                continue
            print("RAY_ROW " + json.dumps(rows[name]()), flush=True)
    finally:
        side.close()
    return 0


class RayPeer:
    """The parent's end of the ``--ray-part`` child (``serve_ray``)."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        cmd = [sys.executable, os.path.abspath(__file__), "--ray-part"]
        cmd += ["--repeats", str(args.repeats or 0)] + (["--quick"] if args.quick else [])
        self.log = log
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read("RAY_READY")

    def _read(self, prefix: str) -> str:
        assert self.proc.stdout is not None  # internal invariant: opened with PIPE
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"ray: the child exited ({self.proc.wait()}) before {prefix}")

    def row_sync(self, name: str) -> Any:
        """One measurement of row ``name`` (blocking)."""
        assert self.proc.stdin is not None  # internal invariant: opened with PIPE
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return json.loads(self._read("RAY_ROW "))

    async def row(self, name: str) -> Any:
        """One measurement of row ``name``, within RAY_TIMEOUT (the child is killed past it).

        Raises:
            TimeoutError: no result in time.
        """
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.row_sync, name), RAY_TIMEOUT)
        except asyncio.TimeoutError:
            self.proc.kill()
            raise

    def close(self) -> None:
        """Tell the child to quit (ray.shutdown); kill it if it does not within 60 s."""
        try:
            if self.proc.stdin is not None and self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


# The burner sets PR_SET_PDEATHSIG first (prctl option 1): it dies with this script even if
# the script is killed outright, then spins.
BURNER = "import ctypes, signal\nctypes.CDLL(None).prctl(1, signal.SIGKILL)\nwhile 1: pass"


@contextlib.contextmanager
def cpu_load(n: int, log: Callable[[str], None]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` CPU-burning processes beside the benchmark while the block runs; killed at its
    end, whatever ends it (Ctrl-C and SIGTERM included)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.DEVNULL))
        log(f"load: {n} CPU-burning processes {[p.pid for p in procs]}")
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        if procs:
            log(f"load: {len(procs)} burners killed")


def _load_avg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def _sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # finally blocks run: the burners are killed


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run both sides, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations, no 256 MiB row")
    parser.add_argument("--skip-ray", action="store_true", help="measure only rayless")
    parser.add_argument(
        "--repeats", type=int, default=0, help="runs per row (median); default 3, 1 with --quick"
    )
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="also measure the call rows with N CPU-burning processes beside them",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the raw results to OUT")
    parser.add_argument(
        "--startup", action="store_true", help="only our start-up and idle-memory rows"
    )
    parser.add_argument(
        "--depths",
        metavar="N,N,...",
        help="only the depth rows: N calls submitted at once (e.g. 200,3000,10000)",
    )
    parser.add_argument("--ray-part", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 0:
        parser.error("--repeats must be >= 0")
    if args.load < 0:
        parser.error("--load must be >= 0")
    s = sizes_for(args.quick, args.repeats or None)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    if args.ray_part:
        return serve_ray(s, log)
    signal.signal(signal.SIGTERM, _sigterm)
    load_before = _load_avg()
    if args.startup:
        print_startup(asyncio.run(startup_rows(s, log, True)), f"start-up; {load_before}")
        if args.load:
            with cpu_load(args.load, log):
                before = _load_avg()
                res = asyncio.run(startup_rows(s, log, False))
                print_startup(res, f"start-up, {args.load} burners; {before}, {_load_avg()}")
        return 0
    if args.depths:
        depths = [int(d) for d in args.depths.split(",") if d.strip()]
        if not depths or min(depths) < 1:
            parser.error("--depths takes positive ints, e.g. 200,3000,10000")
        peer = None if args.skip_ray else RayPeer(args, log)
        try:
            res = asyncio.run(depth_rows(s, depths, log, peer))
            print_depths(
                res, f"{os.cpu_count()} CPUs, repeats={s.repeats}; {load_before}, {_load_avg()}"
            )
            if args.load:
                with cpu_load(args.load, log):
                    before = _load_avg()
                    res = asyncio.run(depth_rows(s, depths, log, peer))
                    print_depths(res, f"{args.load} burners; {before}, {_load_avg()}")
        finally:
            if peer is not None:
                peer.close()
        return 0
    peer = None if args.skip_ray else RayPeer(args, log)
    loaded: tuple[dict[str, Any], dict[str, Any] | None, str, str] | None = None
    try:
        ours, ray_calls = asyncio.run(run_ours(s, log, peer))
        load_after = _load_avg()
        if args.load:
            with cpu_load(args.load, log):
                before = _load_avg()
                ours_l, ray_l = asyncio.run(run_ours(s, log, peer, calls_only=True))
                loaded = (ours_l, ray_l if peer is not None else None, before, _load_avg())
        ray = None if peer is None else {**ray_calls, **peer.row_sync("other")}
    finally:
        if peer is not None:
            peer.close()
    rows = build_rows(ours, ray, s)
    print()
    print(
        f"rayless vs Ray 2.60 — {os.cpu_count()} CPUs, repeats={s.repeats} (medians), "
        f"window={s.window}; {load_before} before, {load_after} after"
    )
    print_table(rows)
    print(def_vs_async(ours))
    if loaded is not None:
        ours_l, ray_lo, before, after = loaded
        rows += [
            dataclasses.replace(r, name=f"{r.name} [load {args.load}]")
            for r in call_rows(ours_l, ray_lo, s)
        ]
        print()
        print(
            f"the call rows with {args.load} CPU-burning processes beside them; "
            f"{before} at the start, {after} at the end"
        )
        print_table(call_rows(ours_l, ray_lo, s))
        print(def_vs_async(ours_l))
    print()
    print(f"memory, ours ({ours['memory']['count']:.0f} processes): {ours['memory']['names']}")
    if ray is not None:
        print(f"memory, ray ({ray['memory']['count']:.0f} processes): {ray['memory']['names']}")
        print(f"ray.init() took {ray['init_s']:.2f}s")
    if args.json:
        with open(args.json, "w") as f:
            raw: dict[str, Any] = {"ours": ours, "ray": ray, "sizes": s.__dict__}
            if loaded is not None:
                raw["load"] = {"n": args.load, "ours": loaded[0], "ray": loaded[1]}
            json.dump(raw, f, indent=1, default=str)
    misses = [r.name for r in rows if r.verdict() == "MISS"]
    print(f"\n{len(misses)} goal(s) missed" + (": " + "; ".join(misses) if misses else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
