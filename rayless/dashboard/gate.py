"""The dashboard's door: it accepts every connection itself, bounds what strangers (peers
that have not shown the key yet) can hold, and hands each connection to aiohttp.

aiohttp's own server has no deadline for a request head (a line every few seconds keeps a
connection forever) and no cap on connections, and asyncio's accept loop logs a traceback
for each failed ``accept()`` once the fds run out. So the dashboard listens on a socket of its
own and :class:`Gate` runs the accept loop:

* every accepted connection is a *stranger* until a request on it shows the key (the guard
  middleware then calls :meth:`Gate.trusted`); a stranger has ``head_timeout`` seconds in
  all, from its accept, to get a request through (one deadline for the whole head, not per
  read), and is cut then;
* at most ``max_strangers`` strangers at once in total, and a quarter of that per peer: a new
  connection beyond either cap closes the *oldest* stranger (of that peer, or of all). A peer
  is the local user at the other end for a loopback connection (``transport.tcp_owner`` asks
  the kernel; every local process connects from the same address), else the peer's address.
  So another user's flood only ever pushes out its own connections: it cannot evict a key
  holder's connection while that connection has not sent its request yet (a browser opens
  connections before it has a request for them; a loaded machine may not run the client
  between its connect and its send for a while). ``max_strangers`` also stays within
  the fds the process has left under its soft ``RLIMIT_NOFILE`` (:func:`stranger_room`);
* when ``accept()`` fails for want of fds or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
  loop closes the oldest stranger, backs off (50 ms doubling to 1 s) and logs one line per
  interval (``transport.ratelog``), never a traceback.

Requests that fail the key are answered 403 and their connection is closed
(``rayless.dashboard.server``), so a stranger never holds a connection past one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayless.transport.fds import fds_left
from rayless.transport.ratelog import RateLimitedLog
from rayless.transport.tcp_owner import TcpOwners

__all__ = ["Gate", "stranger_room"]

HEAD_TIMEOUT = 5.0  # seconds from accept for a stranger's first request to show the key
MAX_STRANGERS = 64  # strangers at once, in total (fewer when the fds are short)
LOG_INTERVAL = 5.0
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
log = logging.getLogger("rayless.dashboard")


def stranger_room(wanted: int = MAX_STRANGERS) -> int:
    """How many strangers this process can hold: ``wanted`` at most, and at most half the
    fds left under the soft ``RLIMIT_NOFILE`` (``transport.fds``; 4 at least)."""
    left = fds_left()
    return wanted if left is None else max(4, min(wanted, left // 2))


@dataclass
class _Stranger:
    peer: str
    transport: asyncio.BaseTransport
    timer: asyncio.TimerHandle


class Gate:
    """Accepts on ``sock`` and hands each connection to ``protocol_factory`` (aiohttp's
    server), bounding strangers as the module docstring says. ``stats`` counts: accepted;
    evicted (closed for a newer one past a cap); timed_out (no key within the deadline);
    out_of_fds (failed accepts)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        head_timeout: float = HEAD_TIMEOUT,
        max_strangers: int | None = None,
    ) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self._factory = protocol_factory
        self.head_timeout = head_timeout
        self.max_strangers = stranger_room() if max_strangers is None else max_strangers
        self.per_peer = max(2, self.max_strangers // 4)
        self._strangers: OrderedDict[object, _Stranger] = OrderedDict()
        self._ratelog = RateLimitedLog(log, LOG_INTERVAL)
        self._owners = TcpOwners()
        self._task: asyncio.Task[None] | None = None
        self.stats = dict.fromkeys(("accepted", "evicted", "timed_out", "out_of_fds"), 0)

    def start(self) -> None:
        """Start the accept loop (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._accept_loop())

    async def close(self) -> None:
        """Stop accepting, close the listening socket and every stranger."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sock.close()
        for key in list(self._strangers):
            self._drop(key)
        self._owners.close()

    def trusted(self, protocol: object) -> None:
        """The connection of ``protocol`` showed the key: no deadline or cap for it now."""
        stranger = self._strangers.pop(protocol, None)
        if stranger is not None:
            stranger.timer.cancel()

    # -- the accept loop -----------------------------------------------------------------

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = 0.0
        while True:
            try:
                conn, addr = await loop.sock_accept(self.sock)
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self.stats["out_of_fds"] += 1
                    self._ratelog.warning(
                        "accept",
                        "rayless dashboard: cannot accept (%s): closing the oldest stranger "
                        "and backing off",
                        exc.strerror,
                    )
                    self._drop_oldest(None)
                    backoff = min(1.0, max(0.05, backoff * 2))
                    await asyncio.sleep(backoff)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR):
                    continue  # that client gave up before we took it
                if self.sock.fileno() == -1:
                    return  # closed
                self._ratelog.warning("accept", "rayless dashboard: accept failed: %s", exc)
                await asyncio.sleep(1.0)
                continue
            backoff = 0.0
            self.stats["accepted"] += 1
            await self._admit(loop, conn, self._peer(conn, addr))

    def _peer(self, conn: socket.socket, addr: object) -> str:
        """Whom ``conn`` counts against: its local user's uid, else its address."""
        uid = self._owners.uid(conn)
        if uid is not None:
            return f"uid {uid}"
        return str(addr[0]) if isinstance(addr, tuple) else str(addr)

    async def _admit(self, loop: asyncio.AbstractEventLoop, conn: socket.socket, peer: str) -> None:
        for key in [k for k, s in self._strangers.items() if s.transport.is_closing()]:
            self.trusted(key)  # closed meanwhile (answered 403, or the peer left)
        if sum(1 for s in self._strangers.values() if s.peer == peer) >= self.per_peer:
            self._drop_oldest(peer)
        if len(self._strangers) >= self.max_strangers:
            self._drop_oldest(None)
        try:
            transport, protocol = await loop.connect_accepted_socket(self._factory, conn)
        except OSError:
            conn.close()
            return
        timer = loop.call_later(self.head_timeout, self._expire, protocol)
        self._strangers[protocol] = _Stranger(peer, transport, timer)

    def _expire(self, key: object) -> None:
        if key in self._strangers:
            self.stats["timed_out"] += 1
            self._drop(key)

    def _drop_oldest(self, peer: str | None) -> None:
        for key, stranger in self._strangers.items():
            if peer is None or stranger.peer == peer:
                self.stats["evicted"] += 1
                self._drop(key)
                return

    def _drop(self, key: object) -> None:
        stranger = self._strangers.pop(key, None)
        if stranger is not None:
            stranger.timer.cancel()
            transport: Any = stranger.transport
            transport.abort()
