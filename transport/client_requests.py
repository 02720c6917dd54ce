"""A client's requests: send, match replies by id, time out, cancel, fail what waits.

Many requests may be in flight on one client; each may have its own timeout. A request that
times out, or whose caller is cancelled, is cancelled at the server too (a CANCEL message).
Part of :class:`~rayless.transport.client.Client` (a mixin; the client holds the state it
declares).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

import zmq

from rayless.transport import codec
from rayless.transport.client_handshake import _CLOSED, _READY
from rayless.transport.errors import BrokenError, ClosedError, RaylessError, Timeout
from rayless.transport.protocol import Kind, Limits, check_outgoing, envelope
from rayless.transport.pump import SocketPump
from rayless.transport.stream_pump import StreamPump

if TYPE_CHECKING:
    from rayless.transport.client import Client


class ClientRequests:
    """The client's REQUEST, ONEWAY and CANCEL messages and its table of pending requests."""

    # the client's state that requests use (set by ``Client.__init__``)
    address: str
    name: str
    limits: Limits
    peer_name: str
    same_host: bool
    _state: str
    _broken_reason: str
    _allow_pickle: bool
    _bounds: tuple[int, int, int]
    _ids: itertools.count[int]
    _pending: dict[int, tuple[asyncio.Future[Any], asyncio.TimerHandle | None]]
    _pump: SocketPump | StreamPump | None
    _last_send: float

    if TYPE_CHECKING:  # the client's session (``transport.client``)

        async def connect(self) -> Client: ...

        async def wait_room(self, timeout: float | None = None) -> None: ...

    async def request(self, body: Any, *, timeout: float | None = None) -> Any:
        """Send ``body`` and wait for the reply.

        Raises:
            Timeout: no reply within ``timeout`` seconds.
            ClosedError / BrokenError: the client closed, or the session broke.
            TypeError: ``body`` cannot be encoded.
            RaylessError or RemoteError: whatever the server's handler raised.
        """
        if self._state != _READY:
            await self.connect()
        elif self._pump is not None and self._pump.queued >= self.limits.send_queue:
            await self.wait_room(timeout)
        req_id, fut = self._send_request(body, timeout)
        try:
            return await fut
        except asyncio.CancelledError:
            self._abandon(req_id)
            raise

    def submit(self, body: Any, *, timeout: float | None = None) -> asyncio.Future[Any]:
        """Send ``body`` now and return a future of the reply (the session must be ready).

        Raises:
            ClosedError / BrokenError: the client is closed, or its session is not ready.
            TypeError: ``body`` cannot be encoded.
        """
        if self._state != _READY:
            if self._state == _CLOSED:
                raise ClosedError(f"client {self.name} is closed")
            raise BrokenError(f"no session with {self.address}: {self._broken_reason or 'new'}")
        req_id, fut = self._send_request(body, timeout)
        fut.add_done_callback(lambda f: self._abandon(req_id) if f.cancelled() else None)
        return fut

    def submit_nowait(self, body: Any, timeout: float | None = None) -> asyncio.Future[Any] | None:
        """The fastest submit: a future of the reply, or None when the session is not ready
        or the send queue is backed up (then use :meth:`request`). An encoding error comes
        back inside the future. Cancelling the future cancels the request at the server."""
        if self._state != _READY or (self._pump is not None and self._pump.queued):
            return None
        try:
            req_id, fut = self._send_request(body, timeout)
        except Exception as exc:
            failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        fut.add_done_callback(lambda f: self._abandon(req_id) if f.cancelled() else None)
        return fut

    def _check_size(self, frames: list[Any]) -> None:
        """Raise LimitError for a message that we or the server would refuse."""
        check_outgoing(frames, self._bounds, self.peer_name or self.address)

    def _send_request(self, body: Any, timeout: float | None) -> tuple[int, asyncio.Future[Any]]:
        frames = codec.encode(
            body, cuda_ipc=self.same_host, shm=self.same_host, allow_pickle=self._allow_pickle
        )
        self._check_size(frames)
        req_id = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, self._expire, req_id, timeout)
        self._pending[req_id] = (fut, timer)
        assert self._pump is not None  # internal invariant: READY implies an open socket
        self._pump.send(envelope(Kind.REQUEST, req_id, frames))
        self._last_send = time.monotonic()
        return req_id, fut

    def send_oneway(self, body: Any) -> None:
        """Send a one-way message (no reply).

        Raises:
            ClosedError / BrokenError: the client is closed, or its session is not ready.
            TypeError: ``body`` cannot be encoded.
        """
        if self._state != _READY or self._pump is None:
            raise (ClosedError if self._state == _CLOSED else BrokenError)(
                f"no session with {self.address}"
            )
        frames = codec.encode(
            body, cuda_ipc=self.same_host, shm=self.same_host, allow_pickle=self._allow_pickle
        )
        self._check_size(frames)
        self._pump.send(envelope(Kind.ONEWAY, 0, frames))
        self._last_send = time.monotonic()

    def _forget(self, req_id: int) -> None:
        entry = self._pending.pop(req_id, None)
        if entry is not None and entry[1] is not None:
            entry[1].cancel()

    def _abandon(self, req_id: int) -> None:
        """Forget a request the caller gave up on and tell the server to cancel it (CANCEL)."""
        entry = self._pending.pop(req_id, None)
        if entry is None:
            return  # answered already, or failed with the session
        if entry[1] is not None:
            entry[1].cancel()
        if self._state == _READY and self._pump is not None:
            try:
                self._pump.send(envelope(Kind.CANCEL, req_id))
            except (RaylessError, zmq.ZMQError):  # closing: nothing to cancel any more
                pass

    def _expire(self, req_id: int, timeout: float) -> None:
        entry = self._pending.get(req_id)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(
                Timeout(f"no reply from {self.peer_name or self.address} within {timeout:g}s")
            )
        self._abandon(req_id)

    def fail_pending(self, exc: RaylessError) -> None:
        """Fail every request waiting for a reply with ``exc`` (a higher layer knows why).

        Used by the actor runtime when the head reports that the peer's process died, which
        it learns long before a heartbeat could time out.
        """
        self._fail_all(exc)

    def _fail_all(self, exc: RaylessError) -> None:
        pending, self._pending = self._pending, {}
        for fut, timer in pending.values():
            if timer is not None:
                timer.cancel()
            if not fut.done():
                fut.set_exception(exc)


__all__ = ["ClientRequests"]
