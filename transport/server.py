"""The ROUTER side: a server that authenticates peers and answers their requests.

A :class:`Server` binds ``tcp://`` or ``ipc://`` (port 0 picks a free port; ``address`` reports
it), authenticates each peer with the HMAC handshake of ``transport.protocol``, and hands
decoded requests to one handler. Sync handlers run inline on the loop (the fast path); a
handler that returns an awaitable runs as a task the server owns. Nothing unauthenticated
reaches a handler; frames that do not parse are dropped, counted and logged at a rate limit.
A server made ``cancellable`` cancels a handler's task when its caller sends CANCEL (it timed
out or was cancelled).

This module holds the socket's lifecycle, sending and replies, the routing of each received
message, the server's side of the handshake, the dispatch of requests (handlers inline or as
owned tasks, CANCEL, one-way messages) and peer bookkeeping (expiry). What handlers are given
(:class:`Peer`, :class:`Request`) lives in ``transport.peer``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import zmq

from rayless.transport import codec
from rayless.transport.errors import (
    AuthError,
    ClosedError,
    LimitError,
    ProtocolError,
    RaylessError,
    RemoteError,
    safe_text,
)
from rayless.transport.fds import fds_left
from rayless.transport.gate import Gate, Link
from rayless.transport.peer import Handler, OnewayHandler, Peer, Request
from rayless.transport.protocol import (
    HANDSHAKE_MAX,
    PROTOCOL,
    Kind,
    Limits,
    RejectCode,
    as_token,
    check_outgoing,
    check_version,
    client_proof,
    curve_enabled,
    curve_server_keys,
    envelope,
    frames_nbytes,
    host_id,
    new_nonce,
    open_envelope,
    peer_bounds,
    pickle_allowed,
    proofs_match,
    server_proof,
    session_key,
)
from rayless.transport.pump import Frames, SocketPump
from rayless.transport.ratelog import RateLimitedLog
from rayless.transport.stream import unix_name
from rayless.transport.stream_pump import StreamPump
from rayless.transport.unix_listener import UNIX_RID_PREFIX, UnixListener
from rayless.transport.zmq_context import zmq_context

log = logging.getLogger("rayless.transport")


def _srcfd(frame: Any) -> int:
    """The descriptor of the connection a received frame came from (-1 when unknown)."""
    try:
        return int(frame.get(zmq.SRCFD))
    except (AttributeError, zmq.ZMQError):
        return -1


def _error_payload(exc: BaseException) -> list[Any]:
    """Frames that carry ``exc`` back to a caller; an error that cannot be encoded (an
    argument nested past the codec's depth, say) as a ``RemoteError`` naming its type and
    the start of its message, so that the call still ends."""
    if not isinstance(exc, RaylessError):
        exc = RemoteError.from_exception(exc)
    try:
        return codec.encode(exc)
    except Exception as failed:
        kind = type(exc)
        text = f"{safe_text(exc, str):.1000} (the error could not be sent whole: "
        text += f"{type(failed).__name__}: {safe_text(failed, str):.200})"
        return codec.encode(RemoteError(f"{kind.__module__}.{kind.__qualname__}", text))


class Server:
    """A ROUTER endpoint answering authenticated requests. Use ``async with``.

    Args:
        address: ``tcp://HOST:PORT`` (port 0 → a free port) or ``ipc://PATH``.
        token: the cluster token (bytes or str, at least 16 bytes).
        handler: called with each :class:`Request`; returns the reply, or an awaitable of it.
            Exceptions travel back to the caller (non-rayless ones as RemoteError).
        on_oneway: called with (peer, body) for one-way messages.
        on_peer_gone: called with a peer when it says BYE, its connection closes, or it expires.
        peer_idle_timeout: forget ZeroMQ peers silent for this long (clients heartbeat far more
            often); a same-host (UNIX path) peer is forgotten when its connection closes.
        device: where decoded CUDA tensors land (see ``codec.decode``).
        limits: bounds on peers and messages (default: ``Limits.from_env()``).
        curve: encrypt the connection with ZeroMQ CURVE, keys derived from the token (default:
            the ``RAYLESS_CURVE`` variable); clients must use it too. See docs/security.md.
        cancellable: a CANCEL from the caller (it timed out or was cancelled) cancels the
            handler's task; handlers must then be safe to cancel at any ``await``. Off by
            default: CANCELs are counted (``stats["cancel_ignored"]``) and the handler runs on.
    """

    def __init__(
        self,
        address: str = "tcp://127.0.0.1:0",
        *,
        token: bytes | str,
        handler: Handler,
        on_oneway: OnewayHandler | None = None,
        on_peer_gone: Callable[[Peer], None] | None = None,
        name: str = "server",
        limits: Limits | None = None,
        peer_idle_timeout: float = 30.0,
        device: Any = None,
        allow_pickle: bool | None = None,
        context: zmq.Context[Any] | None = None,
        curve: bool | None = None,
        cancellable: bool = False,
    ) -> None:
        self._token = as_token(token)
        self._curve = curve_enabled(curve)
        self._requested_address = address
        self.address = address
        self.name = name
        self.limits = limits or Limits.from_env()
        self._handler = handler
        self._on_oneway = on_oneway
        self._on_peer_gone = on_peer_gone
        self._peer_idle_timeout = peer_idle_timeout
        self._device = device
        self._allow_pickle = pickle_allowed(allow_pickle)  # None: RAYLESS_ALLOW_PICKLE
        self._ctx = context or zmq_context()
        self._peers: dict[bytes, Peer] = {}
        # half-open handshakes: routing id -> (client nonce, our nonce, HELLO, connection)
        self._pending: collections.OrderedDict[
            bytes, tuple[bytes, bytes, dict[str, Any], object]
        ] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        # handler tasks by (peer routing id, request id): what a CANCEL names
        # handlers still running, by (peer, request id): a task for a coroutine, or the future
        # a handler returned (an actor's def method queued on its worker), awaited by none
        self._running: dict[tuple[bytes, int], asyncio.Future[Any]] = {}
        self._cancellable = cancellable
        self._pump: SocketPump | None = None
        self._gate: Gate | None = None
        self._unix: UnixListener | None = None
        self._fds_left: int | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        self._host = host_id()
        self.stats: collections.Counter[str] = collections.Counter()
        self._ratelog = RateLimitedLog(log, interval=5.0)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> Server:
        """Bind and start serving.

        Raises:
            ClosedError: the server was already closed.
            zmq.ZMQError: the address cannot be bound.
        """
        if self._closed:
            raise ClosedError("server is closed")
        if self._pump is not None:
            return self
        self._fds_left = fds_left()  # what the bounds on strangers must fit in
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.SNDHWM, self.limits.hwm)
            sock.setsockopt(zmq.RCVHWM, self.limits.hwm)
            sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
            if self._curve:
                public, secret = curve_server_keys(self._token)
                sock.curve_server = True
                sock.curve_publickey = public
                sock.curve_secretkey = secret
            address = self._requested_address
            if address.startswith("tcp://") and address.endswith(":0"):
                address = address[:-2] + ":*"
            self._gate = Gate(
                sock,
                max_bytes=self.limits.max_preauth_bytes,
                timeout=self.limits.handshake_timeout,
                max_conns=self._stranger_cap(self.limits.max_pending_handshakes, 4),
                on_drop=self._on_gate_drop,
                on_closed=self._on_link_closed,
            )
            sock.bind(address)
            self.address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            if self._gate is not None:
                self._gate.close()
                self._gate = None
            sock.close(linger=0)
            raise
        self._pump = SocketPump(
            sock,
            self._on_batch,
            head=2,
            queue_limit=self.limits.send_queue,
            retry_interval=0.002,
            first_frame=True,
            may_split=self._may_split,
        )
        self._start_unix()
        self._schedule_sweep()
        return self

    def _stranger_cap(self, wanted: int, share: int) -> int:
        """``wanted``, or 1/``share`` of the descriptors this process has left
        (``transport.fds``) where that is fewer (8 at least): strangers must not run the
        server out of descriptors before its bounds apply."""
        if self._fds_left is None:
            return max(1, wanted)
        return max(1, min(wanted, max(8, self._fds_left // share)))

    def _start_unix(self) -> None:
        """Also listen on this address's abstract UNIX socket (``transport.stream``)."""
        name = unix_name(self.address)
        if name is None or self._curve:  # CURVE asks for ZeroMQ's encryption: no bypass
            return
        try:
            self._unix = UnixListener(
                name,
                self._on_unix_batch,
                authenticated=lambda rid: rid in self._peers,
                on_gone=self._on_unix_gone,
                queue_limit=self.limits.send_queue,
                max_message=self.limits.max_message_bytes,
                max_preauth_bytes=self.limits.max_preauth_bytes,
                handshake_timeout=self.limits.handshake_timeout,
                max_conns=self.limits.max_peers + self.limits.max_pending_handshakes,
                max_pending_per_uid=self._stranger_cap(self.limits.max_pending_handshakes // 4, 8),
            )
        except OSError as exc:  # e.g. the name is taken: clients then use ZeroMQ
            log.info("%s: no same-host UNIX path (%s)", self.name, exc)

    def _on_unix_gone(self, rid: bytes) -> None:
        self._pending.pop(rid, None)
        self._forget(rid)

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop serving: cancel running handlers, close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for running in list(self._running.values()):
            running.cancel()  # the futures handlers returned (tasks: above)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._gate is not None:
            self._gate.close()
        if self._unix is not None:
            self._unix.close()
        if self._pump is not None:
            self._pump.close()
        self._peers.clear()
        self._pending.clear()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._closed

    @property
    def peers(self) -> list[Peer]:
        """The authenticated peers."""
        return list(self._peers.values())

    # -- sending -----------------------------------------------------------------------

    def _send(self, rid: bytes, frames: list[Any]) -> None:
        if self._pump is None or self._closed:
            return
        if self._unix is not None and rid[:1] == UNIX_RID_PREFIX and rid in self._unix.conns:
            return self._unix.send(rid, frames)
        self._send_zmq(rid, frames)

    def _send_zmq(self, rid: bytes, frames: list[Any]) -> None:
        if self._pump is None or self._closed:
            return
        try:
            self._pump.send([rid, *frames])
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.stats["unreachable"] += 1
            self._forget(rid)

    def send_oneway(self, peer: Peer | bytes, body: Any) -> None:
        """Push a one-way message to an authenticated peer (dropped if it is gone).

        Raises:
            ClosedError: the server is closed.
            TypeError: ``body`` cannot be encoded.
        """
        if self._closed:
            raise ClosedError(f"server {self.name} is closed")
        p = peer if isinstance(peer, Peer) else self._peers.get(peer)
        if p is None:
            return
        frames = codec.encode(
            body, cuda_ipc=p.same_host, shm=p.same_host, allow_pickle=self._allow_pickle
        )
        check_outgoing(frames, p.bounds, p.name)
        self._send(p.routing_id, envelope(Kind.ONEWAY, 0, frames))

    def _reject(self, rid: bytes, code: RejectCode, reason: str, req_id: int = 0) -> None:
        payload = msgpack.packb({"code": int(code), "reason": reason})
        self._send(rid, envelope(Kind.REJECT, req_id, [payload]))

    def _reply(self, peer: Peer, req_id: int, value: Any) -> None:
        try:
            frames = codec.encode(
                value,
                cuda_ipc=peer.same_host,
                shm=peer.same_host,
                allow_pickle=self._allow_pickle,
                root="result",
            )
        except Exception as exc:
            return self._reply_error(peer, req_id, exc)
        try:  # a reply the caller would refuse: tell it now, do not let it wait for it
            check_outgoing(frames, peer.bounds, f"caller {peer.name}")
        except LimitError as exc:
            self.stats["reply_over_limit"] += 1
            return self._reply_error(peer, req_id, exc)
        self._send(peer.routing_id, envelope(Kind.REPLY, req_id, frames))

    def _reply_error(self, peer: Peer, req_id: int, exc: BaseException) -> None:
        frames = _error_payload(exc)
        try:
            check_outgoing(frames, peer.bounds, f"caller {peer.name}")
        except LimitError as too_big:  # e.g. a huge traceback: send the reason, not the error
            frames = _error_payload(LimitError(f"the error reply was refused: {too_big}"))
        self._send(peer.routing_id, envelope(Kind.ERROR, req_id, frames))

    # -- receiving ---------------------------------------------------------------------

    def _drop(self, category: str, detail: str, rid: bytes | None = None) -> None:
        """Count and log (at a rate limit per fixed category) a message we will not serve."""
        self.stats["dropped"] += 1
        self._ratelog.warning(
            category, "%s: dropped a message from %r (%s): %s", self.name, rid, category, detail
        )

    def _link_of(self, first: Any) -> tuple[int, Link | None]:
        """The descriptor and connection a ROUTER message came on (its routing-id frame)."""
        fd = _srcfd(first)
        gate = self._gate
        if gate is None or fd < 0:
            return fd, None
        return fd, gate.link(fd) or gate.adopt(fd)

    def _may_split(self, first: Any) -> bool:
        """Whether the pump may split a BATCH that arrived with routing-id frame ``first``:
        only a session's, on the connection it authenticated on (nothing of a stranger's
        message is parsed but its handshake)."""
        peer = self._peers.get(first.bytes)
        if peer is None:
            return False
        if self._gate is not None:
            self._gate.sync()
        return peer.link is self._link_of(first)[1]

    def _on_batch(self, batch: list[Frames]) -> None:
        """Messages from the ROUTER."""
        now = time.monotonic()
        if self._gate is not None:  # connections closed and accepted since the last batch
            self._gate.sync()
        for msg in batch:
            try:
                first = msg[0]  # the routing id, as a zmq.Frame (its SRCFD names the connection)
                rid = first.bytes
                if rid[:1] == UNIX_RID_PREFIX:  # the same-host path's ids: never over ZeroMQ
                    self.stats["unbound"] += 1
                    self._drop("routing_id", "a same-host routing id over ZeroMQ", rid)
                    payload = msgpack.packb(
                        {"code": int(RejectCode.NEED_HANDSHAKE), "reason": "handshake first"}
                    )
                    self._send_zmq(rid, envelope(Kind.REJECT, 0, [payload]))
                    continue
                fd, link = self._link_of(first)
                self._on_message(rid, fd, link, msg, now)
            except Exception as exc:  # never let one message stop the server
                self._drop("internal", f"{type(exc).__name__}: {exc}", None)

    def _on_unix_batch(self, conn: StreamPump, batch: list[Frames]) -> None:
        """Messages from one connection of the same-host path."""
        now = time.monotonic()
        for msg in batch:
            try:
                self._on_message(msg[0], -1, conn, msg, now)
            except Exception as exc:  # never let one message stop the server
                self._drop("internal", f"{type(exc).__name__}: {exc}", None)

    def _on_message(self, rid: bytes, fd: int, link: object, msg: Frames, now: float) -> None:
        if len(msg) < 2:
            return self._drop("framing", "no control frame", rid)
        peer = self._peers.get(rid)
        if peer is not None and peer.link is not link:
            # another connection with the routing id of a session (a ZeroMQ peer picks its
            # own): never served as that session
            self.stats["unbound"] += 1
            self._ratelog.warning(
                "unbound",
                "%s: refused a message with the routing id of session %r from another connection",
                self.name,
                peer.name,
            )
            return self._reject(rid, RejectCode.NEED_HANDSHAKE, "no session on this connection")
        if peer is None:
            return self._on_stranger(rid, fd, link, msg)
        try:
            kind, req_id, payload = open_envelope(msg, 1)
        except ProtocolError as exc:
            return self._drop("control", str(exc), rid)
        if len(msg) > self.limits.max_frames + 2:
            self._drop("framing", "too many frames", rid)
            if peer is not None and kind is Kind.REQUEST:  # tell the caller, do not let it wait
                self.stats["over_limit"] += 1
                limit = self.limits.max_frames
                self._reply_error(peer, req_id, LimitError(f"message of more than {limit} frames"))
            return None
        peer.last_seen = now
        if kind is Kind.REQUEST:
            self._on_request(peer, req_id, payload)
        elif kind is Kind.PING:
            self._send(rid, envelope(Kind.PONG, req_id))
        elif kind is Kind.ONEWAY:
            self._on_oneway_msg(peer, payload)
        elif kind is Kind.CANCEL:
            self._on_cancel(peer, req_id)
        elif kind is Kind.BYE:
            self._forget(rid)
        elif kind is Kind.HELLO:  # a reconnect that reused the routing id: start over
            self._forget(rid)
            self._on_hello(rid, payload, link)
        else:
            self._drop("kind", f"unexpected {kind.name} in a session", rid)

    # -- peers -------------------------------------------------------------------------

    def _on_link_closed(self, link: Link) -> None:
        """A ROUTER connection ended: its session (if any) ends with it."""
        rid = link.rid
        if rid is not None:
            peer = self._peers.get(rid)
            if peer is not None and peer.link is link:
                self.stats["disconnected"] += 1
                self._forget(rid)

    def _forget(self, rid: bytes) -> None:
        peer = self._peers.pop(rid, None)
        if peer is not None and self._on_peer_gone is not None:
            try:
                self._on_peer_gone(peer)
            except Exception:
                log.exception("%s: on_peer_gone failed", self.name)

    def _schedule_sweep(self) -> None:
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(max(0.05, self._peer_idle_timeout / 4), self._sweep)

    def _sweep(self) -> None:
        if self._closed:
            return
        deadline = time.monotonic() - self._peer_idle_timeout
        for rid, peer in list(self._peers.items()):
            # a same-host stream ends with its process (kill -9 included): while it is open the
            # peer is alive, however long its loop is held; ZeroMQ peers expire when silent
            if isinstance(peer.link, StreamPump):
                continue
            if peer.last_seen < deadline and peer.inflight == 0:
                self.stats["expired"] += 1
                self._forget(rid)
        self._schedule_sweep()

    # -- dispatch of REQUEST, CANCEL and ONEWAY --------------------------------------------

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
        if isinstance(result, asyncio.Future):  # no task needed: its result is the reply
            peer.inflight += 1
            key = (peer.routing_id, req_id)
            self._running[key] = result
            result.add_done_callback(functools.partial(self._future_done, peer, key))
        elif inspect.isawaitable(result):
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

    def _future_done(self, peer: Peer, key: tuple[bytes, int], fut: asyncio.Future[Any]) -> None:
        """A future a handler returned is done: reply with its outcome (as :meth:`_finish`
        does for a coroutine), unless the caller cancelled it or we are closing."""
        peer.inflight -= 1
        ours = self._running.get(key) is fut
        if ours:
            del self._running[key]
        if fut.cancelled():
            if ours and not self._closed:  # cancelled by the handler's side, not by CANCEL
                self._reply_error(peer, key[1], ClosedError("request was cancelled"))
            return
        exc = fut.exception()
        if exc is None:
            self._reply(peer, key[1], fut.result())
        elif isinstance(exc, Exception):
            self._reply_error(peer, key[1], exc)
        # else a BaseException (an actor exiting from its method): no reply, as from a task

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

    # -- handshake: HELLO, AUTH and what comes before --------------------------------------

    def _on_stranger(self, rid: bytes, fd: int, link: object, msg: Frames) -> None:
        """A message of a peer that has not authenticated on connection ``link`` (descriptor
        ``fd`` for a ROUTER connection, -1 on the same-host path; see ``transport.gate``).
        Only a handshake message is parsed; a BATCH is not split (``_may_split``)."""
        gate = self._gate if fd >= 0 else None
        if gate is not None and (len(msg) > 3 or frames_nbytes(msg) > HANDSHAKE_MAX + 512):
            gate.oversized(fd)  # bigger than a handshake: no more of that
        try:
            kind, req_id, frames = open_envelope(msg, 1)
        except ProtocolError as exc:
            return self._drop("control", str(exc), rid)
        if kind is Kind.HELLO:
            if gate is not None:
                gate.hello(fd, rid)
            return self._on_hello(rid, frames, link)
        if kind is Kind.AUTH:
            if self._on_auth(rid, frames, link) and gate is not None:
                gate.authenticated(fd)
            return None
        if kind in (Kind.REQUEST, Kind.PING, Kind.ONEWAY):
            # a peer we forgot (expired, or a reconnect): tell it to start over
            self.stats["unauthenticated"] += 1
            self._reject(rid, RejectCode.NEED_HANDSHAKE, "no session; handshake first", req_id)
            return None
        if kind is Kind.CANCEL or kind is Kind.BYE:
            # of a peer cut off as it cancels or leaves (its session ended, as at a shutdown):
            # nothing to cancel or forget but a half-open handshake of this connection
            if kind is Kind.BYE and self._pending.get(rid, (None,) * 4)[3] is link:
                del self._pending[rid]
            self.stats["unauthenticated"] += 1
            return None
        self._drop("handshake", f"{kind.name} before the handshake", rid)

    def _handshake_body(self, frames: Frames) -> dict[str, Any]:
        if len(frames) != 1 or len(frames[0]) > HANDSHAKE_MAX:
            raise ProtocolError("malformed handshake message")
        body = msgpack.unpackb(bytes(frames[0]), raw=False)
        if not isinstance(body, dict):
            raise ProtocolError("handshake body is not a map")
        return body

    def _on_hello(self, rid: bytes, frames: Frames, link: object) -> None:
        try:
            body = self._handshake_body(frames)
            nonce_c = body.get("nonce")
            if not isinstance(nonce_c, bytes) or len(nonce_c) != 32:
                raise ProtocolError("bad client nonce")
        except Exception as exc:
            self._drop("handshake", f"bad HELLO: {exc}", rid)
            return self._reject(rid, RejectCode.PROTOCOL, "malformed HELLO")
        try:
            check_version(body.get("v"), f"peer {str(body.get('name', '?'))[:200]!r}")
        except ProtocolError as exc:  # another rayless version: say so, do not time out
            self.stats["version_mismatch"] += 1
            self._ratelog.warning("version", "%s: refused a handshake: %s", self.name, exc)
            return self._reject(rid, RejectCode.PROTOCOL, str(exc))
        if len(self._peers) >= self.limits.max_peers:
            self.stats["rejected_limit"] += 1
            return self._reject(rid, RejectCode.LIMIT, f"server has {self.limits.max_peers} peers")
        nonce_s = new_nonce()
        self._pending[rid] = (nonce_c, nonce_s, body, link)
        self._pending.move_to_end(rid)
        while len(self._pending) > self.limits.max_pending_handshakes:
            self._pending.popitem(last=False)
        reply = {
            "nonce": nonce_s,
            "proof": server_proof(self._token, nonce_c, nonce_s),
            "name": self.name,
            "host": self._host,
            "limits": self.limits.advertised(),
            "v": PROTOCOL,
        }
        self._send(rid, envelope(Kind.CHALLENGE, 0, [msgpack.packb(reply)]))

    def _on_auth(self, rid: bytes, frames: Frames, link: object) -> bool:
        """Check an AUTH that came on connection ``link``; whether the peer is now
        authenticated (bound to ``link``: its messages count only when they come on it)."""
        pending = self._pending.pop(rid, None)
        if pending is not None and pending[3] is not link:  # another connection's HELLO
            pending = None
        if pending is None:
            self._drop("handshake", "AUTH without a HELLO", rid)
            self._reject(rid, RejectCode.NEED_HANDSHAKE, "AUTH without HELLO")
            return False
        nonce_c, nonce_s, hello, _ = pending
        try:
            body = self._handshake_body(frames)
            ok = proofs_match(client_proof(self._token, nonce_s, nonce_c), body.get("proof"))
        except Exception:
            ok = False
        if not ok:
            self.stats["auth_failures"] += 1
            self._ratelog.warning(
                "auth", "%s: rejected peer %r: wrong cluster token", self.name, hello.get("name")
            )
            self._reject(rid, RejectCode.AUTH, "authentication failed")
            return False
        host = str(hello.get("host", ""))
        self._peers[rid] = Peer(
            routing_id=rid,
            name=str(hello.get("name", "?"))[:200],
            host=host,
            same_host=host == self._host,
            last_seen=time.monotonic(),
            bounds=peer_bounds(self.limits, hello.get("limits")),
            link=link,
            trace_key=session_key(nonce_c),
        )
        if isinstance(link, Link):
            link.rid = rid
        self.stats["peers_accepted"] += 1
        self._send(rid, envelope(Kind.WELCOME, 0, [msgpack.packb({})]))
        return True

    def _on_gate_drop(self, reason: str, rid: bytes | None) -> None:
        """A connection left without authenticating: forget its half-open handshake."""
        if rid is not None:
            self._pending.pop(rid, None)
        if reason == "disconnected":  # the peer went away by itself
            return
        self.stats[reason] += 1
        self._ratelog.warning(
            reason, "%s: dropped an unauthenticated connection %r (%s)", self.name, rid, reason
        )


__all__ = ["AuthError", "Peer", "Request", "Server"]
