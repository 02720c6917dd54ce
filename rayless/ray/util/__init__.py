"""``ray.util``: placement groups, scheduling strategies, the node's IP, ``ActorPool``
(``ray.util.queue`` is a submodule: ``from rayless.ray.util.queue import Queue``)."""

from __future__ import annotations

import os

from rayless.ray import _internals
from rayless.ray.util import scheduling_strategies
from rayless.ray.util.actor_pool import ActorPool
from rayless.ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)

__all__ = [
    "ActorPool",
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
