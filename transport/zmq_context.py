"""The process's ZeroMQ context, with room for one socket per peer.

ZeroMQ's context allows 1,023 sockets by default; a driver that calls more than a thousand
actors over ZeroMQ (a Ray-style task fan-out, actors on other hosts), or a head that holds one
socket per node agent, would fail its next connection with "Too many open files". The first
use sets the context's socket cap to :data:`MAX_SOCKETS` (it must be set before the context's
first socket) and raises the soft descriptor limit to the hard one, as Ray does at start.
"""

from __future__ import annotations

import logging
import resource
import threading
from typing import Any

import zmq

__all__ = ["MAX_SOCKETS", "raise_fd_limit", "zmq_context"]

log = logging.getLogger("rayless.transport")

MAX_SOCKETS = 65536
_lock = threading.Lock()
_ready = False


def zmq_context() -> zmq.Context[Any]:
    """``zmq.Context.instance()``, its socket cap raised once (before its first socket)."""
    global _ready
    ctx: zmq.Context[Any] = zmq.Context.instance()
    if not _ready:
        with _lock:
            if not _ready:
                try:
                    ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)
                except zmq.ZMQError as exc:  # a context that already made sockets
                    log.debug("could not raise ZeroMQ's socket cap: %s", exc)
                raise_fd_limit()
                _ready = True
    return ctx


def raise_fd_limit() -> None:
    """Raise the soft descriptor limit to the hard one (a container may refuse: say so)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 4 * MAX_SOCKETS)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the descriptor limit from %d: %s", soft, exc)
