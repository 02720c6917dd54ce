"""Plan → concrete worker slots: which node, which GPUs (CUDA_VISIBLE_DEVICES), what share.

:func:`pack` walks each component's GPU ranges in pool order (pool, node, range as listed)
and places workers on them:

* whole-GPU workers (``num_gpus`` = k >= 1) take the next k free GPUs of one node; GPUs of a
  node too few for a whole worker are skipped (a worker never spans nodes);
* fractional workers (0 < f < 1) fill a GPU with ``floor(1/f)`` workers before moving on;
* CPU-only workers (``num_gpus = 0``) go, in contiguous blocks, to the nodes where the component
  has GPUs, else the nodes of a pool listing it, else (env/eval) the nodes of the other rollout
  component, else every node; CPU room decides, then order;
* buffer workers: one per node holding train workers, in order (``"auto"``; an explicit other
  count is overridden with a warning, as in the reference); a GPU buffer takes free room in the
  node's train range, else shares the node's first train GPU (buffer + train may share).

Worker ids are 0..n-1 per component (env groups numbered on, in group order). A GPU's position
comes from the range it is listed in, so GPUs skipped in the middle of a manual layout
(``"0-1, 4-5"``) never shift later workers (the reference's bundle order shifted them). A
``node_list`` restricts a component to those nodes. Workers that do not fit raise
PlacementError naming the component and what is missing; so does a node whose CPUs are
over-committed. :func:`check_overcommit` verifies that no component holds more than a whole
GPU and that only the pairs the strategy allows share a GPU (:func:`sharing_pairs`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rayless.placement.errors import PlacementError
from rayless.placement.pool import ResourcePool
from rayless.placement.resources import NodeResource
from rayless.placement.scheduling import ComponentScheduling, Scheduling

__all__ = ["Packing", "WorkerSlot", "check_overcommit", "pack", "sharing_pairs"]

log = logging.getLogger(__name__)
_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class WorkerSlot:
    """One worker's place: node, NVML GPU indices, GPU share per GPU, CPUs, env group."""

    component: str
    worker_id: int
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_fraction: float
    cpus: float
    group: int = 0

    @property
    def cuda_visible_devices(self) -> str:
        """Comma-joined GPU indices for the worker's CUDA_VISIBLE_DEVICES (``""``: none)."""
        return ",".join(str(i) for i in self.gpu_indices)

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        d = dataclasses.asdict(self)
        d["gpu_indices"] = list(self.gpu_indices)
        return d


@dataclasses.dataclass(frozen=True)
class Packing:
    """The packed workers, in component then worker-id order."""

    slots: tuple[WorkerSlot, ...]

    def for_component(self, component: str) -> list[WorkerSlot]:
        """One component's slots by worker id."""
        return [s for s in self.slots if s.component == component]

    def component_distribution(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{node_id: {component: {"count": n, "ids": [...]}}}`` (nodes in first-use order)."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for s in self.slots:
            entry = out.setdefault(s.node_id, {}).setdefault(s.component, {"count": 0, "ids": []})
            entry["count"] += 1
            entry["ids"].append(s.worker_id)
        return out


def sharing_pairs(strategy: str | None, env_strategy: str = "default") -> frozenset[frozenset[str]]:
    """Component pairs that may hold the same GPU under a strategy (train+buffer always)."""
    pairs = {frozenset({"train", "buffer"})}
    if env_strategy == "device-colocate":
        pairs.add(frozenset({"eval", "env"}))
    if strategy == "colocate":
        pairs |= {frozenset({"train", c}) for c in ("eval", "env")}
        pairs |= {frozenset({"buffer", c}) for c in ("eval", "env")}
    return frozenset(pairs)


def check_overcommit(
    slots: Sequence[WorkerSlot], allowed: frozenset[frozenset[str]] | None
) -> None:
    """Raise PlacementError if a component holds more than a whole GPU, or (unless ``allowed``
    is None) two components not in ``allowed`` share a GPU."""
    use: dict[tuple[str, int], dict[str, float]] = {}
    for s in slots:
        for g in s.gpu_indices:
            per = use.setdefault((s.node_id, g), {})
            per[s.component] = per.get(s.component, 0.0) + s.gpu_fraction
    for (node, gpu), per in use.items():
        for comp, total in per.items():
            if total > 1 + 1e-6:
                raise PlacementError(f"{comp} holds {total:g} of GPU {gpu} on node {node}")
        if allowed is not None:
            comps = sorted(per)
            for i, a in enumerate(comps):
                for b in comps[i + 1 :]:
                    if frozenset({a, b}) not in allowed:
                        raise PlacementError(f"{a} and {b} share GPU {gpu} on node {node}")


class _Gpus:
    """A component's GPUs in plan order with the share still free on each."""

    def __init__(self, entries: list[tuple[str, int]]) -> None:
        self.entries = entries  # (node id, NVML index)
        self.free = [1.0] * len(entries)
        self.cursor = 0


def _component_gpus(
    pools: Sequence[ResourcePool], comp: str, nodes: tuple[str, ...] | None
) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()
    for pool in pools:
        for node in pool.nodes:
            if nodes is not None and node.node_id not in nodes:
                continue
            for s, e in node.allocations.get(comp, ()):
                for pos in range(s, e + 1):
                    key = (node.node_id, node.physical_gpu(pos))
                    if key not in seen:
                        seen.add(key)
                        out.append(key)
    return out


def _place_gpu_group(
    comp: str, sched: Scheduling, first_id: int, group: int, gpus: _Gpus
) -> list[WorkerSlot]:
    n, f = sched.count, float(sched.num_gpus)
    slots: list[WorkerSlot] = []
    entries, free = gpus.entries, gpus.free
    if f >= 1 - _EPS:
        k = sched.gpus_per_worker
        for wid in range(first_id, first_id + n):
            i = gpus.cursor
            while True:
                if i + k > len(entries):
                    raise PlacementError(
                        f"{comp}: worker {wid} of {k} GPU(s) does not fit: the {comp} GPU range "
                        f"has no {k} free GPU(s) left on one node ({n} workers asked)"
                    )
                node = entries[i][0]
                run = range(i, i + k)
                if all(entries[j][0] == node and free[j] >= 1 - _EPS for j in run):
                    break
                i += 1
            for j in run:
                free[j] = 0.0
            gpus.cursor = i + k
            idx = tuple(entries[j][1] for j in run)
            slots.append(WorkerSlot(comp, wid, node, idx, 1.0, float(sched.num_cpus), group))
        return slots
    for wid in range(first_id, first_id + n):
        i = gpus.cursor
        while i < len(entries) and free[i] < f - _EPS:
            i += 1
        if i >= len(entries):
            raise PlacementError(
                f"{comp}: worker {wid} ({f:g} GPU) does not fit: the {comp} GPU range is "
                f"full ({len(entries)} GPUs for {n} workers)"
            )
        free[i] -= f
        gpus.cursor = i
        node, gpu = entries[i]
        slots.append(WorkerSlot(comp, wid, node, (gpu,), f, float(sched.num_cpus), group))
    return slots


def _place_cpu_only(
    comp: str,
    sched: Scheduling,
    first_id: int,
    group: int,
    candidates: list[str],
    cpu_left: dict[str, float],
) -> list[WorkerSlot]:
    n, c = sched.count, float(sched.num_cpus)
    if n == 0:
        return []
    if not candidates:
        raise PlacementError(f"{comp}: no node to place {n} CPU-only workers on")
    m = len(candidates)
    target = [n // m + (1 if i < n % m else 0) for i in range(m)]

    def room(node: str) -> int:
        return n if c <= _EPS else int((cpu_left[node] + 1e-6) // c)

    counts = [min(t, room(node)) for t, node in zip(target, candidates, strict=True)]
    rest = n - sum(counts)
    for i, node in enumerate(candidates):
        if rest <= 0:
            break
        extra = min(rest, room(node) - counts[i])
        counts[i] += extra
        rest -= extra
    if rest > 0:
        raise PlacementError(
            f"{comp}: {rest} of {n} CPU-only workers ({c:g} CPUs each) do not fit the CPUs "
            f"left on nodes {candidates}"
        )
    slots: list[WorkerSlot] = []
    wid = first_id
    for node, k in zip(candidates, counts, strict=True):
        for _ in range(k):
            slots.append(WorkerSlot(comp, wid, node, (), 0.0, c, group))
            wid += 1
        cpu_left[node] -= k * c
    return slots


def pack(
    scheduling: ComponentScheduling,
    pools: Mapping[str, ResourcePool] | Sequence[ResourcePool],
    nodes: Mapping[str, NodeResource],
    *,
    strategy: str | None = None,
    env_strategy: str = "default",
) -> Packing:
    """Place every worker of ``scheduling`` on the pools' GPU ranges (see module docstring).

    ``nodes`` gives each node's CPUs. ``strategy`` None (manual pools) skips the cross-component
    sharing check. Deterministic: the same inputs give the same slots. Raises PlacementError.
    """
    pool_list = list(pools.values()) if isinstance(pools, Mapping) else list(pools)
    cpu_left = {nid: float(n.total_cpus) for nid, n in nodes.items()}
    for pool in pool_list:
        for n in pool.nodes:
            cpu_left.setdefault(n.node_id, float(n.total_cpus))
    slots: list[WorkerSlot] = []
    by_comp: dict[str, list[WorkerSlot]] = {}

    def comp_nodes(comp: str) -> list[str]:
        order: list[str] = []
        for pool in pool_list:
            for n in pool.nodes:
                if comp in n.allocations and n.node_id not in order:
                    order.append(n.node_id)
        return order

    def cpu_candidates(comp: str, restrict: tuple[str, ...] | None) -> list[str]:
        lists = [comp_nodes(comp)]
        lists.append([n.node_id for p in pool_list if comp in p.component_types for n in p.nodes])
        other = {"env": "eval", "eval": "env"}.get(comp)
        if other:
            lists.append(comp_nodes(other))
        lists.append(list(nodes) or [n.node_id for p in pool_list for n in p.nodes])
        for cands in lists:
            cands = list(dict.fromkeys(cands))
            if restrict is not None:
                cands = [c for c in cands if c in restrict]
            if cands:
                return cands
        return []

    for comp in ("train", "eval", "env"):
        placed: list[WorkerSlot] = []
        shared: dict[tuple[str, ...] | None, _Gpus] = {}
        next_id = 0
        for group, sched in enumerate(scheduling.groups(comp)):
            restrict = sched.nodes
            if sched.workers_per_gpu == 0:
                group_slots = _place_cpu_only(
                    comp, sched, next_id, group, cpu_candidates(comp, restrict), cpu_left
                )
            else:
                if restrict not in shared:
                    shared[restrict] = _Gpus(_component_gpus(pool_list, comp, restrict))
                group_slots = _place_gpu_group(comp, sched, next_id, group, shared[restrict])
                for s in group_slots:
                    cpu_left[s.node_id] = cpu_left.get(s.node_id, 0.0) - s.cpus
            placed.extend(group_slots)
            next_id += sched.count
        by_comp[comp] = placed

    by_comp["buffer"] = _place_buffers(scheduling, pool_list, by_comp["train"], cpu_left)
    for comp in ("train", "buffer", "eval", "env"):
        slots.extend(by_comp[comp])
    over = {n: -left for n, left in cpu_left.items() if left < -1e-6}
    if over:
        node, missing = next(iter(over.items()))
        raise PlacementError(
            f"node {node} is short of {missing:g} CPUs for its workers "
            f"({len(over)} node(s) over-committed)"
        )
    check_overcommit(slots, sharing_pairs(strategy, env_strategy) if strategy else None)
    return Packing(tuple(slots))


def _place_buffers(
    scheduling: ComponentScheduling,
    pool_list: list[ResourcePool],
    train_slots: list[WorkerSlot],
    cpu_left: dict[str, float],
) -> list[WorkerSlot]:
    sched = scheduling.buffer_worker
    if sched is None:
        return []
    train_nodes = list(dict.fromkeys(s.node_id for s in train_slots))
    if sched.worker_num != "auto" and sched.worker_num != len(train_nodes):
        log.warning(
            "Buffer worker number is set to %s, which will be ignored: one buffer per train "
            "node (%d)",
            sched.worker_num,
            len(train_nodes),
        )
    f = float(sched.num_gpus)
    used: dict[tuple[str, int], float] = {}
    for s in train_slots:
        for g in s.gpu_indices:
            used[(s.node_id, g)] = used.get((s.node_id, g), 0.0) + s.gpu_fraction
    train_gpus = _component_gpus(pool_list, "train", None)
    out: list[WorkerSlot] = []
    for wid, node in enumerate(train_nodes):
        gpus: tuple[int, ...] = ()
        if f > _EPS:
            on_node = [g for n, g in train_gpus if n == node]
            if not on_node:
                raise PlacementError(
                    f"buffer worker {wid} needs {f:g} GPU on node {node}, which holds no train "
                    "GPUs (a GPU buffer shares the train workers' GPUs)"
                )
            free = [g for g in on_node if used.get((node, g), 0.0) + f <= 1 + _EPS]
            pick = free[0] if free else on_node[0]
            used[(node, pick)] = used.get((node, pick), 0.0) + f
            gpus = (pick,)
        out.append(WorkerSlot("buffer", wid, node, gpus, f if gpus else 0.0, sched.num_cpus))
        cpu_left[node] = cpu_left.get(node, 0.0) - sched.num_cpus
    return out
