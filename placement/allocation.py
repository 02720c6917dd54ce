"""The head's live view of node resources, and the choice of where an actor runs.

GPUs are hard resources: an actor asking for ``gpus=k`` (an integer) gets k whole GPUs that
nobody else holds; ``0 < gpus < 1`` packs it onto one GPU that still has that fraction free
(best fit, so fractional actors share GPUs before whole GPUs are broken into). CPUs are soft,
as in Ray (where actors hold 0 CPUs while running): a request larger than a node's total CPUs
is infeasible, otherwise it is counted and placement prefers the node with most CPUs free, but
CPUs never block a spawn. Anything infeasible raises PlacementError at once; a feasible request
whose GPUs are taken now raises its subclass ResourcesBusyError (the head may wait and retry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rayless.placement.errors import PlacementError, ResourcesBusyError

_EPS = 1e-9


@dataclass
class NodeState:
    """One node as the head tracks it."""

    node_id: str
    info: dict[str, Any]
    agent_address: str
    gpu_indices: list[int]
    gpu_free: dict[int, float]
    cpus: float
    cpus_used: float = 0.0
    actors: set[str] = field(default_factory=set)
    alive: bool = True
    last_heartbeat: float = 0.0

    @classmethod
    def create(cls, info: dict[str, Any], agent_address: str, now: float) -> NodeState:
        """A node with nothing allocated, from its discovery record."""
        indices = [int(g["index"]) for g in info.get("gpus", [])]
        return cls(
            node_id=str(info["node_id"]),
            info=info,
            agent_address=agent_address,
            gpu_indices=indices,
            gpu_free={i: 1.0 for i in indices},
            cpus=float(info.get("cpus", 1)),
            last_heartbeat=now,
        )

    def summary(self) -> dict[str, Any]:
        """Plain values for ``cluster.nodes()`` and ``rayless status``."""
        return {
            "node_id": self.node_id,
            "hostname": self.info.get("hostname"),
            "ip": self.info.get("ip"),
            "rank": self.info.get("rank"),
            "alive": self.alive,
            "cpus": self.cpus,
            "cpus_used": round(self.cpus_used, 6),
            "gpus": [
                {**g, "free": round(self.gpu_free.get(int(g["index"]), 0.0), 6)}
                for g in self.info.get("gpus", [])
            ],
            "gpus_total": len(self.gpu_indices),
            "gpus_free": sum(1 for f in self.gpu_free.values() if f >= 1.0 - _EPS),
            "fake_gpus": bool(self.info.get("fake_gpus", False)),
            "actors": sorted(self.actors),
        }


@dataclass(frozen=True)
class Allocation:
    """What one actor holds: a node, GPU shares ``{index: fraction}`` and CPUs."""

    node_id: str
    gpus: tuple[tuple[int, float], ...]
    cpus: float

    @property
    def cuda_visible_devices(self) -> str:
        """The value of CUDA_VISIBLE_DEVICES for the actor ('' without GPUs)."""
        return ",".join(str(i) for i, _ in self.gpus)


def validate_request(gpus: float, cpus: float) -> None:
    """Check the shape of a resource request.

    Raises:
        ValueError: negative amounts, non-numbers.
        PlacementError: a fractional request above one GPU.
    """
    for name, value in (("gpus", gpus), ("cpus", cpus)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if gpus > 1 and gpus != int(gpus):
        raise PlacementError(f"gpus={gpus}: fractions are only possible below one GPU")


def _fit_gpus(node: NodeState, gpus: float, exact: tuple[int, ...] | None) -> list[int] | None:
    """GPU indices on ``node`` that can take the request now, or None."""
    if gpus <= 0:
        return []
    if exact is not None:
        need = gpus if gpus < 1 else 1.0
        if all(node.gpu_free.get(i, -1.0) + _EPS >= need for i in exact):
            return list(exact)
        return None
    if gpus < 1:
        candidates = [i for i in node.gpu_indices if node.gpu_free[i] + _EPS >= gpus]
        if not candidates:
            return None
        return [min(candidates, key=lambda i: (node.gpu_free[i], i))]  # best fit
    whole = [i for i in node.gpu_indices if node.gpu_free[i] >= 1.0 - _EPS]
    return whole[: int(gpus)] if len(whole) >= int(gpus) else None


def choose(
    nodes: dict[str, NodeState],
    gpus: float,
    cpus: float,
    *,
    node: str | None = None,
    gpu_indices: tuple[int, ...] | None = None,
) -> Allocation:
    """Pick a node (and GPUs) for a request and reserve them.

    Raises:
        ValueError: a malformed request.
        PlacementError: the request is infeasible on every node (or on ``node``).
        ResourcesBusyError: it is feasible, but the GPUs are not free now.
    """
    validate_request(gpus, cpus)
    if gpu_indices is not None and len(gpu_indices) != max(1, math.ceil(gpus)) and gpus > 0:
        raise PlacementError(f"{len(gpu_indices)} GPU indices given for gpus={gpus}")
    alive = [n for n in nodes.values() if n.alive]
    if node is not None:
        target = nodes.get(node)
        if target is None or not target.alive:
            known = ", ".join(sorted(n.node_id for n in alive)) or "none"
            raise PlacementError(f"node {node!r} is not alive in this cluster (alive: {known})")
        alive = [target]
    if not alive:
        raise PlacementError("the cluster has no live nodes")
    need_gpus = math.ceil(gpus) if gpus > 0 else 0
    feasible = [n for n in alive if len(n.gpu_indices) >= need_gpus and n.cpus + _EPS >= cpus]
    if not feasible:
        most_gpus = max(len(n.gpu_indices) for n in alive)
        most_cpus = max(n.cpus for n in alive)
        raise PlacementError(
            f"no node can ever hold gpus={gpus}, cpus={cpus}: the largest node has "
            f"{most_gpus} GPUs and {most_cpus:g} CPUs"
        )
    fits = []
    for n in feasible:
        chosen = _fit_gpus(n, gpus, gpu_indices)
        if chosen is not None:
            fits.append((n, chosen))
    if not fits:
        free = ", ".join(f"{n.node_id}: {sum(n.gpu_free.values()):.2f} GPUs free" for n in feasible)
        raise ResourcesBusyError(f"not enough free GPUs for gpus={gpus} right now ({free})")
    best, chosen = min(
        fits, key=lambda nc: (-(nc[0].cpus - nc[0].cpus_used), len(nc[0].actors), nc[0].node_id)
    )
    share = gpus if gpus < 1 else 1.0
    for i in chosen:
        best.gpu_free[i] -= share
    best.cpus_used += cpus
    return Allocation(best.node_id, tuple((i, share) for i in chosen), cpus)


def release(nodes: dict[str, NodeState], alloc: Allocation) -> None:
    """Give an allocation back to its node (a no-op for a node that is gone)."""
    state = nodes.get(alloc.node_id)
    if state is None:
        return
    for i, share in alloc.gpus:
        if i in state.gpu_free:
            state.gpu_free[i] = min(1.0, state.gpu_free[i] + share)
    state.cpus_used = max(0.0, state.cpus_used - alloc.cpus)
