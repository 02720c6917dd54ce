"""``ray.experimental.state.api``: Ray's deprecated spelling of ``ray.util.state``, which
Ray 2.60 still ships and verl's single controller imports (``get_actor``); the same
functions and records."""

from __future__ import annotations

from rayless.ray.util.state import (
    ActorState,
    NodeState,
    RayStateApiException,
    get_actor,
    get_node,
    list_actors,
    list_nodes,
)

__all__ = [
    "ActorState",
    "NodeState",
    "RayStateApiException",
    "get_actor",
    "get_node",
    "list_actors",
    "list_nodes",
]
