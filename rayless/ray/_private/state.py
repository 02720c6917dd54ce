"""``ray._private.state``: the cluster's nodes and resources, per node or summed, and the
``state`` object (Ray's ``GlobalState``) whose ``placement_group_table(pg.id)`` verl sorts its
placement groups by node with.

Node IDs are rayless' (``node-0``, or the id a launch gave the node), the same IDs
``ray.nodes()`` and ``ray.get_runtime_context().get_node_id()`` report.
"""

from __future__ import annotations

from typing import Any

from rayless.ray import _worker
from rayless.ray._resources import (
    available_resources,
    available_resources_per_node,
    cluster_resources,
    node_ip,
    nodes,
)
from rayless.ray.util.placement_group import placement_group_table

__all__ = [
    "available_resources",
    "available_resources_per_node",
    "cluster_resources",
    "current_node_id",
    "node_ids",
    "nodes",
    "state",
    "total_resources_per_node",
]

NODE_ID_PREFIX = "node:"


def total_resources_per_node() -> dict[str, dict[str, float]]:
    """Each live node's resources, by node ID."""
    return {n["NodeID"]: dict(n["Resources"]) for n in nodes() if n["Alive"]}


def current_node_id() -> str:
    """This node's resource name, ``node:<ip>`` (a custom resource in Ray's scheduling)."""
    return NODE_ID_PREFIX + node_ip()


def node_ids() -> list[str]:
    """Every live node's ``node:<ip>`` resource name."""
    return [
        name
        for resources in total_resources_per_node().values()
        for name in resources
        if name.startswith(NODE_ID_PREFIX)
    ]


class GlobalState:
    """Ray's ``ray._private.state.state``: the same functions as this module's, and the
    placement group table by group ID."""

    node_table = staticmethod(nodes)  # ray.nodes()
    cluster_resources = staticmethod(cluster_resources)
    available_resources = staticmethod(available_resources)
    available_resources_per_node = staticmethod(available_resources_per_node)
    total_resources_per_node = staticmethod(total_resources_per_node)

    def placement_group_table(self, placement_group_id: Any = None) -> dict[str, Any]:
        """The record of the group with ID ``placement_group_id`` (``pg.id``) as
        ``ray.util.placement_group_table(pg)`` gives it, {} for an ID this session did not
        create; every group's record by ID hex without one."""
        if placement_group_id is None:
            return placement_group_table()
        pid = placement_group_id
        pg = _worker.session().groups.get(pid if isinstance(pid, str) else pid.hex())
        return {} if pg is None else placement_group_table(pg)


state = GlobalState()
