"""The cluster's nodes and resources in Ray's shape: ``ray.nodes()``,
``ray.cluster_resources()``, ``ray.available_resources()`` and the same by node
(``ray._private.state``)."""

from __future__ import annotations

import os
from typing import Any

from rayless.ray import _internals, _worker

__all__ = [
    "available_resources",
    "available_resources_per_node",
    "cluster_resources",
    "node_ip",
    "nodes",
]


def node_ip() -> str:
    """This node's IP address (an actor's node, or 127.0.0.1 in a local driver)."""
    return os.environ.get(_internals.ENV_NODE_IP) or "127.0.0.1"


def _nodes_raw() -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The cluster's nodes, and the CPUs this session's idle task workers hold by node (read
    on the session's loop in the same step)."""
    s = _worker.session()

    async def look() -> tuple[list[dict[str, Any]], dict[str, float]]:
        cluster = await s.cluster()
        found = await cluster.nodes(actors=False)
        return found, (s.tasks.idle_cpus() if s.tasks is not None else {})

    return _worker.run(s, look())


def _memory() -> float:
    try:
        import psutil

        return float(psutil.virtual_memory().total)
    except Exception:
        return 0.0


def nodes() -> list[dict[str, Any]]:
    """Every node, with Ray's keys: ``NodeID``, ``Alive``, ``NodeManagerAddress``,
    ``NodeManagerHostname``, ``Resources`` (``CPU``, ``GPU``, ``memory``, ``node:<ip>``)."""
    return _rows(_nodes_raw()[0])


def _rows(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes ``raw`` (rayless' records) in Ray's shape (see :func:`nodes`)."""
    s = _worker.session()
    out = []
    for n in raw:
        ip = n.get("ip") or "127.0.0.1"
        cpus = float(n.get("cpus", 0))
        if s.num_cpus is not None and len(raw) == 1:
            cpus = float(s.num_cpus)
        resources: dict[str, float] = {"CPU": cpus, "memory": _memory(), f"node:{ip}": 1.0}
        if n.get("gpus"):
            resources["GPU"] = float(len(n["gpus"]))
        out.append(
            {
                "NodeID": n["node_id"],
                "Alive": bool(n.get("alive", True)),
                "NodeManagerAddress": ip,
                "NodeManagerHostname": n.get("hostname") or "",
                "NodeName": ip,
                "Resources": resources,
                "alive": bool(n.get("alive", True)),
                "FakeGPUs": bool(n.get("fake_gpus", False)),
                "_raw": n,
            }
        )
    return out


def cluster_resources() -> dict[str, float]:
    """The total resources of the live nodes (Ray's key names)."""
    total: dict[str, float] = {}
    for n in nodes():
        if n["Alive"]:
            for k, v in n["Resources"].items():
                total[k] = total.get(k, 0.0) + v
    return total


def available_resources() -> dict[str, float]:
    """What is free now: CPUs not held by actors or running tasks, GPU shares free (Ray's key
    names; as in Ray, an idle task worker holds nothing, and a resource with nothing free is
    left out)."""
    free: dict[str, float] = {}
    for res in available_resources_per_node().values():
        for k, v in res.items():
            free[k] = free.get(k, 0.0) + v
    return free


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """What each live node has free now, by node ID (a resource with nothing free left out,
    as in Ray; see :func:`available_resources`)."""
    out: dict[str, dict[str, float]] = {}
    raw, idle = _nodes_raw()
    for n in _rows(raw):
        if not n["Alive"]:
            continue
        record = n["_raw"]
        res = dict(n["Resources"])
        used = float(record.get("cpus_used", 0.0)) - idle.get(n["NodeID"], 0.0)
        res["CPU"] = max(0.0, res["CPU"] - used)
        if "GPU" in res:
            res["GPU"] = round(sum(float(g.get("free", 0.0)) for g in record.get("gpus", [])), 6)
        out[n["NodeID"]] = {k: v for k, v in res.items() if v > 0}
    return out
