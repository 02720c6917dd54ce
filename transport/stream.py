"""The same-host path: rayless messages over a plain UNIX stream socket, no ZeroMQ in between.

A ZeroMQ send hands the message to ZeroMQ's I/O thread, which writes it to the kernel; the
peer's I/O thread reads it and wakes the peer's loop: four thread hand-offs per message, which
on a few busy cores cost more than everything else on a small call's path (docs/performance.md).
Between processes on one host a :class:`~rayless.transport.server.Server` that binds
``tcp://IP:PORT`` also listens on the abstract UNIX socket ``@rayless:tcp://IP:PORT`` (Linux;
it vanishes with the process, so a kill -9 leaves nothing behind), and a
:class:`~rayless.transport.client.Client` given that exact address for a local IP connects
there first, falling back to ZeroMQ when nothing listens. The session on top is the same:
the HMAC handshake, limits, heartbeats. ``RAYLESS_UNIX=0`` turns the path off; so does CURVE
(``curve=True``: the peers asked for ZeroMQ's encryption).

Framing: ``<I length> <H frames> <I frame length>* frames``, length counting everything after
itself. Before a peer authenticates, the server reads at most ``max_preauth_bytes`` of it and
keeps it at most ``handshake_timeout`` (the abstract namespace has no file permissions: the
handshake is the only gate, as on TCP).

This module holds the addressing: whether the path is on, the abstract name of a server's
address, whether a client's address is local, and connecting. Its parts:
``transport.stream_pump`` (the framing, :class:`StreamPump`) and ``transport.unix_listener``
(a server's :class:`UnixListener`).
"""

from __future__ import annotations

import os
import socket
import sys
from functools import lru_cache

# the path's parts, importable from here as before
from rayless.transport.stream_pump import StreamPump
from rayless.transport.stream_pump import pack_header as pack_header
from rayless.transport.stream_pump import split_frames as split_frames
from rayless.transport.unix_listener import UnixListener


def enabled() -> bool:
    """Whether the UNIX path may be used here (Linux, and ``RAYLESS_UNIX`` is not 0)."""
    return sys.platform.startswith("linux") and os.environ.get("RAYLESS_UNIX", "1") != "0"


def unix_name(address: str) -> str | None:
    """The abstract socket name of the server bound at ``address`` (``tcp://`` only)."""
    if not address.startswith("tcp://") or not enabled():
        return None
    return "\0rayless:" + address


@lru_cache(maxsize=256)
def is_local_ip(host: str) -> bool:
    """Whether ``host`` is an address of this machine (loopback, or one we can bind)."""
    if host in ("127.0.0.1", "localhost", "::1") or host.startswith("127."):
        return True
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((host.strip("[]"), 0))
        return True
    except OSError:
        return False


def local_name(address: str) -> str | None:
    """The abstract socket to try for a client of ``address``, or None (not a local IP)."""
    name = unix_name(address)
    if name is None:
        return None
    host = address[len("tcp://") :].rpartition(":")[0]
    return name if is_local_ip(host) else None


def connect(name: str) -> socket.socket:
    """A connected, non-blocking UNIX stream socket to ``name``.

    Raises:
        OSError: nothing listens there (ECONNREFUSED), or its backlog is full.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect(name)  # UNIX connects complete at once or fail
    except BaseException:
        sock.close()
        raise
    return sock


__all__ = ["StreamPump", "UnixListener", "enabled", "local_name", "unix_name"]
