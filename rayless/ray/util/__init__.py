"""``ray.util``: placement groups, scheduling strategies, the node's IP, ``ActorPool``,
``as_completed`` and ``map_unordered`` (``ray.util.queue`` is a submodule:
``from rayless.ray.util.queue import Queue``)."""

from __future__ import annotations

from typing import Any

from rayless.ray import _resources
from rayless.ray.util import scheduling_strategies
from rayless.ray.util.actor_pool import ActorPool
from rayless.ray.util.helpers import as_completed, map_unordered
from rayless.ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    get_placement_group,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from rayless.ray.util.serialization import deregister_serializer, register_serializer

__all__ = [
    "ActorPool",
    "PlacementGroup",
    "as_completed",
    "deregister_serializer",
    "get_current_placement_group",
    "get_node_ip_address",
    "get_placement_group",
    "list_named_actors",
    "map_unordered",
    "placement_group",
    "placement_group_table",
    "register_serializer",
    "remove_placement_group",
    "scheduling_strategies",
]


def get_node_ip_address() -> str:
    """This node's IP address (an actor's node, or 127.0.0.1 in a local driver)."""
    return _resources.node_ip()


def list_named_actors(all_namespaces: bool = False) -> list[Any]:
    """The live actors that were given a name: their names in this session's namespace, or
    with ``all_namespaces`` one ``{"name": ..., "namespace": ...}`` per actor (what
    ``ray.get_actor(**entry)`` takes; the namespace is None for an actor named in a session
    without one)."""
    from rayless.ray import _worker

    s = _worker.session()

    async def named() -> list[str]:
        cluster = await s.cluster()
        page = await cluster.list_actors(limit=None)
        return [view.name for view in page.actors if view.named]

    entries = []
    for full in _worker.run(s, named()):
        namespace, _, name = full.rpartition("/")
        entries.append({"name": name, "namespace": namespace or None})
    if all_namespaces:
        return entries
    return [e["name"] for e in entries if e["namespace"] == s.namespace]
