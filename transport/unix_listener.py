"""A server's same-host listener: the abstract UNIX socket beside its ZeroMQ ROUTER.

Accepts connections, gives each a routing id (never a ZeroMQ one) and a
:class:`~rayless.transport.stream_pump.StreamPump`, and delivers ``[rid, *frames]`` messages as
the ROUTER does. Before a connection authenticates it may send at most ``max_preauth_bytes``
and stay at most ``handshake_timeout`` (the abstract namespace has no file permissions: the
handshake is the only gate, as on TCP). When ``accept()`` fails (out of fds) it closes the
oldest stranger and pauses accepting (50 ms doubling to 1 s), logging at a bounded rate. See
``transport.stream`` for the path as a whole.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import itertools
import logging
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from rayless.transport.errors import ClosedError
from rayless.transport.ratelog import RateLimitedLog
from rayless.transport.stream_pump import Frames, StreamPump

log = logging.getLogger("rayless.transport")

LOG_INTERVAL = 5.0  # seconds between two log lines about failed accepts
_rids = itertools.count(1)
UNIX_RID_PREFIX = b"\x01"  # first byte of the same-host path's routing ids
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a UNIX socket (-1 where unknown)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except (OSError, AttributeError):
        return -1
    return int(_PEERCRED.unpack(creds)[1])


class UnixListener:
    """A server's same-host listener: accepts connections, gives each a routing id, and
    delivers ``[rid, *frames]`` messages to ``on_batch`` like the ROUTER does.

    ``on_batch(conn, msgs)`` gets the messages of one connection ``conn`` (its
    :class:`StreamPump`, which stands for the connection). ``authenticated(rid)`` tells whether
    a connection finished the handshake; until then it may send ``max_preauth_bytes`` and stay
    ``handshake_timeout`` seconds. ``on_gone(rid)`` is called when a connection ends.
    """

    def __init__(
        self,
        name: str,
        on_batch: Callable[[StreamPump, list[Frames]], None],
        *,
        authenticated: Callable[[bytes], bool],
        on_gone: Callable[[bytes], None],
        queue_limit: int,
        max_message: int,
        max_preauth_bytes: int,
        handshake_timeout: float,
        max_conns: int,
        max_pending_per_uid: int = 256,
    ) -> None:
        self.name = name
        self._on_batch = on_batch
        self._authenticated = authenticated
        self._on_gone = on_gone
        self._queue_limit = queue_limit
        self._max_message = max_message
        self._max_preauth = max_preauth_bytes
        self._timeout = handshake_timeout
        self._max_conns = max_conns
        self._max_per_uid = max_pending_per_uid
        self._loop = asyncio.get_running_loop()
        self.conns: dict[bytes, StreamPump] = {}
        # unauthenticated connections, oldest first: rid -> peer uid; and their count per uid
        self._strangers: OrderedDict[bytes, int] = OrderedDict()
        self._per_uid: dict[int, int] = {}
        self.refused = 0  # connections refused or pushed out by the bounds above
        self.accept_failed = 0  # accept() errors (each pauses accepting: _accept_failed)
        self._backoff = 0.0
        self._ratelog = RateLimitedLog(log, LOG_INTERVAL)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.setblocking(False)
            self._sock.bind(name)
            self._sock.listen(128)
        except BaseException:
            self._sock.close()
            raise
        self._loop.add_reader(self._sock.fileno(), self._accept)
        self._closed = False

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue  # that client gave up first
                self._accept_failed(exc)
                return
            self._backoff = 0.0
            uid = peer_uid(sock)
            if self._per_uid.get(uid, 0) >= self._max_per_uid:
                self.refused += 1  # this uid's strangers are at their bound
                sock.close()
                continue
            if len(self.conns) >= self._max_conns:
                if not self._strangers:  # full of sessions: the client falls back to ZeroMQ
                    self.refused += 1
                    sock.close()
                    continue
                self.refused += 1
                self.drop(next(iter(self._strangers)))  # the oldest stranger makes room
            sock.setblocking(False)
            rid = UNIX_RID_PREFIX + b"unix" + next(_rids).to_bytes(8, "little")
            self._strangers[rid] = uid
            self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
            self.conns[rid] = StreamPump(
                sock,
                functools.partial(self._deliver, rid),
                queue_limit=self._queue_limit,
                # a stranger's message is at most a handshake's bound: no big allocations
                max_message=min(self._max_message, self._max_preauth),
                on_lost=functools.partial(self._lost, rid),
                prefix=[rid],
            )
            self._loop.call_later(self._timeout, self._deadline, rid)

    def _accept_failed(self, exc: OSError) -> None:
        """``accept()`` failed (out of fds or memory, most likely: strangers may hold them):
        close the oldest stranger, stop accepting for a pause (50 ms doubling to 1 s; the
        listening socket stays readable, so retrying at once would spin) and say so at a
        bounded rate."""
        self.accept_failed += 1
        self._ratelog.warning(
            "accept", "unix listener %r: accept failed (pausing): %s", self.name[1:], exc
        )
        if self._strangers:
            self.refused += 1
            self.drop(next(iter(self._strangers)))
        self._backoff = min(1.0, max(0.05, self._backoff * 2))
        try:
            self._loop.remove_reader(self._sock.fileno())
        except (ValueError, OSError):
            return
        self._loop.call_later(self._backoff, self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _deliver(self, rid: bytes, msgs: list[Frames]) -> None:
        conn = self.conns.get(rid)
        if conn is None:
            return
        if conn.max_message < self._max_message:  # not authenticated before this batch
            if conn.received > self._max_preauth and not self._authenticated(rid):
                self.drop(rid)  # more than a handshake before authenticating
                return
            self._on_batch(conn, msgs)
            if rid in self.conns and self._authenticated(rid):
                # the handshake is done: full-size messages now, no longer a stranger
                conn.max_message = self._max_message
                self._known(rid)
            return
        self._on_batch(conn, msgs)

    def _known(self, rid: bytes) -> None:
        """``rid`` is no longer an unauthenticated connection (authenticated, or gone)."""
        uid = self._strangers.pop(rid, None)
        if uid is not None:
            left = self._per_uid[uid] - 1
            if left:
                self._per_uid[uid] = left
            else:
                del self._per_uid[uid]

    def _deadline(self, rid: bytes) -> None:
        if rid in self.conns and not self._authenticated(rid):
            self.drop(rid)

    def _lost(self, rid: bytes, reason: str) -> None:
        if self.conns.pop(rid, None) is not None:
            self._known(rid)
            self._on_gone(rid)

    def drop(self, rid: bytes) -> None:
        """Close connection ``rid`` (its session is forgotten through ``on_gone``)."""
        conn = self.conns.pop(rid, None)
        if conn is not None:
            self._known(rid)
            conn.close()
            self._on_gone(rid)

    def send(self, rid: bytes, frames: Sequence[Any]) -> None:
        """Send to connection ``rid`` (dropped when it is gone)."""
        conn = self.conns.get(rid)
        if conn is None:
            return
        try:
            conn.send(frames)
        except ClosedError:
            pass

    def close(self) -> None:
        """Stop listening and close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.remove_reader(self._sock.fileno())
        except (ValueError, OSError, RuntimeError):
            pass
        self._sock.close()
        for conn in list(self.conns.values()):
            conn.close()
        self.conns.clear()
        self._strangers.clear()
        self._per_uid.clear()


__all__ = ["UNIX_RID_PREFIX", "UnixListener", "peer_uid"]
