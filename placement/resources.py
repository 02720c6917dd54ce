"""Node resources and per-component GPU allocations (the reference's NodeResource and
ComponentAllocation), plus the GPU index-string helpers the YAML format uses.

Deliberate differences from the reference:

* Errors: ``NodeResource.allocate`` raises :class:`AllocationError` for a bad argument and
  :class:`NodeCapacityError` when the node has fewer GPUs left than asked; both are
  PlacementErrors that are also the reference's RuntimeError (and ValueError), so
  ``except RuntimeError`` in ported code keeps working.
* ``NodeResource.has_resources``/``is_empty`` and ``ComponentAllocation.get_node_index_string``
  are gone (nothing used them; ``available_gpus`` and ``node_to_gpu_indices`` say the same).
* ``NodeResource.gpu_ids`` (new, optional) maps node-local GPU positions ``0..total_gpus-1`` to
  the GPUs' NVML indices (what goes into CUDA_VISIBLE_DEVICES). Default: ``0..total_gpus-1``.
* Index strings are parsed strictly: garbage, negative numbers and non-integers raise
  ValueError instead of being dropped silently.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from typing import Any

from rayless.placement.errors import (
    AllocationError,
    InsufficientResourcesError,
    NodeCapacityError,
    PlacementError,
)

__all__ = [
    "COMPONENTS",
    "ComponentAllocation",
    "InsufficientResourcesError",
    "NodeResource",
    "format_range",
    "parse_index_str",
]

log = logging.getLogger(__name__)

#: The component types a plan knows, in planning order.
COMPONENTS: tuple[str, ...] = ("train", "buffer", "eval", "env")


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_index_str(value: Any) -> list[tuple[int, int]]:
    """Parse ``"0-7, 8-15"``, ``"3"``, ``5``, ``"7-4"`` (reversed) into inclusive ranges.

    None or ``""`` mean no GPUs. A list of such items is accepted too. Raises ValueError on
    anything else (negative numbers, text, floats, booleans).
    """
    if value is None:
        return []
    if isinstance(value, bool):
        raise ValueError(f"GPU indices must be an int or a string like '0-7, 8-15', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"GPU index must be >= 0, got {value}")
        return [(value, value)]
    if isinstance(value, (list, tuple)):
        return [r for item in value for r in parse_index_str(item)]
    if not isinstance(value, str):
        raise ValueError(
            f"GPU indices must be an int or a string like '0-7, 8-15', got {type(value).__name__}"
        )
    ranges: list[tuple[int, int]] = []
    for part in value.split(","):
        if not part.strip():
            continue
        m = _RANGE.match(part)
        if m is None:
            raise ValueError(f"bad GPU index range {part.strip()!r} in {value!r}; use e.g. '0-7'")
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) is not None else start
        ranges.append((min(start, end), max(start, end)))
    return ranges


def format_range(start: int, end: int) -> str:
    """``"3"`` or ``"0-7"``."""
    return str(start) if start == end else f"{start}-{end}"


@dataclasses.dataclass
class NodeResource:
    """A node's capacity and, inside a pool, its per-component GPU ranges.

    ``allocations`` maps a component to inclusive ranges of node-local GPU positions;
    ``gpu_cursor`` is the next free position (``available_gpus = total_gpus - gpu_cursor``).
    """

    node_id: str
    ip: str
    total_cpus: float
    total_gpus: int
    allocations: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)
    gpu_cursor: int = 0
    max_allocated_gpus: int = 0
    gpu_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.total_gpus, bool) or not isinstance(self.total_gpus, int):
            raise ValueError(f"node {self.node_id}: total_gpus must be an int")
        if self.total_gpus < 0 or self.total_cpus < 0:
            raise ValueError(f"node {self.node_id}: negative resources")
        if self.gpu_ids is not None:
            self.gpu_ids = tuple(int(i) for i in self.gpu_ids)
            if len(self.gpu_ids) != self.total_gpus:
                raise ValueError(
                    f"node {self.node_id}: {len(self.gpu_ids)} gpu_ids for {self.total_gpus} GPUs"
                )

    @property
    def available_gpus(self) -> int:
        """GPUs not yet consumed by an allocation."""
        return self.total_gpus - self.gpu_cursor

    def physical_gpu(self, position: int) -> int:
        """The NVML index of node-local GPU ``position``."""
        if not 0 <= position < self.total_gpus:
            raise PlacementError(
                f"GPU position {position} is outside node {self.node_id} ({self.total_gpus} GPUs)"
            )
        return self.gpu_ids[position] if self.gpu_ids is not None else position

    def allocate(
        self,
        gpus: int | list[int],
        component_types: list[str] | None = None,
        consume: bool = True,
    ) -> None:
        """Record GPU ranges for ``component_types`` at the cursor; advance it if ``consume``.

        ``gpus`` is one count for every component or a list with one count per component.
        A total of zero is a no-op. Raises AllocationError for a bad argument and
        NodeCapacityError when the node has fewer GPUs left than asked (both RuntimeErrors,
        as in the reference).
        """
        component_types = list(component_types or [])
        if isinstance(gpus, list):
            if component_types and len(gpus) != len(component_types):
                raise AllocationError(
                    f"GPU list length {len(gpus)} != component_types length {len(component_types)}"
                )
            counts = [int(g) for g in gpus]
            if any(c < 0 for c in counts):
                raise AllocationError(f"GPU counts must be >= 0, got {gpus}")
            total = sum(counts)
        else:
            total = int(gpus)
            if total < 0:
                raise AllocationError(f"GPU count must be >= 0, got {gpus}")
            counts = [total] * len(component_types)
        if total == 0:
            log.debug("node %s: allocation of 0 GPUs ignored", self.node_id)
            return
        if total > self.available_gpus:
            raise NodeCapacityError(
                f"node {self.node_id}: asked for {total} GPUs, {self.available_gpus} available"
            )
        cursor = self.gpu_cursor
        for comp, req in zip(component_types, counts, strict=True):
            if req == 0:
                continue
            self.allocations.setdefault(comp, []).append((cursor, cursor + req - 1))
            if isinstance(gpus, list):
                cursor += req
        self.max_allocated_gpus = max(self.max_allocated_gpus, self.gpu_cursor + total)
        if consume:
            self.gpu_cursor += total

    @property
    def component_types(self) -> list[str]:
        """Components with a GPU range on this node, in allocation order."""
        return list(self.allocations.keys())

    def copy(self) -> NodeResource:
        """A deep copy."""
        return NodeResource(
            node_id=self.node_id,
            ip=self.ip,
            total_cpus=self.total_cpus,
            total_gpus=self.total_gpus,
            allocations=copy.deepcopy(self.allocations),
            gpu_cursor=self.gpu_cursor,
            max_allocated_gpus=self.max_allocated_gpus,
            gpu_ids=self.gpu_ids,
        )

    def view(self, num_gpus: int | None = None) -> NodeResource:
        """An empty copy (no allocations) limited to the first ``num_gpus`` GPUs."""
        n = self.total_gpus if num_gpus is None else num_gpus
        if not 0 <= n <= self.total_gpus:
            raise InsufficientResourcesError(
                f"node {self.node_id} has {self.total_gpus} GPUs, {n} requested"
            )
        ids = tuple(self.physical_gpu(i) for i in range(n))
        return NodeResource(self.node_id, self.ip, self.total_cpus, n, gpu_ids=ids)


@dataclasses.dataclass
class ComponentAllocation:
    """One component's GPUs in a pool: per node, index strings in the pool-global space."""

    component_type: str
    node_to_gpu_indices: dict[str, list[str]]
    total_gpus: int
    worker_count: int

    def to_index_string(self) -> str:
        """All ranges, e.g. ``"0-7, 8-15"``."""
        return ", ".join(r for ranges in self.node_to_gpu_indices.values() for r in ranges)

    def to_dict(self) -> dict[str, Any]:
        """Plain values."""
        return {
            "component_type": self.component_type,
            "node_to_gpu_indices": copy.deepcopy(self.node_to_gpu_indices),
            "index_string": self.to_index_string(),
            "total_gpus": self.total_gpus,
            "worker_count": self.worker_count,
        }
