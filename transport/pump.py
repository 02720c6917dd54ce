"""Drive a ZeroMQ socket from an asyncio loop, without zmq.asyncio's per-message futures.

zmq.asyncio wraps every receive in a future and every wake-up in a poller round, which caps
a round trip at ~2.5k/s on these machines (PERF_NOTES.md). Here a reader callback on the
socket's edge-triggered FD drains every ready message with non-blocking receives and hands the
whole batch to the owner; sends go out inline with NOBLOCK and are queued only when ZeroMQ
pushes back. After every socket operation ``ZMQ_EVENTS`` is re-checked, because an operation
can consume the FD's edge.

Coalescing: the first small one-frame message to a peer in a loop iteration goes out at once
(no added latency); the ones that follow it in the same iteration are gathered and sent as one
BATCH message (``protocol.pack_batch``) when the iteration's pump runs, at most
``batch_limit`` bytes each. Received batches are split here (``protocol.split_batch``), so the
owner sees every message as if it had travelled alone. Order per peer is kept.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import zmq

from rayless.transport.counters import COUNTERS
from rayless.transport.errors import ClosedError, ProtocolError
from rayless.transport.protocol import is_batch, pack_batch, split_batch

log = logging.getLogger("rayless.transport")

Frames = list[Any]
COPY_THRESHOLD = 65536
# pyzmq's constants are enums: combining them builds enum objects on every call. Plain ints.
NOBLOCK, SNDMORE, RCVMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.RCVMORE)
EVENTS, POLLIN, POLLOUT = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.POLLOUT)
_BATCH = 256
BATCH_LIMIT = 32768  # bytes of one coalesced batch (below any peer's sane message limit)


def send_frames(sock: zmq.Socket[Any], frames: Sequence[Any], flags: int = 0) -> None:
    """Send a multipart message: small frames copied, big ones handed to ZeroMQ without copy.

    Raises:
        zmq.Again: the first frame could not be queued (HWM reached); nothing was sent.
    """
    COUNTERS.socket_sends += 1
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = SNDMORE if i < last else 0
        if isinstance(frame, bytes) and len(frame) < COPY_THRESHOLD:
            sock.send(frame, flags | more, copy=True)
        else:
            size = frame.nbytes if isinstance(frame, memoryview) else len(frame)
            sock.send(frame, flags | more, copy=size < COPY_THRESHOLD)


def _readable(sock: zmq.Socket[Any]) -> bool:
    return bool(cast(int, sock.getsockopt(EVENTS)) & POLLIN)


class SocketPump:
    """Reads and writes one ZeroMQ socket on the running loop.

    ``on_batch`` receives every message (a list of frames: the first ``head`` frames as bytes,
    the rest as ``zmq.Frame``) drained in one wake-up; with ``first_frame`` the first frame is
    a ``zmq.Frame`` too (a ROUTER's routing id, whose ``ZMQ_SRCFD`` names the connection).
    ``may_split(first frame)`` decides whether a received BATCH is split into its messages or
    handed over whole (a ROUTER splits only an authenticated session's).
    ``send`` never blocks: messages that ZeroMQ refuses (EAGAIN) wait in a bounded queue,
    flushed when the socket turns writable.
    """

    def __init__(
        self,
        sock: zmq.Socket[Any],
        on_batch: Callable[[list[Frames]], None],
        *,
        head: int,
        queue_limit: int,
        retry_interval: float | None = None,
        first_frame: bool = False,
        may_split: Callable[[Any], bool] | None = None,
    ) -> None:
        self.sock = sock
        self._may_split = may_split
        self._copy_first = not first_frame
        self._on_batch = on_batch
        self._head = head
        self._queue: collections.deque[Sequence[Any]] = collections.deque()
        self._queue_limit = queue_limit
        self._room = asyncio.Event()
        self._room.set()
        self._loop = asyncio.get_running_loop()
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        self._scheduled = False
        self._closed = False
        # A ROUTER's POLLOUT says nothing about one peer, so its queue is retried on a timer.
        self._retry_interval = retry_interval
        self._retry: asyncio.TimerHandle | None = None
        # Coalescing: per peer (routing id, or None for a DEALER), the small messages sent
        # after the first one of this loop iteration; a key with an empty list sent one inline.
        self._routed = first_frame
        self._out: dict[Any, list[bytes]] = {}
        self._out_bytes: dict[Any, int] = {}
        self.batch_limit = BATCH_LIMIT
        self.batches_sent = 0
        self.dropped_batches = 0
        self._loop.add_reader(self._fd, self._pump)

    @property
    def queued(self) -> int:
        """Messages waiting for room in the socket."""
        return len(self._queue)

    def _recv_one(self, batch: list[Frames]) -> None:
        """Append one whole message (the caller saw POLLIN, so its first frame is there) to
        ``batch``, split into its messages when it is a BATCH."""
        sock = self.sock
        msg: Frames = [sock.recv(NOBLOCK, copy=self._copy_first)]
        head = self._head
        while sock.getsockopt(RCVMORE):
            msg.append(sock.recv(copy=len(msg) < head))
        if len(msg) == head and is_batch(msg[head - 1]):
            if self._may_split is not None and not self._may_split(msg[0]):
                batch.append(msg)  # not a session's: whole, for the owner to drop
                return
            try:
                parts = split_batch(msg[head - 1])
            except ProtocolError as exc:
                self.dropped_batches += 1
                log.debug("dropping a malformed batch: %s", exc)
                return
            prefix = msg[: head - 1]
            batch.extend([*prefix, part] for part in parts)
            return
        batch.append(msg)

    def poll(self) -> None:
        """Move what can be moved now (without waiting for the loop to notice the socket)."""
        self._pump()

    def _pump(self) -> None:
        """Move data until ZeroMQ has nothing to give and cannot take more."""
        self._scheduled = False
        if self._closed:
            return
        sock = self.sock
        try:
            while True:
                if self._out:  # before asking ZMQ_EVENTS: a send can consume the FD's edge
                    self._flush_out()
                events = cast(int, sock.getsockopt(EVENTS))
                progressed = False
                if self._queue and events & POLLOUT:
                    progressed = self._flush()
                if events & POLLIN:
                    # ask ZMQ_EVENTS between messages: cheaper than a zmq.Again exception
                    batch: list[Frames] = []
                    self._recv_one(batch)
                    while len(batch) < _BATCH and _readable(sock):
                        self._recv_one(batch)
                    progressed = True
                    if batch:
                        COUNTERS.socket_reads += 1
                        self._on_batch(batch)
                    if self._closed:
                        return
                if not progressed:
                    break
        except zmq.ZMQError as exc:
            if self._closed or exc.errno == zmq.ENOTSOCK:
                return
            log.warning("socket error while pumping: %s", exc)

    def _flush(self) -> bool:
        sent = False
        while self._queue:
            try:
                send_frames(self.sock, self._queue[0], NOBLOCK)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                log.debug("dropping a queued message to a vanished peer")
            self._queue.popleft()
            sent = True
        if len(self._queue) < self._queue_limit:
            self._room.set()
        if self._queue and self._retry_interval is not None and self._retry is None:
            self._retry = self._loop.call_later(self._retry_interval, self._retry_flush)
        return sent

    def _retry_flush(self) -> None:
        self._retry = None
        if not self._closed:
            self._flush()
            self._kick()

    def _kick(self) -> None:
        """Pump once more on the next loop iteration: a send may have consumed the FD's edge.

        One deferred pump covers a whole burst of sends (cheaper than asking ZMQ_EVENTS after
        each of them).
        """
        if not self._scheduled and not self._closed:
            self._scheduled = True
            self._loop.call_soon(self._pump)

    def send(self, frames: Sequence[Any]) -> None:
        """Send now, or queue when ZeroMQ pushes back. Never blocks.

        Raises:
            ClosedError: the pump was closed.
            zmq.ZMQError: EHOSTUNREACH for a ROUTER whose peer is gone.
        """
        if self._closed:
            raise ClosedError("socket is closed")
        routed = self._routed
        key = frames[0] if routed else None
        if self._queue:
            if key in self._out:  # what this peer's batch holds goes before it
                self._flush_key(key)
            self._enqueue(frames)
            return
        body = frames[-1]
        if len(frames) == 1 + routed and type(body) is bytes and len(body) < self.batch_limit:
            later = self._out.get(key)
            if later is not None:  # not the first this iteration: coalesce
                size = self._out_bytes[key] + len(body) + 4
                if size > self.batch_limit:
                    self._flush_key(key)
                    self._out[key] = later = []
                    size = len(body) + 4
                later.append(body)
                self._out_bytes[key] = size
                self._kick()
                return
            self._out[key] = []
            self._out_bytes[key] = 0
        elif key in self._out:  # keep the peer's order: what waits goes first
            self._flush_key(key)
        try:
            send_frames(self.sock, frames, NOBLOCK)
        except zmq.Again:
            self._enqueue(frames)
        self._kick()

    def _flush_out(self) -> None:
        """Send what was coalesced this iteration: one message per peer."""
        for key in list(self._out):
            self._flush_key(key)
        self._out.clear()
        self._out_bytes.clear()

    def _flush_key(self, key: Any) -> None:
        later = self._out.pop(key, None)
        self._out_bytes.pop(key, None)
        if not later:
            return
        body = later[0] if len(later) == 1 else pack_batch(later)
        frames = [key, body] if self._routed else [body]
        if len(later) > 1:
            self.batches_sent += 1
        if self._queue:
            self._enqueue(frames)
            return
        try:
            send_frames(self.sock, frames, NOBLOCK)
        except zmq.Again:
            self._enqueue(frames)
        except zmq.ZMQError as exc:  # a ROUTER's peer that vanished meanwhile
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            log.debug("dropping coalesced messages to a vanished peer")

    def _enqueue(self, frames: Sequence[Any]) -> None:
        self._queue.append(frames)
        if len(self._queue) >= self._queue_limit:
            self._room.clear()
        if self._retry_interval is not None and self._retry is None:
            self._retry = self._loop.call_later(self._retry_interval, self._retry_flush)

    async def wait_room(self, timeout: float | None) -> None:
        """Wait until the send queue is below its limit (backpressure for callers).

        Raises:
            TimeoutError: no room within ``timeout`` seconds.
        """
        if self._room.is_set():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._room.is_set():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait_for(self._room.wait(), left)

    def close(self) -> None:
        """Stop reading, drop queued messages and close the socket at once (LINGER=0)."""
        if self._closed:
            return
        self._closed = True
        self._out.clear()
        if self._retry is not None:
            self._retry.cancel()
        try:
            self._loop.remove_reader(self._fd)
        except (ValueError, OSError, RuntimeError):
            pass
        self._queue.clear()
        self._room.set()
        self.sock.close(linger=0)
