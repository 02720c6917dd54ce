"""The runtime: head, node agents, actor processes, handles, supervision, local clusters.

Imports ``transport`` and ``placement``; never ``store``.

    async with actors.Cluster.local(nodes=2, gpus_per_node=4) as cluster:
        counter = await cluster.spawn(Counter, start=1, gpus=1)
        print(await counter.add(41))
"""

from actors.actor import Actor
from actors.cluster import Cluster, connect
from actors.handle import ActorHandle, ActorMethod, gather, wait
from transport.errors import ActorDiedError, PlacementError, RaylessError, RemoteError

__all__ = [
    "Actor",
    "ActorDiedError",
    "ActorHandle",
    "ActorMethod",
    "Cluster",
    "PlacementError",
    "RaylessError",
    "RemoteError",
    "connect",
    "gather",
    "wait",
]
