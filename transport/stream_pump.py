"""The same-host path's framing and the pump that reads and writes one UNIX stream connection.

Framing: ``<I length> <H frames> <I frame length>* frames``, length counting everything after
itself (see ``transport.stream`` for the path as a whole). A :class:`StreamPump` offers
``transport.pump.SocketPump``'s interface over one connection: the messages sent in one loop
iteration leave in one ``sendmsg``; a big message is received in place.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import itertools
import logging
import os
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from rayless.transport.counters import COUNTERS
from rayless.transport.errors import ClosedError, LimitError

log = logging.getLogger("rayless.transport")

Frames = list[Any]
_LEN = struct.Struct("<I")
_ONE = struct.Struct("<IHI")  # length, 1 frame, its length
_RECV = 262144  # bytes asked for per recv
_COALESCE_BYTES = 1 << 20  # a coalesced write is flushed early past this many bytes
_COALESCE_BUFS = 64  # ... or buffers: ~32 small messages, so the peer starts on a burst early


def _iov_max() -> int:
    try:
        value = os.sysconf("SC_IOV_MAX")
    except (ValueError, OSError):
        value = -1
    return value if value >= 16 else 1024


IOV_MAX = _iov_max()  # buffers one sendmsg takes; more fails with EMSGSIZE
MAX_FRAMES = 0xFFFF  # frames of one message: the framing counts them in 16 bits
# Errors of a send or receive that mean the peer went away (anything else is ours: the
# connection is unusable although the peer may be alive).
_PEER_GONE = frozenset((errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN))
_BIG = 1 << 20  # a message this big is received in place, not through the reassembly buffer


def pack_header(frames: Sequence[Any]) -> tuple[bytes, int]:
    """The framing header of a message, and the message's total size (header included).

    Raises:
        LimitError: more than :data:`MAX_FRAMES` frames.
    """
    if len(frames) == 1:  # the common small message: one precompiled struct
        f = frames[0]
        size = f.nbytes if isinstance(f, memoryview) else len(f)
        return _ONE.pack(size + 6, 1, size), size + 10
    lens = [f.nbytes if isinstance(f, memoryview) else len(f) for f in frames]
    n = len(lens)
    if n > MAX_FRAMES:
        raise LimitError(f"a message of {n} frames exceeds the UNIX path's {MAX_FRAMES}")
    body = 2 + 4 * n + sum(lens)
    return struct.pack(f"<IH{n}I", body, n, *lens), body + 4


def split_frames(body: Any) -> Frames:
    """The frames of one message's body (views into it).

    Raises:
        ValueError: the frame table does not match the body.
    """
    view = memoryview(body)
    if len(view) < 2:
        raise ValueError("short message")
    (n,) = struct.unpack_from("<H", view)
    pos = 2 + 4 * n
    if pos > len(view):
        raise ValueError("frame table runs past the message")
    frames: Frames = []
    for size in struct.unpack_from(f"<{n}I", view, 2):
        frames.append(view[pos : pos + size])
        pos += size
    if pos != len(view):
        raise ValueError("frame lengths do not add up to the message")
    return frames


class StreamPump:
    """Reads and writes one UNIX stream socket on the running loop (SocketPump's interface).

    ``on_batch`` gets the messages of each wake-up, each prefixed with ``prefix`` (a routing
    id on the server). ``on_lost(reason)`` is called once when the connection ends (EOF, an
    error, a bad frame) — not on :meth:`close`; :attr:`peer_gone` then says whether the peer
    went away or the failure was ours. Later sends are dropped silently, as ZeroMQ drops
    messages to a vanished peer. A message of any number of frames (up to
    :data:`MAX_FRAMES`) is written IOV_MAX buffers per ``sendmsg`` at most.
    """

    def __init__(
        self,
        sock: socket.socket,
        on_batch: Callable[[list[Frames]], None],
        *,
        queue_limit: int,
        max_message: int,
        on_lost: Callable[[str], None],
        prefix: Sequence[Any] = (),
    ) -> None:
        self.sock = sock
        self._fd = sock.fileno()
        self._on_batch = on_batch
        self._on_lost = on_lost
        self._prefix = list(prefix)
        self.max_message = max_message  # bytes of one message; more ends the connection
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._big: bytearray | None = None
        self._big_pos = 0
        self._out: collections.deque[memoryview] = collections.deque()
        self._queue_limit = queue_limit
        self._room = asyncio.Event()
        self._room.set()
        self._writing = False
        self._closed = False
        self._pending: list[Any] = []  # buffers coalesced this loop iteration
        self._pending_bytes = 0
        self._tick_scheduled = False
        self.lost = False  # the connection ended by itself (not closed by us)
        # ... and whether because the peer went away (EOF, reset), not a failure of ours (a
        # send the kernel refused, a frame that does not parse) with the peer still there
        self.peer_gone = False
        self.received = 0  # bytes read so far (the server's pre-auth bound)
        self.batch_limit = 0  # parity with SocketPump (a stream needs no batches)
        self.batches_sent = self.dropped_batches = 0
        self._loop.add_reader(self._fd, self._on_readable)

    @property
    def queued(self) -> int:
        """Buffers waiting for room in the socket."""
        return len(self._out)

    def poll(self) -> None:
        """Read what is there now."""
        self._on_readable()

    def send(self, frames: Sequence[Any]) -> None:
        """Send now if this is the loop iteration's first message, else at the end of the
        iteration together with the others sent in it (one ``sendmsg``); what the socket does
        not take waits for it. Never blocks. A send that finds the connection gone reports it
        through ``on_lost``.

        Raises:
            ClosedError: the pump was closed (or the connection was lost before).
        """
        if self._closed:
            if self.lost:  # as ZeroMQ does for a vanished peer: nothing will answer
                return
            raise ClosedError("socket is closed")
        header, total = pack_header(frames)
        if self._out:  # the socket is full: keep the order behind what waits
            self._flush_pending()
            self._queue([header, *frames])
            return
        if not self._tick_scheduled:  # the first of this iteration: out at once
            self._tick_scheduled = True
            self._loop.call_soon(self._end_of_iteration)
            self._write([header, *frames], total)
            return
        self._pending.append(header)
        self._pending.extend(frames)
        self._pending_bytes += total
        if self._pending_bytes > _COALESCE_BYTES or len(self._pending) > _COALESCE_BUFS:
            self._flush_pending()
        elif not self._tick_scheduled:
            self._tick_scheduled = True
            self._loop.call_soon(self._end_of_iteration)

    def _end_of_iteration(self) -> None:
        self._tick_scheduled = False
        if not self._closed:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        bufs, total = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        if self._out:
            self._queue(bufs)
        else:
            self._write(bufs, total)

    def _write(self, bufs: list[Any], total: int) -> None:
        if len(bufs) > IOV_MAX:
            return self._write_chunked(bufs)
        COUNTERS.socket_sends += 1
        try:
            sent = self.sock.sendmsg(bufs)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            return self._send_failed(exc)
        if sent < total:
            self._queue(bufs, skip=sent)

    def _write_chunked(self, bufs: list[Any]) -> None:
        """Write more buffers than one ``sendmsg`` takes, IOV_MAX at a time."""
        for start in range(0, len(bufs), IOV_MAX):
            chunk = bufs[start : start + IOV_MAX]
            COUNTERS.socket_sends += 1
            try:
                sent = self.sock.sendmsg(chunk)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                return self._send_failed(exc)
            if sent < sum(b.nbytes if isinstance(b, memoryview) else len(b) for b in chunk):
                return self._queue(bufs[start:], skip=sent)

    def _send_failed(self, exc: OSError) -> None:
        self._lose(f"send failed: {exc}", peer_gone=exc.errno in _PEER_GONE)

    def _queue(self, bufs: Sequence[Any], skip: int = 0) -> None:
        for part in bufs:
            view = memoryview(part).cast("B")
            if skip >= len(view):
                skip -= len(view)
                continue
            self._out.append(view[skip:])
            skip = 0
        if len(self._out) >= self._queue_limit:
            self._room.clear()
        if not self._writing:
            self._writing = True
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        out = self._out
        while out:
            COUNTERS.socket_sends += 1
            try:
                sent = self.sock.sendmsg(list(itertools.islice(out, _COALESCE_BUFS)))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                return self._send_failed(exc)
            while sent and out:
                head = out[0]
                if sent >= len(head):
                    sent -= len(head)
                    out.popleft()
                else:
                    out[0] = head[sent:]
                    sent = 0
        self._writing = False
        self._loop.remove_writer(self._fd)
        self._room.set()

    async def wait_room(self, timeout: float | None) -> None:
        """Wait until the send queue is below its limit.

        Raises:
            TimeoutError: no room within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._room.is_set():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait_for(self._room.wait(), left)

    def _on_readable(self) -> None:
        if self._closed:
            return
        msgs: list[Frames] = []
        try:
            self._read(msgs)
        except ValueError as exc:
            self._lose(str(exc), peer_gone=False)
        if msgs and not self._closed:
            COUNTERS.socket_reads += 1
            self._on_batch(msgs)
            if not self._closed:  # what the handlers answered leaves together
                self._flush_pending()

    def _read(self, msgs: list[Frames]) -> None:
        sock = self.sock
        while not self._closed:
            if self._big is not None:  # a big message lands in place
                try:
                    n = sock.recv_into(memoryview(self._big)[self._big_pos :])
                except (BlockingIOError, InterruptedError):
                    return
                except OSError as exc:
                    return self._lose(f"read failed: {exc}", exc.errno in _PEER_GONE)
                if n == 0:
                    return self._lose("the peer closed the connection")
                self.received += n
                self._big_pos += n
                if self._big_pos == len(self._big):
                    msgs.append([*self._prefix, *split_frames(self._big)])
                    self._big = None
                continue
            try:
                chunk = sock.recv(_RECV)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                return self._lose(f"read failed: {exc}", exc.errno in _PEER_GONE)
            if not chunk:
                return self._lose("the peer closed the connection")
            self.received += len(chunk)
            self._parse(chunk, msgs)
            if len(chunk) < _RECV and self._big is None:
                return  # drained; the reader fires again if more came meanwhile

    def _parse(self, chunk: bytes, msgs: list[Frames]) -> None:
        buf = self._buf
        if buf:
            buf += chunk
            data: Any = buf
            view = memoryview(bytes(buf))  # the buffer changes: its messages get a copy
        else:
            data = chunk
            view = memoryview(chunk)  # immutable: messages are views into it, no copies
        pos, end = 0, len(view)
        prefix, limit, one = self._prefix, self.max_message, _ONE.unpack_from
        while end - pos >= 10:
            size, n, first = one(view, pos)
            if size > limit:
                raise ValueError(f"a message of {size} bytes exceeds {limit}")
            stop = pos + 4 + size
            if stop > end:
                break
            if n == 1 and first == size - 6:  # one frame: skip the frame table
                msgs.append([*prefix, view[pos + 10 : stop]])
            else:
                msgs.append([*prefix, *split_frames(view[pos + 4 : stop])])
            pos = stop
        if pos < end and end - pos >= 4:
            (size,) = _LEN.unpack_from(view, pos)
            if size > limit:
                raise ValueError(f"a message of {size} bytes exceeds {limit}")
            if size >= _BIG:  # receive the rest straight into its own buffer
                self._big = bytearray(size)
                have = end - pos - 4
                self._big[:have] = view[pos + 4 : end]
                self._big_pos = have
                pos = end
        if data is buf:
            del buf[:pos]
        elif pos < end:
            self._buf = bytearray(view[pos:])

    def _lose(self, reason: str, peer_gone: bool = True) -> None:
        if self._closed:
            return
        self.lost = True
        self.peer_gone = peer_gone
        self.close()
        try:
            self._on_lost(reason)
        except Exception:
            log.exception("stream: on_lost hook failed")

    def close(self) -> None:
        """Stop reading and writing and close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for remove in (self._loop.remove_reader, self._loop.remove_writer):
            try:
                remove(self._fd)
            except (ValueError, OSError, RuntimeError):
                pass
        self._out.clear()
        self._pending.clear()
        self._room.set()
        self.sock.close()


__all__ = ["Frames", "StreamPump", "pack_header", "split_frames"]
