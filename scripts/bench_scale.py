"""The control plane's scale envelope: a real head, up to thousands of simulated nodes.

Each step starts the production head as its own process and N simulated nodes
(``rayless.actors.testing_scale``: the production node agent, many per process, with
in-process actors behind real sockets), then measures from a driver that joined with
``actors.connect``:

* head RSS per node (after the nodes joined) and per actor (after the spawns);
* head CPU share at idle (heartbeats and sweeps), with the nodes only and with the actors;
* spawn throughput end to end (actors / wall seconds, ``window`` spawns in flight) and at
  the head (actors / the head CPU seconds the spawns added to its idle heartbeat work;
  ``spawn_head_raw_per_s`` counts all of the head's CPU during the spawns);
* ``cluster.nodes()`` (every node with every actor's record) and ``rayless status``
  (``cluster.summary()``: the totals, the first 100 nodes and actors; and its render);
* a named-actor lookup (``get_actor``);
* reachability (every actor, or a sample, answers a ping);
* node loss: one node goes silent with calls pending on its actors; the seconds until every
  one of those callers failed with ActorDiedError.

Placement planning (``placement.allocation.choose`` over the step's node table, and the
ResourcePoolPlanner for a pool of that many nodes) is timed in this process.

    python scripts/bench_scale.py --quick            # 10 and 100 nodes, <= 3 min
    python scripts/bench_scale.py                    # 10, 100, 500, 2000 nodes
    python scripts/bench_scale.py --steps 2000:10000 --profile /tmp/head.prof
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import psutil

from rayless import actors
from rayless.actors.api.status import render
from rayless.actors.errors import ActorDiedError, ActorNotFoundError
from rayless.actors.testing_scale import Pinger, SimCluster
from rayless.placement.allocation import NodeState, NodeTable, choose

QUICK = [(10, 100), (100, 1000)]
FULL = [(10, 100), (100, 1000), (500, 1000), (2000, 10000)]
RAY = {  # release/perf_metrics/benchmarks/many_actors.json (64 nodes, real processes)
    "actors": 10000,
    "spawn_per_s": 551,
    "gcs_peak_gib": 1.9,
}


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 2)


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def idle_share(proc: psutil.Process, seconds: float) -> float:
    """The share of one core ``proc`` used over ``seconds`` of idle."""
    c0, t0 = _cpu(proc), time.monotonic()
    time.sleep(seconds)
    return (_cpu(proc) - c0) / (time.monotonic() - t0)


def placement_timing(nodes: int, gpus: int, decisions: int) -> dict[str, float]:
    """Per-decision time of the head's placement function over ``nodes`` nodes (the head's
    NodeTable)."""
    table = NodeTable()
    for i in range(nodes):
        info = {
            "node_id": f"n-{i}",
            "cpus": 8,
            "gpus": [{"index": g, "uuid": f"GPU-{i}-{g}"} for g in range(gpus)],
        }
        table[f"n-{i}"] = NodeState.create(info, "tcp://x:1", 0.0)
    decisions = min(decisions, nodes * gpus * 2)  # half-GPU requests, none released
    t0 = time.perf_counter()
    for _ in range(decisions):
        choose(table, 0.5, 1)
    per = (time.perf_counter() - t0) / decisions
    return {"choose_us": round(per * 1e6, 1), "choose_per_s": round(1 / per)}


def planner_timing(nodes: int, gpus: int) -> float:
    """Milliseconds for the ResourcePoolPlanner to split a ``nodes`` x ``gpus`` pool (half
    the GPUs train, a quarter rollout, a quarter env workers at 0.5 GPU each)."""
    from rayless.placement import ComponentScheduling, ResourcePoolPlanner, Scheduling

    table = {
        f"n{i}": {"ip": f"10.0.{i // 256}.{i % 256}", "CPU": 64, "GPU": gpus} for i in range(nodes)
    }
    total = nodes * gpus
    sched = ComponentScheduling(
        env_worker=[Scheduling(total // 2, 1, 0.5)],
        train_worker=Scheduling(total // 2, 1, 1),
        eval_worker=Scheduling(total // 4, 1, 1),
        buffer_worker=Scheduling("auto", 1, 0),
    )
    t0 = time.perf_counter()
    planner = ResourcePoolPlanner(sched, {"n_nodes": nodes, "node_id_to_resources": table})
    planner.plan_resource_pools("disaggregate")
    return round((time.perf_counter() - t0) * 1e3, 1)


async def spawn_all(cluster: Any, n: int, window: int) -> tuple[list[Any], dict[str, int]]:
    """Spawn ``n`` Pingers (``window`` at a time); the handles, and failures by error type."""
    gate = asyncio.Semaphore(window)

    async def one(i: int) -> Any:
        async with gate:
            return await cluster.spawn(Pinger, name=f"p-{i}", gpus=0.5, cpus=1)

    results = await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)
    failed: dict[str, int] = {}
    for r in results:
        if isinstance(r, BaseException):
            failed[type(r).__name__] = failed.get(type(r).__name__, 0) + 1
    return [r for r in results if not isinstance(r, BaseException)], failed


async def ping_all(handles: list[Any], window: int) -> int:
    gate = asyncio.Semaphore(window)

    async def one(i: int, h: Any) -> bool:
        async with gate:
            return bool(await h.ping(i) == i)

    results = await asyncio.gather(
        *(one(i, h) for i, h in enumerate(handles)), return_exceptions=True
    )
    return sum(r is True for r in results)


async def node_loss(sim: SimCluster, handles: list[Any]) -> dict[str, Any]:
    """Freeze the node of ``handles[0]`` with a call pending on each of its actors."""
    victim = handles[0].node_id
    on_it = [h for h in handles if h.node_id == victim]
    await asyncio.gather(*(h.ping(0) for h in on_it))  # connected before the node goes
    await asyncio.to_thread(sim.freeze, victim)
    t0 = time.monotonic()
    pending = [asyncio.ensure_future(h.hold(3600.0)) for h in on_it]
    results = await asyncio.gather(*pending, return_exceptions=True)
    took = time.monotonic() - t0
    died = sum(isinstance(r, ActorDiedError) for r in results)
    return {"node": victim, "callers": len(on_it), "failed_died": died, "fail_s": round(took, 2)}


async def run_step(nodes: int, n_actors: int, args: argparse.Namespace) -> dict[str, Any]:
    """One step of the sweep; returns its figures."""
    out: dict[str, Any] = {"nodes": nodes, "actors": n_actors}
    profile = args.profile if args.profile and nodes == max(n for n, _ in args.steps) else None
    sim = SimCluster(
        nodes,
        gpus=args.gpus,
        node_timeout=args.node_timeout,
        per_process=args.per_process,
        profile=profile,
    )
    try:
        sim.start_head()
        if sim.head is None:  # internal invariant: start_head() started it
            raise RuntimeError("no head process")
        head = psutil.Process(sim.head.pid)
        await asyncio.sleep(0.5)
        rss0 = head.memory_info().rss
        t0 = time.monotonic()
        await asyncio.to_thread(sim.start_nodes)
        out["join_s"] = round(time.monotonic() - t0, 2)
        out["load"] = round(os.getloadavg()[0], 1)
        await asyncio.sleep(max(args.settle, nodes / 1000))  # the joins' own work settles
        rss_nodes = head.memory_info().rss
        out["rss_base_mib"] = round(rss0 / 2**20, 1)
        out["rss_per_node_kib"] = round((rss_nodes - rss0) / nodes / 1024, 1)
        out["idle_cpu_nodes"] = round(await asyncio.to_thread(idle_share, head, args.idle), 4)
        async with actors.connect(sim.address, token=sim.token) as cluster:
            c0, t0 = _cpu(head), time.monotonic()
            handles, out["spawn_failed"] = await spawn_all(cluster, n_actors, args.window)
            wall, cpu = time.monotonic() - t0, _cpu(head) - c0
            out["spawn_e2e_per_s"] = round(n_actors / wall, 1)
            out["spawn_head_raw_per_s"] = round(n_actors / max(cpu, 1e-9), 1)
            await asyncio.sleep(args.settle)
            rss_actors = head.memory_info().rss
            out["rss_per_actor_kib"] = round((rss_actors - rss_nodes) / n_actors / 1024, 2)
            out["rss_head_mib"] = round(rss_actors / 2**20, 1)
            out["idle_cpu_actors"] = round(await asyncio.to_thread(idle_share, head, args.idle), 4)
            # the head's heartbeat work goes on during the spawns: count only what they added
            # to it (its steady idle rate, measured now that the spawns are done)
            spawn_cpu = max(cpu - out["idle_cpu_actors"] * wall, 1e-9)
            out["spawn_head_per_s"] = round(n_actors / spawn_cpu, 1)
            out["head_cpu_ms_per_spawn"] = round(spawn_cpu / n_actors * 1e3, 3)
            samples, status = [], []
            for _ in range(5):
                t0 = time.perf_counter()
                listed = await cluster.nodes()
                samples.append(time.perf_counter() - t0)
                t0 = time.perf_counter()  # what `rayless status` asks, and its render
                render(await cluster.summary(), sim.address)
                status.append(time.perf_counter() - t0)
            out["nodes_alive"] = sum(1 for n in listed if n["alive"])  # before the freeze
            out["nodes_ms"] = _median_ms(samples)
            out["status_ms"] = _median_ms(status)
            lookups = []
            for _ in range(50):
                name = random.choice(handles).name
                t0 = time.perf_counter()
                try:
                    await cluster.get_actor(name)
                except ActorNotFoundError:  # its node was declared dead meanwhile
                    out["lookup_missing"] = out.get("lookup_missing", 0) + 1
                lookups.append(time.perf_counter() - t0)
            out["lookup_ms"] = _median_ms(lookups)
            sample = (
                handles
                if len(handles) <= args.ping_sample
                else random.sample(handles, args.ping_sample)
            )
            out["pinged"] = len(sample)
            out["reachable"] = await ping_all(sample, args.window)
            out.update(await node_loss(sim, handles))
            out["node_timeout_s"] = args.node_timeout
            t0 = time.monotonic()
        out["end_session_s"] = round(time.monotonic() - t0, 2)
    finally:
        await asyncio.to_thread(sim.stop)
    out.update(placement_timing(nodes, args.gpus, args.decisions))
    out["planner_ms"] = planner_timing(nodes, args.gpus)
    return out


def derive(row: dict[str, Any]) -> dict[str, Any]:
    """Add the head's idle CPU per node heartbeat (agents beat every node_timeout / 5 s), in
    µs, so that steps run with different node timeouts compare."""
    beats_per_s = row["nodes"] * 5.0 / row["node_timeout_s"]
    row["idle_us_per_beat"] = round(row["idle_cpu_nodes"] / beats_per_s * 1e6, 1)
    return row


COLUMNS = [
    ("nodes", "nodes"),
    ("actors", "actors"),
    ("spawn_e2e_per_s", "spawn e2e /s"),
    ("spawn_head_per_s", "spawn at head /s"),
    ("choose_per_s", "choose() /s"),
    ("idle_cpu_nodes", "idle CPU (nodes)"),
    ("idle_cpu_actors", "idle CPU (+actors)"),
    ("idle_us_per_beat", "idle µs/beat"),
    ("node_timeout_s", "node_timeout s"),
    ("rss_per_node_kib", "RSS/node KiB"),
    ("rss_per_actor_kib", "RSS/actor KiB"),
    ("rss_head_mib", "head RSS MiB"),
    ("nodes_ms", "nodes() ms"),
    ("status_ms", "status ms"),
    ("lookup_ms", "lookup ms"),
    ("fail_s", "node loss → callers failed s"),
    ("planner_ms", "planner ms"),
    ("reachable", "reachable"),
]


def table(rows: list[dict[str, Any]]) -> str:
    """The results as a Markdown table."""
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for r in rows:
        cells = []
        for key, _ in COLUMNS:
            value = r.get(key)
            if key == "reachable":
                value = f"{r.get('reachable')}/{r.get('pinged')}"
            elif key == "fail_s":
                value = f"{r.get('fail_s')} ({r.get('failed_died')}/{r.get('callers')})"
            cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> bool:
    """Each cost against the step's size, as a PNG; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [
        ("spawn_e2e_per_s", "spawns/s end to end"),
        ("spawn_head_per_s", "spawns/s per head CPU-second"),
        ("idle_us_per_beat", "head idle CPU per node heartbeat (µs)"),
        ("rss_head_mib", "head RSS (MiB)"),
        ("status_ms", "status (ms)"),
        ("lookup_ms", "named lookup (ms)"),
        ("fail_s", "node loss → callers failed (s)"),
        ("choose_us", "placement decision (µs)"),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    labels = [f"{r['nodes']}n/{r['actors']}a" for r in rows]
    for ax, (key, title) in zip(axes.flat, panels, strict=False):
        ax.plot([r["nodes"] for r in rows], [r.get(key) or 0 for r in rows], "o-")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("simulated nodes (log)")
        xs, ys = [r["nodes"] for r in rows], [r.get(key) or 0 for r in rows]
        for x, y, label in zip(xs, ys, labels, strict=True):
            ax.annotate(label, (x, y), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _steps(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (s.split(":") for s in text.split(","))]


def main() -> int:
    """Parse arguments, run the sweep, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 and 100 nodes (<= 3 min)")
    parser.add_argument("--steps", type=_steps, default=None, help="NODES:ACTORS,...")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs per node")
    parser.add_argument("--node-timeout", type=float, default=5.0)
    parser.add_argument("--per-process", type=int, default=250, help="simulated nodes a process")
    parser.add_argument("--window", type=int, default=256, help="spawns/pings in flight")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle measured")
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--ping-sample", type=int, default=2000)
    parser.add_argument("--decisions", type=int, default=2000, help="choose() calls timed")
    parser.add_argument("--profile", default=None, help="cProfile the largest step's head")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--plot", default=None, help="write a PNG here")
    args = parser.parse_args()
    args.steps = args.steps or (QUICK if args.quick else FULL)
    if args.quick:
        args.idle, args.settle, args.decisions = 3.0, 0.5, 500
    print(f"# load before: {os.getloadavg()}", flush=True)
    rows = []
    for nodes, n_actors in args.steps:
        t0 = time.monotonic()
        row = asyncio.run(run_step(nodes, n_actors, args))
        row["step_s"] = round(time.monotonic() - t0, 1)
        derive(row)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"# load after: {os.getloadavg()}")
    print(table(rows))
    print(f"Ray many_actors (64 real nodes): {RAY}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "ray": RAY, "load": os.getloadavg()}, f, indent=1)
    if args.plot and not plot(rows, args.plot):
        print("matplotlib is not installed: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
