"""A server's request dispatch: decode each request or one-way message and run its handler.

A sync handler runs inline on the loop (the fast path); one that returns an awaitable runs as
a task the server owns, keyed by (peer, request id) so that a CANCEL can name it. Part of
:class:`~rayless.transport.server.Server` (a mixin; the server holds the state it declares).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from rayless.transport import codec
from rayless.transport.errors import ClosedError, LimitError, ProtocolError
from rayless.transport.peer import Handler, OnewayHandler, Peer, Request
from rayless.transport.protocol import Limits
from rayless.transport.pump import Frames

log = logging.getLogger("rayless.transport")


class RequestDispatch:
    """The server's handling of REQUEST, CANCEL and ONEWAY messages of authenticated peers."""

    # the server's state that dispatch uses (set by ``Server.__init__``)
    name: str
    limits: Limits
    stats: collections.Counter[str]
    _handler: Handler
    _on_oneway: OnewayHandler | None
    _device: Any
    _allow_pickle: bool
    _tasks: set[asyncio.Task[None]]
    _running: dict[tuple[bytes, int], asyncio.Task[None]]
    _cancellable: bool
    _closed: bool

    if TYPE_CHECKING:  # the server's replies and drop counting (``transport.server``)

        def _reply(self, peer: Peer, req_id: int, value: Any) -> None: ...

        def _reply_error(self, peer: Peer, req_id: int, exc: BaseException) -> None: ...

        def _drop(self, category: str, detail: str, rid: bytes | None = None) -> None: ...

    def _decode(self, peer: Peer, frames: Frames) -> Any:
        size = sum(len(f) for f in frames)
        if size > self.limits.max_message_bytes:
            raise LimitError(f"message of {size} bytes exceeds {self.limits.max_message_bytes}")
        if frames and len(frames[0]) > self.limits.max_header_bytes:
            raise LimitError(f"header exceeds {self.limits.max_header_bytes} bytes")
        return codec.decode(frames, device=self._device, allow_pickle=self._allow_pickle)

    def _on_request(self, peer: Peer, req_id: int, frames: Frames) -> None:
        self.stats["requests"] += 1
        if peer.inflight >= self.limits.max_inflight_per_peer:
            self.stats["over_limit"] += 1
            limit = self.limits.max_inflight_per_peer
            return self._reply_error(
                peer, req_id, LimitError(f"more than {limit} requests in flight")
            )
        try:
            body = self._decode(peer, frames)
        except LimitError as exc:
            self.stats["over_limit"] += 1
            self._drop("limit", str(exc), peer.routing_id)
            return self._reply_error(peer, req_id, exc)
        except (ProtocolError, TypeError, ValueError) as exc:
            self._drop("decode", f"undecodable request: {exc}", peer.routing_id)
            return self._reply_error(peer, req_id, ProtocolError(f"undecodable request: {exc}"))
        request = Request(peer, body, req_id)
        try:
            result = self._handler(request)
        except Exception as exc:
            return self._reply_error(peer, req_id, exc)
        if inspect.isawaitable(result):
            peer.inflight += 1
            key = (peer.routing_id, req_id)
            task = asyncio.ensure_future(self._finish(peer, req_id, result))
            self._tasks.add(task)
            self._running[key] = task
            task.add_done_callback(functools.partial(self._finished, peer, key, result))
        else:
            self._reply(peer, req_id, result)

    async def _finish(self, peer: Peer, req_id: int, pending: Awaitable[Any]) -> None:
        try:
            value = await pending
        except asyncio.CancelledError:
            # cancelled by the caller (CANCEL: it forgot the request) or by our own close
            if not self._closed and (peer.routing_id, req_id) in self._running:
                self._reply_error(peer, req_id, ClosedError("request was cancelled"))
            raise
        except Exception as exc:
            self._reply_error(peer, req_id, exc)
        else:
            self._reply(peer, req_id, value)

    def _finished(
        self, peer: Peer, key: tuple[bytes, int], pending: Awaitable[Any], task: asyncio.Task[None]
    ) -> None:
        """A handler task ended (also one cancelled before it ever ran)."""
        self._tasks.discard(task)
        peer.inflight -= 1
        if self._running.get(key) is task:
            del self._running[key]
        if task.cancelled():  # a handler the task never awaited must not linger
            if isinstance(pending, asyncio.Future):
                pending.cancel()
            elif inspect.iscoroutine(pending):
                pending.close()

    def _on_cancel(self, peer: Peer, req_id: int) -> None:
        """The caller gave up on a request: cancel its handler task (no reply is sent)."""
        if not self._cancellable:
            self.stats["cancel_ignored"] += 1
            return
        task = self._running.pop((peer.routing_id, req_id), None)
        if task is not None:
            self.stats["cancelled"] += 1
            task.cancel()

    def _on_oneway_msg(self, peer: Peer, frames: Frames) -> None:
        self.stats["oneway"] += 1
        if self._on_oneway is None:
            return self._drop("oneway", "no one-way handler", peer.routing_id)
        try:
            body = self._decode(peer, frames)
        except (ProtocolError, TypeError, ValueError) as exc:
            return self._drop("decode", f"undecodable one-way message: {exc}", peer.routing_id)
        try:
            result = self._on_oneway(peer, body)
        except Exception:
            log.exception("%s: one-way handler failed", self.name)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._run_oneway(result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_oneway(self, pending: Awaitable[Any]) -> None:
        try:
            await pending
        except Exception:
            log.exception("%s: one-way handler failed", self.name)


__all__ = ["RequestDispatch"]
