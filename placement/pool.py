"""A resource pool: node views, per-component GPU ranges, and its manual-YAML form.

The pool-global GPU index space concatenates the pool's nodes in order (node 0 holds
``0..g0-1``, node 1 ``g0..g0+g1-1``...). The deliberate differences from the reference
(strict manual input, honoured per-node ``num_gpus``) are listed in ``placement.pools``.

**YAML shape** (the reference's): ``name``, ``num_node``, ``num_gpus`` — a scalar when every
node of the pool has the same count, a per-node list for a heterogeneous pool — and one key per
component with its pool-global index string. ``node_ids`` (with a per-node ``num_gpus`` list,
as the reference requires) appears only for a pool loaded with ``node_ids`` (``pinned``) or
when asked for.

**Which nodes a pool without ``node_ids`` gets**: the first unused nodes in node-id order (the
reference's rule). On a cluster whose nodes have different GPU counts, only nodes whose count
equals the pool's ``num_gpus`` entry (scalar: every node; list: in list order) qualify; a pool
without ``num_gpus``, or whose counts no (unused) node has, cannot name its nodes and raises
ManualPoolError (the reference refused every such pool with ValueError).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayless.placement.errors import InsufficientResourcesError, ManualPoolError
from rayless.placement.resources import (
    COMPONENTS,
    ComponentAllocation,
    NodeResource,
    format_range,
    parse_index_str,
)

__all__ = ["ResourcePool"]

_RESERVED = {"name", "num_node", "num_gpus", "node_ids"}


class ResourcePool:
    """A named set of node views and the GPU ranges each component holds on them."""

    def __init__(
        self,
        name: str,
        nodes: list[NodeResource],
        component_types: list[str] | None = None,
        component_allocations: dict[str, ComponentAllocation] | None = None,
        *,
        pinned: bool = False,
    ) -> None:
        self.name = name
        #: loaded with ``node_ids``: the YAML export keeps them
        self.pinned = pinned
        self.nodes = nodes
        self._component_types = list(component_types) if component_types is not None else None
        self.component_allocations: dict[str, ComponentAllocation] = dict(
            component_allocations or {}
        )

    def __repr__(self) -> str:
        return f"ResourcePool({self.name!r}, nodes={self.node_ids}, types={self.component_types})"

    @property
    def component_types(self) -> list[str]:
        """Explicit types, else those with ranges (first appearance), plus buffer after train."""
        if self._component_types is not None:
            return list(self._component_types)
        seen: list[str] = []
        for node in self.nodes:
            for comp in node.allocations:
                if comp not in seen:
                    seen.append(comp)
        if "train" in seen and "buffer" not in seen:
            seen.insert(seen.index("train") + 1, "buffer")
        return seen

    @property
    def total_gpus(self) -> int:
        """GPUs of the pool's node views."""
        return sum(n.total_gpus for n in self.nodes)

    @property
    def total_cpus(self) -> float:
        """CPUs of the pool's nodes."""
        return sum(n.total_cpus for n in self.nodes)

    @property
    def num_nodes(self) -> int:
        """How many nodes the pool holds."""
        return len(self.nodes)

    @property
    def node_ids(self) -> list[str]:
        """The pool's node ids, in pool order."""
        return [n.node_id for n in self.nodes]

    def get_component_node_count(self, component_type: str) -> int:
        """Nodes where the component has GPUs (buffer: nodes with train GPUs)."""
        comp = "train" if component_type == "buffer" else component_type
        if component_type == "buffer" and "buffer" not in self.component_types:
            return 0
        return sum(1 for n in self.nodes if comp in n.allocations)

    def get_component_indices(self, component_type: str) -> str:
        """Pool-global index string of a component, e.g. ``"0-7, 8-15"`` (``""`` if none)."""
        if not self.component_allocations:
            self.rebuild_component_allocations()
        ca = self.component_allocations.get(component_type)
        return ca.to_index_string() if ca else ""

    def rebuild_component_allocations(self) -> None:
        """Rebuild the ComponentAllocation view from the node ranges (pool-global indices)."""
        counts = {c: a.worker_count for c, a in self.component_allocations.items()}
        self.component_allocations = {}
        offset = 0
        for node in self.nodes:
            for comp, ranges in node.allocations.items():
                ca = self.component_allocations.get(comp)
                if ca is None:
                    ca = ComponentAllocation(comp, {}, 0, counts.get(comp, 0))
                    self.component_allocations[comp] = ca
                for s, e in ranges:
                    ca.node_to_gpu_indices.setdefault(node.node_id, []).append(
                        format_range(offset + s, offset + e)
                    )
                    ca.total_gpus += e - s + 1
            offset += node.total_gpus

    _rebuild_component_allocations = rebuild_component_allocations

    def to_dict(self) -> dict[str, Any]:
        """Plain values describing the pool."""
        result: dict[str, Any] = {
            "name": self.name,
            "num_node": self.num_nodes,
            "num_gpus": self.total_gpus,
            "node_ids": self.node_ids,
            "component_types": self.component_types,
            "nodes": [
                {
                    "node_id": n.node_id,
                    "ip": n.ip,
                    "total_gpus": n.total_gpus,
                    "total_cpus": n.total_cpus,
                    "allocations": {c: [list(r) for r in rs] for c, rs in n.allocations.items()},
                }
                for n in self.nodes
            ],
        }
        for comp in self.component_types:
            indices = self.get_component_indices(comp)
            if indices:
                result[comp] = indices
        return result

    def to_yaml_dict(self, *, pin_nodes: bool | None = None) -> dict[str, Any]:
        """The manual-pool YAML form, in the reference's shape (see the module docstring).

        ``pin_nodes``: None (default) writes ``node_ids`` only when the pool was loaded with
        them; True always; False never.
        """
        per_node = [n.total_gpus for n in self.nodes]
        pin = self.pinned if pin_nodes is None else pin_nodes
        result: dict[str, Any] = {"name": self.name, "num_node": self.num_nodes}
        if pin:
            result["node_ids"] = self.node_ids
            result["num_gpus"] = per_node
        elif per_node:
            result["num_gpus"] = per_node[0] if len(set(per_node)) == 1 else per_node
        else:
            result["num_gpus"] = 0
        for comp in self.component_types:
            indices = self.get_component_indices(comp)
            if indices:
                result[comp] = indices
        return result

    @staticmethod
    def split_global_range_by_nodes(
        start: int, end: int, node_offsets: Sequence[int]
    ) -> list[tuple[int, int, int]]:
        """Split pool-global ``[start, end]`` into ``(node position, local start, local end)``.

        ``node_offsets`` are the cumulative starts (length nodes + 1). PlacementError when the
        range goes past the last GPU.
        """
        total = node_offsets[-1]
        if end >= total:
            raise ManualPoolError(
                f"GPU index {end} is outside the pool's {total} GPUs (0-{total - 1})"
            )
        out: list[tuple[int, int, int]] = []
        cur, node = start, 0
        while cur <= end:
            while node_offsets[node + 1] <= cur:
                node += 1
            seg_end = min(end, node_offsets[node + 1] - 1)
            out.append((node, cur - node_offsets[node], seg_end - node_offsets[node]))
            cur = seg_end + 1
        return out

    _split_global_range_by_nodes = split_global_range_by_nodes

    @classmethod
    def from_yaml_dict(
        cls,
        pool_cfg: Mapping[str, Any],
        cluster_nodes: Mapping[str, NodeResource],
        *,
        used_node_ids: set[str] | None = None,
    ) -> ResourcePool:
        """Build a pool from its YAML dict (``name``, ``num_node``, ``num_gpus``, optional
        ``node_ids``, component keys with index strings).

        Raises ValueError for malformed input, ManualPoolError (a ValueError) when its nodes
        cannot be named or its indices pass its GPUs, and InsufficientResourcesError (a
        ValueError) for "Not enough nodes".
        """
        if not isinstance(pool_cfg, Mapping):
            for attr in ("to_dict", "model_dump"):
                if hasattr(pool_cfg, attr):
                    pool_cfg = getattr(pool_cfg, attr)()
                    break
            else:
                pool_cfg = dict(pool_cfg)
        name = pool_cfg.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a manual pool needs a 'name', got {name!r}")
        num_node = pool_cfg.get("num_node")
        if isinstance(num_node, bool) or not isinstance(num_node, int) or num_node < 0:
            raise ValueError(f"[{name}] num_node must be an int >= 0, got {num_node!r}")
        num_gpus = pool_cfg.get("num_gpus")
        node_ids = pool_cfg.get("node_ids")
        if node_ids is not None:
            if not isinstance(num_gpus, list):
                raise ValueError(f"[{name}] with node_ids, num_gpus must be a per-node list")
            node_ids = [str(x) for x in node_ids]
            if len(node_ids) != num_node or len(num_gpus) != num_node:
                raise ValueError(
                    f"[{name}] node_ids ({len(node_ids)}) and num_gpus ({len(num_gpus)}) "
                    f"must both have num_node={num_node} entries"
                )
            if len(set(node_ids)) != len(node_ids):
                raise ValueError(f"[{name}] node_ids lists a node twice: {node_ids}")
            unknown = [n for n in node_ids if n not in cluster_nodes]
            if unknown:
                raise ManualPoolError(f"[{name}] unknown node ids {unknown}")
            per_node = [_gpu_count(name, g) for g in num_gpus]
        else:
            node_ids, per_node = _pick_nodes(name, num_node, num_gpus, cluster_nodes, used_node_ids)
        nodes = [cluster_nodes[nid].view(g) for nid, g in zip(node_ids, per_node, strict=True)]
        offsets = [0]
        for g in per_node:
            offsets.append(offsets[-1] + g)
        for key, value in pool_cfg.items():
            if key in _RESERVED or value is None:
                continue
            if key not in COMPONENTS:
                raise ValueError(
                    f"[{name}] unknown key {key!r}; components are {list(COMPONENTS)} and "
                    f"other keys are {sorted(_RESERVED)}"
                )
            seen: set[int] = set()
            for gs, ge in parse_index_str(value):
                if seen.intersection(range(gs, ge + 1)):
                    raise ValueError(f"[{name}] {key}: a GPU index is listed twice in {value!r}")
                seen.update(range(gs, ge + 1))
                for pos, ls, le in cls.split_global_range_by_nodes(gs, ge, offsets):
                    node = nodes[pos]
                    node.allocations.setdefault(key, []).append((ls, le))
                    node.max_allocated_gpus = max(node.max_allocated_gpus, le + 1)
                    node.gpu_cursor = max(node.gpu_cursor, le + 1)
        pool = cls(name=name, nodes=nodes, pinned=pool_cfg.get("node_ids") is not None)
        pool.rebuild_component_allocations()
        return pool


def _pick_nodes(
    name: str,
    num_node: int,
    num_gpus: Any,
    cluster_nodes: Mapping[str, NodeResource],
    used_node_ids: set[str] | None,
) -> tuple[list[str], list[int]]:
    """Nodes and per-node GPU counts of a pool without ``node_ids`` (module docstring)."""
    used = used_node_ids or set()
    free = sorted(
        (n for n in cluster_nodes.values() if n.node_id not in used), key=lambda n: n.node_id
    )
    if isinstance(num_gpus, list):
        if len(num_gpus) != num_node:
            raise ValueError(f"[{name}] num_gpus list must have {num_node} entries")
        wanted: list[int] | None = [_gpu_count(name, g) for g in num_gpus]
    elif num_gpus is None:
        wanted = None
    else:
        wanted = [_gpu_count(name, num_gpus)] * num_node
    if len({n.total_gpus for n in cluster_nodes.values()}) <= 1:  # the reference's rule
        if len(free) < num_node:
            raise InsufficientResourcesError(
                f"[{name}] Not enough nodes to satisfy manual pool request: "
                f"{num_node} wanted, {len(free)} unused"
            )
        picked = free[:num_node]
        return [n.node_id for n in picked], wanted or [n.total_gpus for n in picked]
    if wanted is None:
        raise ManualPoolError(
            f"[{name}] Manual mode without specified node_ids requires per-node num_gpus to be "
            "given: the cluster is heterogeneous (its nodes have different GPU counts)"
        )
    ids: list[str] = []
    for g in wanted:
        node = next((n for n in free if n.total_gpus == g and n.node_id not in ids), None)
        if node is None:
            have = sorted({n.total_gpus for n in free if n.node_id not in ids})
            raise ManualPoolError(
                f"[{name}] cannot name the pool's nodes without node_ids: the cluster is "
                f"heterogeneous and no unused node has {g} GPUs (unused nodes have "
                f"{have}); give node_ids"
            )
        ids.append(node.node_id)
    return ids, wanted


def _gpu_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"[{name}] num_gpus entries must be ints >= 0, got {value!r}")
    return value
