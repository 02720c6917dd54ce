"""The head's live view of node resources, and the choice of where an actor runs.

GPUs are hard resources: an actor asking for ``gpus=k`` (an integer) gets k whole GPUs that
nobody else holds; ``0 < gpus < 1`` packs it onto one GPU that still has that fraction free
(best fit, so fractional actors share GPUs before whole GPUs are broken into). CPUs are soft,
as in Ray (where actors hold 0 CPUs while running): a request larger than a node's total CPUs
is infeasible, otherwise it is counted and placement prefers the node with most CPUs free, but
CPUs never block a spawn. Anything infeasible raises PlacementError at once; a feasible request
whose GPUs are taken now raises its subclass ResourcesBusyError (the head may wait and retry).

The head keeps its nodes in a :class:`NodeTable`: a dict that also holds the nodes in the
order placement prefers them (a heap, kept current by :func:`choose` and :func:`release`), so a
decision looks at the best nodes first and stops at the first that fits, instead of ranking
every node of the cluster; a plain dict of nodes gets the same answers by a full scan.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

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
    placed: int = 0  # allocations held (what the head records in ``actors``)

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

    def whole_gpus_free(self) -> int:
        """GPUs with nothing allocated on them."""
        return sum(1 for f in self.gpu_free.values() if f >= 1.0 - _EPS)


@dataclass(frozen=True)
class Allocation:
    """What one actor holds: a node, GPU shares ``{index: fraction}`` and CPUs."""

    node_id: str
    gpus: tuple[tuple[int, float], ...]
    cpus: float

    @functools.cached_property
    def cuda_visible_devices(self) -> str:  # cached: every status lists it for every actor
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


_T = TypeVar("_T")


def _rank(node: NodeState) -> tuple[float, int, str]:
    """Placement's preference, smallest first: most CPUs free, fewest allocations, then id."""
    return (-(node.cpus - node.cpus_used), node.placed, node.node_id)


class NodeTable(dict[str, NodeState]):
    """The head's nodes by id, with an index of placement's preference order.

    A heap of ``(rank, node id, version)`` entries: every change of a node's rank (a node set
    here, an allocation or a release through this module) pushes a fresh entry and makes the
    node's older ones stale; stale entries and dead nodes are dropped as they surface, and the
    heap is rebuilt when stale entries outnumber live ones (so its size follows the nodes,
    not the history). A node marked dead leaves the index for good: one that comes back
    registers again, as a new NodeState. ``examined`` counts the nodes decisions looked at.
    """

    def __init__(self, nodes: Mapping[str, NodeState] | None = None) -> None:
        super().__init__()
        self._heap: list[tuple[tuple[float, int, str], int]] = []
        self._version: dict[str, int] = {}
        self.examined = 0
        for node in (nodes or {}).values():
            self[node.node_id] = node

    def __setitem__(self, node_id: str, node: NodeState) -> None:
        super().__setitem__(node_id, node)
        self.touch(node)

    def __delitem__(self, node_id: str) -> None:
        super().__delitem__(node_id)
        self._version.pop(node_id, None)

    def pop(self, node_id: str, *default: Any) -> Any:
        """As ``dict.pop``, and the node leaves the index."""
        self._version.pop(node_id, None)
        return super().pop(node_id, *default)

    def clear(self) -> None:
        """As ``dict.clear``."""
        super().clear()
        self._version.clear()
        self._heap.clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        """As ``dict.update``, through ``__setitem__``."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, node_id: str, default: NodeState) -> NodeState:
        """As ``dict.setdefault``, through ``__setitem__``."""
        if node_id not in self:
            self[node_id] = default
        return self[node_id]

    def touch(self, node: NodeState) -> None:
        """``node``'s rank may have changed: index it anew."""
        if self.get(node.node_id) is not node:
            return
        version = self._version.get(node.node_id, 0) + 1
        self._version[node.node_id] = version
        heapq.heappush(self._heap, (_rank(node), version))
        if len(self._heap) > 4 * len(self) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(_rank(n), self._version[n.node_id]) for n in self.values() if n.alive]
        heapq.heapify(self._heap)

    def first_fit(self, fit: Callable[[NodeState], _T | None]) -> tuple[NodeState, _T] | None:
        """The most preferred live node for which ``fit`` returns something, and that."""
        looked: list[tuple[tuple[float, int, str], int]] = []
        found: tuple[NodeState, _T] | None = None
        try:
            while self._heap:
                entry = heapq.heappop(self._heap)
                node_id = entry[0][2]
                node = self.get(node_id)
                if node is None or not node.alive or self._version.get(node_id) != entry[1]:
                    continue  # stale, gone or dead: dropped
                looked.append(entry)
                self.examined += 1
                chosen = fit(node)
                if chosen is not None:
                    found = (node, chosen)
                    break
        finally:
            for entry in looked:
                heapq.heappush(self._heap, entry)
        return found


def choose(
    nodes: dict[str, NodeState],
    gpus: float,
    cpus: float,
    *,
    node: str | None = None,
    gpu_indices: tuple[int, ...] | None = None,
) -> Allocation:
    """Pick a node (and GPUs) for a request and reserve them.

    The node is the most preferred (:func:`_rank`) of those that can take the request now;
    with ``nodes`` a :class:`NodeTable` the decision looks at nodes in that order and stops
    at the first fit.

    Raises:
        ValueError: a malformed request.
        PlacementError: the request is infeasible on every node (or on ``node``).
        ResourcesBusyError: it is feasible, but the GPUs are not free now.
    """
    validate_request(gpus, cpus)
    if gpu_indices is not None and len(gpu_indices) != max(1, math.ceil(gpus)) and gpus > 0:
        raise PlacementError(f"{len(gpu_indices)} GPU indices given for gpus={gpus}")
    need_gpus = math.ceil(gpus) if gpus > 0 else 0

    def fit(n: NodeState) -> list[int] | None:
        if len(n.gpu_indices) < need_gpus or n.cpus + _EPS < cpus:
            return None
        return _fit_gpus(n, gpus, gpu_indices)

    found: tuple[NodeState, list[int]] | None
    if node is not None:
        target = nodes.get(node)
        if target is None or not target.alive:
            known = ", ".join(sorted(n.node_id for n in nodes.values() if n.alive)) or "none"
            raise PlacementError(f"node {node!r} is not alive in this cluster (alive: {known})")
        chosen = fit(target)
        found = None if chosen is None else (target, chosen)
        if found is None:
            _refuse([target], gpus, cpus, need_gpus)
    elif isinstance(nodes, NodeTable):
        found = nodes.first_fit(fit)
    else:
        found = _min_fit((n for n in nodes.values() if n.alive), fit)
    if found is None:
        _refuse([n for n in nodes.values() if n.alive], gpus, cpus, need_gpus)
    best, chosen = found
    share = gpus if gpus < 1 else 1.0
    for i in chosen:
        best.gpu_free[i] -= share
    best.cpus_used += cpus
    best.placed += 1
    if isinstance(nodes, NodeTable):
        nodes.touch(best)
    return Allocation(best.node_id, tuple((i, share) for i in chosen), cpus)


def _min_fit(
    alive: Iterable[NodeState], fit: Callable[[NodeState], list[int] | None]
) -> tuple[NodeState, list[int]] | None:
    """The fitting node of smallest rank, by a scan of all of them."""
    best: tuple[NodeState, list[int]] | None = None
    for n in alive:
        chosen = fit(n)
        if chosen is not None and (best is None or _rank(n) < _rank(best[0])):
            best = (n, chosen)
    return best


def _refuse(alive: list[NodeState], gpus: float, cpus: float, need_gpus: int) -> NoReturn:
    """Why nothing fits, as the error to raise (only on the failure path: a full scan).

    Raises:
        PlacementError: no live node, or none could ever hold the request.
        ResourcesBusyError: some could, but their GPUs are taken now.
    """
    if not alive:
        raise PlacementError("the cluster has no live nodes")
    feasible = [n for n in alive if len(n.gpu_indices) >= need_gpus and n.cpus + _EPS >= cpus]
    if not feasible:
        most_gpus = max(len(n.gpu_indices) for n in alive)
        most_cpus = max(n.cpus for n in alive)
        raise PlacementError(
            f"no node can ever hold gpus={gpus}, cpus={cpus}: the largest node has "
            f"{most_gpus} GPUs and {most_cpus:g} CPUs"
        )
    free = ", ".join(f"{n.node_id}: {sum(n.gpu_free.values()):.2f} GPUs free" for n in feasible)
    raise ResourcesBusyError(f"not enough free GPUs for gpus={gpus} right now ({free})")


def release(nodes: dict[str, NodeState], alloc: Allocation) -> None:
    """Give an allocation back to its node (a no-op for a node that is gone)."""
    state = nodes.get(alloc.node_id)
    if state is None:
        return
    for i, share in alloc.gpus:
        if i in state.gpu_free:
            state.gpu_free[i] = min(1.0, state.gpu_free[i] + share)
    state.cpus_used = max(0.0, state.cpus_used - alloc.cpus)
    state.placed = max(0, state.placed - 1)
    if isinstance(nodes, NodeTable):
        nodes.touch(state)
