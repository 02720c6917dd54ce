"""A resource pool: node views, per-component GPU ranges, and its manual-YAML form.

The pool-global GPU index space concatenates the pool's nodes in order (node 0 holds
``0..g0-1``, node 1 ``g0..g0+g1-1``...). The deliberate differences from the reference
(strict manual input, honoured per-node ``num_gpus``, pinned export) are listed in
``placement.pools``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayless.placement.errors import PlacementError
from rayless.placement.resources import (
    COMPONENTS,
    ComponentAllocation,
    InsufficientResourcesError,
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
    ) -> None:
        self.name = name
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

    def to_yaml_dict(self, *, pin_nodes: bool = True) -> dict[str, Any]:
        """The manual-pool YAML form; see the module docstring for ``pin_nodes``."""
        per_node = [n.total_gpus for n in self.nodes]
        result: dict[str, Any] = {"name": self.name, "num_node": self.num_nodes}
        if pin_nodes:
            result["node_ids"] = self.node_ids
            result["num_gpus"] = per_node
        else:
            result["num_gpus"] = per_node[0] if len(set(per_node)) == 1 else per_node
        for comp in self.component_types:
            indices = self.get_component_indices(comp)
            if indices:
                result[comp] = indices
        return result

    @staticmethod
    def _parse_index_str(s: Any) -> list[tuple[int, int]]:
        return parse_index_str(s)

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
            raise PlacementError(
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

        Raises ValueError for malformed input and PlacementError (InsufficientResourcesError
        for "Not enough nodes") when the cluster cannot hold it.
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
                raise PlacementError(f"[{name}] unknown node ids {unknown}")
            per_node = [_gpu_count(name, g) for g in num_gpus]
        else:
            used = used_node_ids or set()
            candidates = sorted(
                (n for n in cluster_nodes.values() if n.node_id not in used),
                key=lambda n: n.node_id,
            )
            if len(candidates) < num_node:
                raise InsufficientResourcesError(
                    f"[{name}] Not enough nodes to satisfy manual pool request: "
                    f"{num_node} wanted, {len(candidates)} unused"
                )
            candidates = candidates[:num_node]
            node_ids = [n.node_id for n in candidates]
            if num_gpus is None:
                if len({n.total_gpus for n in cluster_nodes.values()}) > 1:
                    raise ValueError(
                        f"[{name}] Manual mode without specified node_ids requires per-node "
                        "num_gpus to be a single value (the cluster is heterogeneous)"
                    )
                per_node = [n.total_gpus for n in candidates]
            elif isinstance(num_gpus, list):
                if len(num_gpus) != num_node:
                    raise ValueError(f"[{name}] num_gpus list must have {num_node} entries")
                per_node = [_gpu_count(name, g) for g in num_gpus]
            else:
                per_node = [_gpu_count(name, num_gpus)] * num_node
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
        pool = cls(name=name, nodes=nodes)
        pool.rebuild_component_allocations()
        return pool


def _gpu_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"[{name}] num_gpus entries must be ints >= 0, got {value!r}")
    return value
