"""Ray's scheduling strategies, read by ``ray.remote(scheduling_strategy=...)``.

* ``PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=-1)``: run on the node
  (and GPUs) of a bundle of ``pg``; -1 takes the first bundle with room.
  ``placement_group_capture_child_tasks`` is accepted; child tasks are not captured
  (docs/moving-from-ray.md).
* ``NodeAffinitySchedulingStrategy(node_id, soft=False)``: run on that node; ``soft=True``
  falls back to any node when that one is gone or full.
* ``"DEFAULT"`` and ``"SPREAD"`` (strings): rayless' own choice (most CPUs free first,
  which spreads), the same for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayless.ray.util.placement_group import PlacementGroup

__all__ = ["NodeAffinitySchedulingStrategy", "PlacementGroupSchedulingStrategy"]


@dataclass
class PlacementGroupSchedulingStrategy:
    """Schedule into a bundle of a placement group."""

    placement_group: PlacementGroup
    placement_group_bundle_index: int = -1
    placement_group_capture_child_tasks: bool | None = None


@dataclass
class NodeAffinitySchedulingStrategy:
    """Schedule onto the node ``node_id`` (``soft``: any node if that one cannot take it)."""

    node_id: str
    soft: bool
    _spill_on_unavailable: bool = False
    _fail_on_unavailable: bool = False

    def __init__(self, node_id: Any, soft: bool, **_: Any) -> None:
        self.node_id = (
            node_id.hex()
            if hasattr(node_id, "hex") and not isinstance(node_id, str)
            else str(node_id)
        )
        self.soft = bool(soft)


STRING_STRATEGIES = frozenset({"DEFAULT", "SPREAD"})
