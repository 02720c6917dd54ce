"""The actors layer's errors: a dead actor, a name that is not there or taken, a failed start.

    RaylessError
    ├── ActorNotFoundError   no live actor has that name or id (also a ValueError, as in Ray)
    ├── NameTakenError       an actor of that name already exists (also a ValueError, as in Ray)
    ├── StartError           a process of the runtime (head, agent, fork template) did not start
    ├── ConnectError         no cluster to connect to: no address, an unreadable token file
    ├── LaunchError          ``rayless launch`` could not start, rendezvous or keep its cluster
    ├── DebugBusyError       an actor's debug listener is busy: every handshake slot is taken
    ├── PackageError         a spawn's working_dir or py_modules cannot be shipped (too big)
    └── TransportError
        └── BrokenError      a peer is lost (the family of lost-peer errors)
            ├── ActorDiedError     the actor's process is gone (pid, exit code or signal, node)
            └── ClusterLostError   the cluster's head is gone: every call fails at once

``rayless.errors`` re-exports these beside the other layers' errors.
"""

from __future__ import annotations

import signal

from rayless.transport.errors import BrokenError, RaylessError

__all__ = [
    "ActorDiedError",
    "ActorNotFoundError",
    "ClusterLostError",
    "ConnectError",
    "DebugBusyError",
    "LaunchError",
    "PackageError",
    "NameTakenError",
    "StartError",
]


class ActorDiedError(BrokenError, wire="rayless.ActorDiedError"):
    """The actor's process is gone; every pending and later call fails with this.

    A ``BrokenError`` (the lost-peer family): code that catches lost peers catches it. An
    ActorDiedError that an actor's method raises (an actor it called died) reaches that
    method's caller as itself, as every error a method raises does.

    Attributes name the actor, its pid and node, and how it ended: ``exitcode`` (negative: a
    signal), ``cause`` (the node agent's words for it, e.g. "killed by SIGKILL, killed by the
    kernel's OOM killer (...)"), ``log_tail`` (the last lines of its log) and ``log`` (the
    log file's path on its node). The message says all of them.
    """

    def __init__(
        self,
        actor: str,
        *,
        pid: int | None = None,
        exitcode: int | None = None,
        node: str | None = None,
        reason: str = "",
        cause: str = "",
        log_tail: list[str] | None = None,
        log: str = "",
    ) -> None:
        self.actor = actor
        self.pid = pid
        self.exitcode = exitcode
        self.node = node
        self.reason = reason
        self.cause = cause
        self.log_tail = list(log_tail or [])
        self.log = log
        super().__init__(self._describe())

    def _describe(self) -> str:
        parts = [f"actor {self.actor!r} died"]
        where = []
        if self.pid is not None:
            where.append(f"pid {self.pid}")
        if self.node:
            where.append(f"node {self.node}")
        if where:
            parts.append(f"({', '.join(where)})")
        if self.cause:
            parts.append(self.cause)
        elif self.exitcode is not None:
            if self.exitcode < 0:
                try:
                    name = signal.Signals(-self.exitcode).name
                except ValueError:
                    name = f"signal {-self.exitcode}"
                parts.append(f"killed by {name}")
            else:
                parts.append(f"with exit code {self.exitcode}")
        if self.reason:
            parts.append(f": {self.reason}")
        text = " ".join(parts).replace(" :", ":")
        if self.log_tail:
            path = f" ({self.log})" if self.log else ""
            lines = "".join(f"\n    {line}" for line in self.log_tail)
            text += f"\n  last {len(self.log_tail)} lines of its log{path}:{lines}"
        return text


class ActorNotFoundError(RaylessError, ValueError, wire="rayless.ActorNotFoundError"):
    """No live actor has that name (or id). Also a ``ValueError``, as ``ray.get_actor`` raises."""


class NameTakenError(RaylessError, ValueError, wire="rayless.NameTakenError"):
    """An actor with that name already exists. Also a ``ValueError``, as in Ray."""


class StartError(RaylessError, wire="rayless.StartError"):
    """A process of the runtime (head, node agent, fork template) did not start."""


class PackageError(RaylessError, wire="rayless.PackageError"):
    """A spawn's files (Ray's ``runtime_env`` ``working_dir`` or ``py_modules``) cannot be
    shipped to its node: too big, the head's package store is full, a package the head does
    not hold, or an archive that would write outside its directory."""


class ConnectError(RaylessError, wire="rayless.ConnectError"):
    """There is no cluster to connect to: no address given or found, or no usable token."""


class ClusterLostError(BrokenError, wire="rayless.ClusterLostError"):
    """The cluster's head is gone (stopped answering, or its process died).

    Raised at once by every pending and later call of this process's runtime: without the
    head no actor death could be reported, and the head's loss ends the cluster (its agents
    stop their actors). A ``BrokenError``, so code that catches broken sessions catches it.
    """


class LaunchError(RaylessError, wire="rayless.LaunchError"):
    """A launch (``rayless launch``, the SSH launcher) could not start, rendezvous or keep its
    cluster; also bad launch settings, with what to pass instead."""


class DebugBusyError(RaylessError, wire="rayless.DebugBusyError"):
    """An actor's debug listener refused the connection because every one of its handshake
    slots was taken (strangers can hold them until their handshake deadline); try again."""
