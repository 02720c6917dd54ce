"""How a process this one starts with ``multiprocessing``'s spawn (a DataLoader worker of a
trainer that holds CUDA tensors) joins this process's cluster.

A spawned child is a fresh interpreter: it has no session, an actor's child has no token in
its environment (an actor gets its token privately), and ``ray.init()`` there would start
another cluster. An object that a spawned child needs (a dataset) carries a :class:`ChildJoin`
made from its cluster; the token travels only while the object is pickled to start a child
(multiprocessing's pipe to it, ``get_spawning_popen``), never when it is pickled otherwise
(``torch.save``, a message): there the child finds the token as ``connect(address)`` does (the
environment of a launched driver, or the entry of a local cluster).
"""

from __future__ import annotations

import multiprocessing.context
from dataclasses import dataclass
from typing import Any

from rayless.actors.api.cluster import Cluster, connect

__all__ = ["ChildJoin"]


@dataclass(frozen=True)
class ChildJoin:
    """A cluster's address and, while pickled to spawn a child, its token."""

    address: str
    token: str | None = None

    @classmethod
    def of(cls, cluster: Cluster) -> ChildJoin:
        """The join of ``cluster`` (its token included in this process)."""
        return cls(cluster.address, cluster.token)

    def __getstate__(self) -> dict[str, Any]:
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"address": self.address, "token": self.token if spawning else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "address", state["address"])
        object.__setattr__(self, "token", state["token"])

    def __repr__(self) -> str:
        return f"ChildJoin({self.address!r}, token={'...' if self.token else None})"

    async def connect(self) -> Cluster:
        """A connection of this process to the cluster (the caller closes it).

        Raises:
            ConnectError: no token (carried, in the environment or in a local entry).
            AuthError: the token is wrong.
        """
        return await connect(self.address, token=self.token)
