"""What a server's handlers are given: the authenticated :class:`Peer` and each :class:`Request`.

Kept apart from ``transport.server`` so that handlers can name them without importing the
server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Peer:
    """An authenticated connection as the server sees it."""

    routing_id: bytes
    name: str
    host: str
    same_host: bool
    last_seen: float
    inflight: int = 0
    # ``protocol.session_key`` of the session: the client knows it too (``Client.trace_key``)
    trace_key: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    # (message bytes, frames, header bytes) the peer accepts: what it announced in HELLO,
    # at most our own limits
    bounds: tuple[int, int, int] = (2**62, 2**31, 2**62)
    # the connection the peer authenticated on (a ``gate.Link``, or the same-host path's
    # stream): its messages are served only when they arrive on it, whatever their routing id
    link: object = field(default=None, repr=False, compare=False)


class Request:
    """One request handed to a server's handler: the peer, the decoded body, its id."""

    __slots__ = ("body", "peer", "req_id")

    def __init__(self, peer: Peer, body: Any, req_id: int) -> None:
        self.peer = peer
        self.body = body
        self.req_id = req_id


Handler = Callable[[Request], Any]
OnewayHandler = Callable[[Peer, Any], Any]

__all__ = ["Handler", "OnewayHandler", "Peer", "Request"]
