"""One look at a whole cluster, for ``rayless status --prometheus`` and ``rayless dashboard``:
:func:`snapshot` gathers it, :func:`exposition` writes it in the Prometheus text format.

Gathered, in one session of the caller's (it spawns nothing):

* the head's nodes (alive, CPUs, GPUs total and free, each GPU's used share and memory) and
  actors (state, restarts, node, pid, last death);
* each live actor's calls and errors per method and its queue depth, read through its debug
  listener (``metrics``; ``actors.core.callstats``): actors without a listener
  (``RAYLESS_DEBUG=0``) have none;
* every store of the cluster (the actors of class ``StoreController``, or the names given):
  ``Store.metrics()``'s partitions, units and rates (``rayless.store.metrics``);
* every weight sync (actors of class ``WeightRegistry``): its newest version and relays.

Nothing here imports torch.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterable
from typing import Any

from rayless.actors.api import status as cluster_status
from rayless.actors.protocol.messages import ActorState
from rayless.transport.errors import RaylessError

__all__ = ["actor_stats", "exposition", "snapshot", "snapshot_of"]

STORE_CLASS = "StoreController"
WEIGHTS_CLASS = "WeightRegistry"
STATES = tuple(state.value for state in ActorState)  # pending, alive, restarting, dead


def _actor_stats(records: list[dict[str, Any]], token: str, timeout: float) -> dict[str, Any]:
    """Each reachable actor's call counters by actor id (blocking; run in a thread)."""
    from rayless.actors.control.debug import open_actor

    out: dict[str, Any] = {}
    for record in records:
        try:
            conn = open_actor(record, token, "metrics", timeout)
            try:
                line = conn.readline(limit=1 << 22)
            finally:
                conn.sock.close()
            out[str(record["actor_id"])] = json.loads(line)
        except (OSError, ValueError, RaylessError):
            continue  # no listener, or it did not answer: no counters for it
    return out


async def snapshot(
    address: str, token: str, *, stores: Iterable[str] = (), timeout: float = 10.0
) -> dict[str, Any]:
    """The cluster now, in a session of its own (:func:`snapshot_of`).

    Raises:
        StatusError: the head did not answer, rejected the token, or the address is bad.
    """
    async with cluster_status.look(address, token, timeout) as cluster:
        return await snapshot_of(cluster, stores=stores, timeout=timeout)


async def actor_stats(cluster: Any, timeout: float = 10.0) -> dict[str, Any]:
    """Each reachable actor's counters by actor id: ``calls`` and ``errors`` per method since
    its process started, ``queued`` and ``running`` now (``actors.core.callstats``). Asks
    nothing of the actors' methods, so reading it changes no count.

    Raises:
        RaylessError, asyncio.TimeoutError: the head did not answer.
    """
    from rayless.actors.api.debugger import DebugCliError, endpoints

    try:
        listeners = await endpoints(cluster.info.address, cluster.info.token, timeout)
    except DebugCliError:
        listeners = []
    return await asyncio.to_thread(_actor_stats, listeners, cluster.info.token, timeout)


async def snapshot_of(
    cluster: Any, *, stores: Iterable[str] = (), timeout: float = 10.0
) -> dict[str, Any]:
    """The cluster now, through the connected ``cluster``: ``nodes`` (with their
    ``actors``), ``stats`` (per actor id), ``stores`` (``Store.metrics()`` each),
    ``weights`` (name → info), ``time``.

    Raises:
        RaylessError, asyncio.TimeoutError: the head or an actor did not answer.
    """
    nodes = await asyncio.wait_for(cluster.nodes(), timeout)
    actors = [a for n in nodes for a in n.get("actors", [])]
    stats = await actor_stats(cluster, timeout)
    names = list(stores) or [
        a["name"]
        for a in actors
        if a.get("cls") == STORE_CLASS and a.get("state") == ActorState.ALIVE
    ]
    store_metrics = [await _store(cluster, name, timeout) for name in names]
    weights = {}
    for a in actors:
        if a.get("cls") == WEIGHTS_CLASS and a.get("state") == ActorState.ALIVE:
            handle = await asyncio.wait_for(cluster.get_actor(a["name"]), timeout)
            from rayless.weights import messages  # noqa: F401 (its answer is a SyncInfo)

            info = await asyncio.wait_for(handle.info(), timeout)
            weights[a["name"]] = {"latest": info.latest, "relays": dict(info.relays)}
    return {
        "time": time.time(),
        "nodes": nodes,
        "stats": stats,
        "stores": store_metrics,
        "weights": weights,
    }


async def _store(cluster: Any, name: str, timeout: float) -> dict[str, Any]:
    from rayless.store.metrics import collect

    controller = await asyncio.wait_for(cluster.get_actor(name), timeout)
    units, store_id = await asyncio.wait_for(
        asyncio.gather(controller.units(), controller.store_id()), timeout
    )
    metrics: dict[str, Any] = await asyncio.wait_for(
        collect(controller, units, store_id, name), timeout
    )
    return metrics


# -- the Prometheus text format --------------------------------------------------------------

_NAME_OK = re.compile(r"[^a-zA-Z0-9_]")

HELP: dict[str, tuple[str, str]] = {
    "rayless_nodes": ("gauge", "Nodes of the cluster, by liveness."),
    "rayless_node_cpus": ("gauge", "CPUs a node advertises."),
    "rayless_node_cpus_used": ("gauge", "CPUs held by actors on a node."),
    "rayless_node_gpus": ("gauge", "GPUs of a node."),
    "rayless_node_gpus_free": ("gauge", "Wholly free GPUs of a node."),
    "rayless_gpu_used_share": ("gauge", "The share of a GPU held by actors (0..1)."),
    "rayless_gpu_memory_bytes": ("gauge", "A GPU's memory as discovered (NVML)."),
    "rayless_actors": ("gauge", "Actors by state."),
    "rayless_actor_restarts_total": ("counter", "Restarts of an actor."),
    "rayless_actor_calls_total": ("counter", "Calls an actor's process received, per method."),
    "rayless_actor_errors_total": ("counter", "Calls that raised, per method."),
    "rayless_actor_queue_depth": ("gauge", "Calls waiting to start in an actor."),
    "rayless_actor_running": ("gauge", "Calls running in an actor."),
    "rayless_weights_version": ("gauge", "The newest version of a weight sync."),
    "rayless_weights_relays": ("gauge", "Hosts relaying a weight sync."),
}


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: dict[str, Any], value: float) -> str:
    inner = ",".join(f'{_NAME_OK.sub("_", k)}="{_escape(v)}"' for k, v in labels.items())
    number = repr(float(value)) if isinstance(value, float) else str(int(value))
    return f"{name}{{{inner}}} {number}" if inner else f"{name} {number}"


def _samples(snap: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any], float]]:
    nodes = snap.get("nodes") or []
    alive = sum(1 for n in nodes if n.get("alive"))
    yield "rayless_nodes", {"state": "alive"}, alive
    yield "rayless_nodes", {"state": "dead"}, len(nodes) - alive
    by_state = dict.fromkeys(STATES, 0)
    stats = snap.get("stats") or {}
    for n in nodes:
        node = {"node": n.get("node_id")}
        yield "rayless_node_cpus", node, float(n.get("cpus") or 0)
        yield "rayless_node_cpus_used", node, float(n.get("cpus_used") or 0)
        yield "rayless_node_gpus", node, int(n.get("gpus_total") or 0)
        yield "rayless_node_gpus_free", node, int(n.get("gpus_free") or 0)
        for g in n.get("gpus") or []:
            gpu = {**node, "gpu": g.get("index")}
            yield "rayless_gpu_used_share", gpu, max(0.0, 1.0 - float(g.get("free", 0.0)))
            if g.get("memory_bytes"):
                yield "rayless_gpu_memory_bytes", gpu, int(g["memory_bytes"])
        for a in n.get("actors") or []:
            state = str(a.get("state"))
            by_state[state] = by_state.get(state, 0) + 1
            who = {"actor": a.get("name"), "node": a.get("node_id")}
            yield "rayless_actor_restarts_total", who, int(a.get("restarts") or 0)
            st = stats.get(str(a.get("actor_id")))
            if not st or state == ActorState.DEAD:
                continue
            errors = st.get("errors") or {}
            for method, count in sorted((st.get("calls") or {}).items()):
                yield "rayless_actor_calls_total", {**who, "method": method}, int(count)
                yield (
                    "rayless_actor_errors_total",
                    {**who, "method": method},
                    int(errors.get(method, 0)),
                )
            yield "rayless_actor_queue_depth", who, int(st.get("queued") or 0)
            yield "rayless_actor_running", who, int(st.get("running") or 0)
    for state, count in by_state.items():
        yield "rayless_actors", {"state": state}, count
    for name, info in sorted((snap.get("weights") or {}).items()):
        yield "rayless_weights_version", {"weights": name}, int(info.get("latest", -1))
        yield "rayless_weights_relays", {"weights": name}, len(info.get("relays") or {})


def exposition(snap: dict[str, Any]) -> str:
    """``snap`` (from :func:`snapshot`) in the Prometheus text format (version 0.0.4): the
    cluster's families, then each store's (``rayless_store_*``)."""
    by_name: dict[str, list[str]] = {}
    for name, labels, value in _samples(snap):
        by_name.setdefault(name, []).append(_line(name, labels, value))
    out = []
    for name, lines in by_name.items():
        kind, text = HELP[name]
        out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *lines]
    stores = snap.get("stores") or []
    if stores:  # one family each, whatever the number of stores (their samples are labelled)
        from rayless.store.metrics import prometheus

        families: dict[str, list[str]] = {}
        current: list[str] = []
        for m in stores:
            for line in prometheus(m).splitlines():
                if line.startswith("# HELP ") or line.startswith("# TYPE "):
                    name = line.split()[2]
                    current = families.setdefault(name, [])
                    if len(current) < 2:
                        current.append(line)
                elif line:
                    current.append(line)
        for lines in families.values():
            out += lines
    return "\n".join(out) + "\n"
