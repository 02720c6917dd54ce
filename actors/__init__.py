"""The runtime: head, node agents, actor processes, handles, supervision, local clusters.

Imports ``transport`` and ``placement``; never ``store``.

    async with actors.Cluster.local(nodes=2, gpus_per_node=4) as cluster:
        counter = await cluster.spawn(Counter, start=1, gpus=1)
        print(await counter.add(41))
"""

from typing import TYPE_CHECKING

from rayless.transport.lazy import exports

if TYPE_CHECKING:
    from rayless.actors.api.actor import Actor, current_caller
    from rayless.actors.api.binding import BUILTINS as BUILTIN_METHODS
    from rayless.actors.api.binding import concurrency_group_marker as concurrency_group
    from rayless.actors.api.cluster import Cluster, connect
    from rayless.actors.api.handle import ActorHandle, ActorMethod, endpoint, gather, wait
    from rayless.actors.api.streams import RemoteStream
    from rayless.actors.errors import ActorDiedError
    from rayless.actors.protocol.messages import GpuView, NodeView, Template
    from rayless.placement.errors import PlacementError
    from rayless.transport.errors import RaylessError, RemoteError

__all__ = [
    "Actor",
    "ActorDiedError",
    "ActorHandle",
    "ActorMethod",
    "BUILTIN_METHODS",
    "Cluster",
    "GpuView",
    "NodeView",
    "PlacementError",
    "RaylessError",
    "RemoteError",
    "RemoteStream",
    "Template",
    "concurrency_group",
    "connect",
    "current_caller",
    "endpoint",
    "gather",
    "wait",
]

__getattr__, __dir__ = exports(__name__)
