"""``ray.util``: placement groups, scheduling strategies, the node's IP."""

from __future__ import annotations

import os

from rayless.ray import _internals
from rayless.ray.util import scheduling_strategies
from rayless.ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = [
    "PlacementGroup",
    "get_current_placement_group",
    "get_node_ip_address",
    "placement_group",
    "placement_group_table",
    "remove_placement_group",
    "scheduling_strategies",
]


def get_node_ip_address() -> str:
    """This node's IP address (an actor's node, or 127.0.0.1 in a local driver)."""
    return os.environ.get(_internals.ENV_NODE_IP) or "127.0.0.1"
