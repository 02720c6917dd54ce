"""Bounds on the connections of a ROUTER that have not authenticated yet (docs/security.md).

ZeroMQ hands a ROUTER nothing of a message until all its frames are in (each frame up to
ZMQ_MAXMSGSIZE, any number of frames), and a ROUTER cannot disconnect one peer. So a server
cannot refuse a big message of a stranger by reading it: by then it is in memory. The gate
watches the connections underneath instead:

* a socket monitor reports each accepted connection with its descriptor; the gate keeps a
  duplicate of it (so the number cannot be reused under it) until the peer authenticates;
* an edge-triggered epoll wakes the loop whenever bytes arrive on such a connection, and the
  kernel's count of bytes received (``TCP_INFO.tcpi_bytes_received``, Linux 4.1+) is checked
  against ``Limits.max_preauth_bytes``;
* a connection that has not authenticated ``Limits.handshake_timeout`` seconds after it was
  accepted (or after its last HELLO, for at most ``_HELLOS`` attempts) is dropped, and so is
  the oldest when more than ``max_conns`` are waiting (the server passes
  ``Limits.max_pending_handshakes``, or fewer where the process's descriptors are short:
  each waiting connection holds two, libzmq's and the gate's duplicate);
* a connection accepted when no descriptor is left for its duplicate is shut at once on
  libzmq's descriptor, with the oldest waiting one (``"out_of_fds"``); one already closed
  when its accept is read (a port probe) is let go, and nothing else with it.

Dropping is ``shutdown(2)`` on the duplicate: libzmq sees the end of the stream, closes its
descriptor and frees whatever it had buffered of the peer's messages. A message's source
descriptor (``ZMQ_SRCFD``, read from the routing-id frame) ties a routing id to its connection,
so the server can mark a connection authenticated or drop it for a bad handshake message.

Sessions are bound to connections, not to routing ids (a ZeroMQ peer chooses its own routing
id, so another connection can arrive with the id of a session whose connection is gone): the
gate gives every accepted connection a :class:`Link`, an object that stands for that one
connection until it closes (``link(fd)``; a descriptor reused by a later connection gets a new
one), and reports each closed link to ``on_closed``.

ipc:// connections have no byte count; the timeout and the count bound still apply.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import zmq

from rayless.transport.pump import Frames, SocketPump

_EVENTS = struct.Struct("=hi")
_ACCEPTED, _DISCONNECTED = int(zmq.EVENT_ACCEPTED), int(zmq.EVENT_DISCONNECTED)
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info (Linux >= 4.1)
_HELLOS = 3  # handshake attempts that restart a connection's deadline
_WATCH = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET


class Link:
    """One accepted connection, while it lasts: compared by identity, never by value.

    ``rid`` is the routing id of the session that authenticated on it (None before).
    """

    __slots__ = ("fd", "rid")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.rid: bytes | None = None

    def __repr__(self) -> str:
        return f"Link(fd={self.fd}, rid={self.rid!r})"


class _Conn:
    __slots__ = ("deadline", "fd", "hellos", "rid", "sock", "tcp")

    def __init__(self, fd: int, sock: socket.socket, deadline: float) -> None:
        self.fd = fd
        self.sock = sock
        self.deadline = deadline
        self.tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
        self.hellos = 0
        self.rid: bytes | None = None


def bytes_received(sock: socket.socket) -> int | None:
    """How many bytes the kernel received on a TCP connection (None where it cannot say)."""
    if _TCP_INFO is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except OSError:
        return None
    if len(info) < _BYTES_RECEIVED + 8:
        return None
    return int(struct.unpack_from("=Q", info, _BYTES_RECEIVED)[0])


def _shutdown(fd: int) -> None:
    """``shutdown(2)`` libzmq's descriptor ``fd`` itself (libzmq sees the end of the stream
    and closes it); the descriptor stays libzmq's."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


class Gate:
    """Watches a ROUTER's unauthenticated connections; create it before the socket binds.

    ``on_drop(reason, routing_id)`` is called for every connection that leaves unauthenticated
    (reason ``"preauth_bytes"``, ``"handshake_timeout"``, ``"pending_handshakes"`` or
    ``"preauth_message"``, and ``"disconnected"`` for one the peer closed; routing id None
    when the peer never sent a handshake message). ``on_closed(link)`` is called for every
    connection that ends, authenticated or not.
    """

    def __init__(
        self,
        router: zmq.Socket[Any],
        *,
        max_bytes: int,
        timeout: float,
        max_conns: int,
        on_drop: Callable[[str, bytes | None], None],
        on_closed: Callable[[Link], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._max_bytes = max_bytes
        self._timeout = timeout
        self._max_conns = max_conns
        self._on_drop = on_drop
        self._on_closed = on_closed
        self._router = router
        self._links: dict[int, Link] = {}  # libzmq's descriptor -> the connection on it now
        self._conns: dict[int, _Conn] = {}  # libzmq's descriptor -> connection
        self._by_dup: dict[int, _Conn] = {}  # our duplicate's descriptor -> connection
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._epoll = select.epoll()
        self._loop.add_reader(self._epoll.fileno(), self._on_bytes)
        monitor = router.get_monitor_socket(_ACCEPTED | _DISCONNECTED)
        self._monitor = SocketPump(monitor, self._on_events, head=2, queue_limit=1)
        # Read once now: until its reader has found the pipe empty, libzmq does not signal
        # the socket's descriptor for new events.
        self._monitor.poll()

    @property
    def waiting(self) -> int:
        """Connections accepted and not authenticated (nor dropped) yet."""
        return len(self._conns)

    def link(self, fd: int) -> Link | None:
        """The connection on descriptor ``fd`` now (None when unknown, e.g. inproc); call
        :meth:`sync` first so that a connection closed and replaced on the same descriptor is
        seen as the new one."""
        return self._links.get(fd)

    def adopt(self, fd: int) -> Link:
        """A link for descriptor ``fd`` whose accept the monitor did not report (its queue
        overflowed): a new one, so no session of an earlier connection can match it."""
        link = self._links[fd] = Link(fd)
        return link

    def sync(self) -> None:
        """Take in the monitor's pending events (a connection's accept is reported before
        any of its messages can reach the socket)."""
        self._monitor.poll()

    # -- what the server tells the gate ---------------------------------------------------

    def hello(self, fd: int, rid: bytes) -> None:
        """A handshake starts on connection ``fd``: remember its routing id, and restart its
        deadline (for the first few attempts)."""
        conn = self._conns.get(fd)
        if conn is None:
            return
        conn.rid = rid
        if conn.hellos < _HELLOS:
            conn.hellos += 1
            conn.deadline = time.monotonic() + self._timeout

    def authenticated(self, fd: int) -> None:
        """Connection ``fd`` completed the handshake: stop watching it."""
        conn = self._conns.pop(fd, None)
        if conn is not None:
            self._release(conn)

    def oversized(self, fd: int) -> None:
        """Connection ``fd`` sent a message bigger than a handshake before authenticating:
        drop it unless its bytes are counted (TCP: the byte bound handles it, and the peer
        still gets its rejection)."""
        conn = self._conns.get(fd)
        if conn is not None and (not conn.tcp or bytes_received(conn.sock) is None):
            del self._conns[fd]
            self._shut(conn, "preauth_message")

    # -- monitor events -------------------------------------------------------------------

    def _on_events(self, batch: list[Frames]) -> None:
        for msg in batch:
            if len(msg) < 2 or len(msg[0]) != _EVENTS.size:
                continue
            event, fd = _EVENTS.unpack(msg[0])
            if event == _ACCEPTED:
                self._accepted(fd)
            elif event == _DISCONNECTED:
                conn = self._conns.pop(fd, None)
                if conn is not None:  # gone before it authenticated
                    self._release(conn)
                    self._on_drop("disconnected", conn.rid)
                self._closed_link(fd)

    def _closed_link(self, fd: int) -> None:
        link = self._links.pop(fd, None)
        if link is not None and self._on_closed is not None:
            self._on_closed(link)

    def _accepted(self, fd: int) -> None:
        old = self._conns.pop(fd, None)
        if old is not None:  # its DISCONNECTED was lost
            self._release(old)
        self._closed_link(fd)  # likewise: whatever was on this descriptor is gone
        self._links[fd] = Link(fd)
        try:
            dup = os.dup(fd)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                # gone already: libzmq closed it before this event was read (a peer that
                # connected and closed, as a port probe does); its DISCONNECTED follows
                return
            # out of fds: nothing to watch it with, so it goes now, and the oldest stranger
            _shutdown(fd)  # with it, to make room
            self._on_drop("out_of_fds", None)
            if self._conns:
                self._shut(self._conns.pop(next(iter(self._conns))), "pending_handshakes")
            return
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            return
        conn = _Conn(fd, sock, time.monotonic() + self._timeout)
        self._conns[fd] = conn
        if conn.tcp:
            try:
                self._epoll.register(sock.fileno(), _WATCH)
                self._by_dup[sock.fileno()] = conn
            except OSError:
                pass
            self._check(conn)
        while len(self._conns) > self._max_conns:
            oldest = next(iter(self._conns))
            self._shut(self._conns.pop(oldest), "pending_handshakes")
        if self._timer is None and self._conns:
            self._timer = self._loop.call_later(self._tick(), self._sweep)

    # -- watching -------------------------------------------------------------------------

    def _on_bytes(self) -> None:
        try:
            ready = self._epoll.poll(0)
        except OSError:
            return
        for dup, _ in ready:
            conn = self._by_dup.get(dup)
            if conn is not None:
                self._check(conn)

    def _check(self, conn: _Conn) -> None:
        received = bytes_received(conn.sock)
        if received is not None and received > self._max_bytes:
            del self._conns[conn.fd]
            self._shut(conn, "preauth_bytes")

    def _tick(self) -> float:
        return max(0.05, min(1.0, self._timeout / 4))

    def _sweep(self) -> None:
        self._timer = None
        if self._closed:
            return
        self.sync()
        self._on_bytes()
        now = time.monotonic()
        for fd, conn in list(self._conns.items()):
            if conn.deadline <= now:
                del self._conns[fd]
                self._shut(conn, "handshake_timeout")
        if self._conns:
            self._timer = self._loop.call_later(self._tick(), self._sweep)

    def _shut(self, conn: _Conn, reason: str) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._release(conn)
        self._on_drop(reason, conn.rid)

    def _release(self, conn: _Conn) -> None:
        dup = conn.sock.fileno()
        if self._by_dup.pop(dup, None) is not None:
            try:
                self._epoll.unregister(dup)
            except OSError:
                pass
        conn.sock.close()

    def close(self) -> None:
        """Stop watching; release every duplicate (the connections stay to the socket)."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        try:
            self._loop.remove_reader(self._epoll.fileno())
        except (ValueError, OSError, RuntimeError):
            pass
        for conn in self._conns.values():
            self._release(conn)
        self._conns.clear()
        self._links.clear()
        try:
            self._router.disable_monitor()
        except zmq.ZMQError:
            pass
        self._monitor.close()
        self._epoll.close()
