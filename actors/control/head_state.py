"""The head's tables: nodes, agents, actor records, names, owners and sessions.

One :class:`HeadState` belongs to the head (``actors.control.head``), which hands it to its
actor registry (``actors.control.head_actors``): both read and change these tables, and
neither holds a copy of them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from rayless.actors.protocol.messages import ActorEvent, ActorState, ActorView, MethodInfo
from rayless.placement.allocation import Allocation, NodeState, NodeTable
from rayless.transport.client import Client

DIED_SHOWN = 50  # actors that died for good that status lists (the most recent)


@dataclass
class ActorRecord:
    """An actor as the head knows it."""

    actor_id: str
    name: str
    cls: str
    owner: str
    alloc: Allocation
    max_restarts: int
    methods: dict[str, MethodInfo]
    state: ActorState = ActorState.PENDING
    address: str = ""
    pid: int | None = None
    restarts: int = 0
    death: ActorEvent | None = None
    env: dict[str, str] = field(default_factory=dict)
    named: bool = False  # its spawn gave the name (else the head made one up)

    def public(self) -> ActorView:
        """The record as lookups, handles and status see it."""
        return ActorView(
            actor_id=self.actor_id,
            name=self.name,
            cls=self.cls,
            node_id=self.alloc.node_id,
            gpus=self.alloc.cuda_visible_devices,
            gpu_shares=tuple((int(i), float(f)) for i, f in self.alloc.gpus),
            cpus=float(self.alloc.cpus),
            state=self.state,
            address=self.address,
            pid=self.pid,
            restarts=self.restarts,
            max_restarts=self.max_restarts,
            methods=dict(self.methods),
            death=self.death,
            named=self.named,
        )


def _died() -> collections.deque[str]:
    return collections.deque(maxlen=DIED_SHOWN)


@dataclass
class HeadState:
    """The tables the head and its actor registry share."""

    nodes: dict[str, NodeState] = field(default_factory=NodeTable)  # indexed for placement
    agents: dict[str, Client] = field(default_factory=dict)  # node id -> client of its agent
    actors: dict[str, ActorRecord] = field(default_factory=dict)
    died: collections.deque[str] = field(default_factory=_died)  # newest deaths, oldest first
    owned: dict[str, set[str]] = field(default_factory=dict)  # session -> its live actors' ids
    names: dict[str, str] = field(default_factory=dict)  # name -> actor id
    sessions: dict[str, set[bytes]] = field(default_factory=dict)  # -> its connections
    peer_session: dict[bytes, str] = field(default_factory=dict)  # connection -> session
    driver_debug: dict[str, dict[str, Any]] = field(default_factory=dict)  # session -> listener


__all__ = ["DIED_SHOWN", "ActorRecord", "HeadState"]
