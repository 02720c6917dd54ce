"""The DEALER side: a client that authenticates to one server and makes requests to it.

Many requests may be in flight on one :class:`Client`; replies are matched by request id.
At most half of the server's in-flight bound (``Limits.max_inflight_per_peer``, which it
advertises in the handshake) is sent at once: the others wait in the client, in order, and go
out as replies come back, so a caller may submit any number of requests at once (the server
never refuses one for being past its bound, and a cancelled request that still runs there
leaves room).
Each request can have its own timeout; heartbeats detect a server that stopped answering;
closing the client fails every pending request with ClosedError (as pyzmq's socket close
cancels pending futures). A request that times out, or whose caller is cancelled, is
cancelled at the server too (a CANCEL message). A broken session (the server restarted or
forgot us) fails the requests in flight with BrokenError, and the next request performs a
fresh handshake. ``Client.broke`` says why the last session broke: ``"forgotten"`` (the
server, alive, said it no longer knows the session: it expired us while our loop was blocked;
the requests that break failed never ran there, so the owner may send them again), ``"lost"``
(the connection ended), ``"silent"`` (no heartbeat within the timeout) or ``"rejected"``.

This module holds the socket (ZeroMQ, or the same-host UNIX path of ``transport.stream``),
the session's lifecycle and states, the client's side of the handshake, requests (their
timeouts and cancellation), the routing of received messages and heartbeats.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import math
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Literal

import msgpack
import zmq

from rayless.transport import codec, stream
from rayless.transport.errors import (
    AuthError,
    BrokenError,
    ClosedError,
    LimitError,
    ProtocolError,
    RaylessError,
    Timeout,
    describe,
)
from rayless.transport.protocol import (
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
    host_id,
    inflight_window,
    new_nonce,
    open_envelope,
    peer_bounds,
    pickle_allowed,
    proofs_match,
    server_proof,
    session_key,
)
from rayless.transport.pump import Frames, SocketPump
from rayless.transport.stream_pump import StreamPump
from rayless.transport.zmq_context import zmq_context

log = logging.getLogger("rayless.transport")

# What a client with a ``trace`` ring appends as each request ends (see ``Client.trace``).
ENDED = "\x00ended"
_WHY_CHARS = 300

Broke = Literal["forgotten", "lost", "silent", "rejected"]


class SessionState(Enum):
    """A client's session: not yet handshaken, authenticated, broken (the next request
    handshakes again), closed for good."""

    NEW = "new"
    READY = "ready"
    BROKEN = "broken"
    CLOSED = "closed"


# seconds after a UNIX connection's EOF at which a server that still listens is checked again
# (a dying process closes its connections and its listener in no set order)
_RECHECK = (0.25, 1.0)


class Client:
    """A DEALER endpoint with an authenticated session to one server. Use ``async with``.

    Args:
        address: the server's ``tcp://`` or ``ipc://`` address.
        token: the cluster token.
        name: how the server's logs name us.
        heartbeat_interval: ping the server when nothing was sent for this long.
        heartbeat_timeout: with nothing heard from the server for this long, the session is
            broken and pending requests fail with BrokenError.
        connect_timeout: how long the handshake may take.
        on_oneway: called with the body of each one-way message the server pushes.
        device: where decoded CUDA tensors land (see ``codec.decode``).
        error_hook: maps each error a server replies with before it is raised (the actor
            runtime turns RemoteError into an instance of the original type too).
        limits: our bounds (default: ``Limits.from_env()``); a message past our own or the
            server's advertised message, frame or header bounds raises LimitError unsent.
        curve: encrypt with ZeroMQ CURVE (default: ``RAYLESS_CURVE``); the server must too.
        on_broken: called once with the reason when the session breaks (not on ``aclose``).

    Heartbeats never count time during which this process's own event loop was blocked (a
    long synchronous step in the caller): a peer gets a fresh ``heartbeat_timeout`` after
    the loop comes back. ``heartbeat_timeout=math.inf`` keeps pinging but never breaks (for
    peers whose liveness is learnt another way, e.g. actors, whose deaths the head reports).
    """

    def __init__(
        self,
        address: str,
        *,
        token: bytes | str,
        name: str = "client",
        limits: Limits | None = None,
        heartbeat_interval: float = 1.0,
        heartbeat_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        on_oneway: Callable[[Any], None] | None = None,
        device: Any = None,
        allow_pickle: bool | None = None,
        context: zmq.Context[Any] | None = None,
        error_hook: Callable[[BaseException], BaseException] | None = None,
        curve: bool | None = None,
        on_broken: Callable[[str], None] | None = None,
    ) -> None:
        if heartbeat_timeout <= heartbeat_interval:
            raise ValueError("heartbeat_timeout must exceed heartbeat_interval")
        self.address = address
        self.name = name
        self.limits = limits or Limits.from_env()
        self._token = as_token(token)
        self._curve = curve_enabled(curve)
        # (message bytes, frames, header bytes): ours, lowered to what the server advertises
        self._bounds = self._merge_bounds({})
        self._hb_interval = heartbeat_interval
        self._hb_timeout = heartbeat_timeout
        self._connect_timeout = connect_timeout
        self._on_oneway = on_oneway
        self._on_broken = on_broken
        self._beat_due = 0.0
        self._error_hook = error_hook
        self._device = device
        self._allow_pickle = pickle_allowed(allow_pickle)  # None: RAYLESS_ALLOW_PICKLE
        self._ctx = context or zmq_context()
        self._state = SessionState.NEW
        self._ids = itertools.count(1)
        self.last_request_id = 0  # the id of the request sent last (a tracer pairs its end)
        # a ring (a bounded deque) that gets ``(ENDED, trace_key, request id, time_ns, error
        # or None)`` as each request ends: replied (the time its batch arrived), failed with
        # the session, cancelled or timed out; None: nothing is recorded
        self.trace: collections.deque[tuple[Any, ...]] | None = None
        self.trace_key = 0  # the session's ``protocol.session_key`` (the server's Peer has it)
        self._batch_ns = 0
        self._pending: dict[int, tuple[asyncio.Future[Any], asyncio.TimerHandle | None]] = {}
        # the in-flight window (module docstring): requests sent and not yet answered or
        # cancelled, at most ``_window``; the ones past it wait in ``_held``, in order
        self._window = inflight_window(self.limits, {})
        self._sent = 0
        self._held: collections.deque[tuple[int, list[Any]]] = collections.deque()
        self._held_ids: set[int] = set()
        self._pump: SocketPump | StreamPump | None = None
        self.via_unix = False  # the session runs over the same-host UNIX path
        self.unix_fallback: str | None = None  # why a same-host session went to ZeroMQ
        self.hello_answered = False
        self._handshake: asyncio.Future[tuple[Kind, dict[str, Any]]] | None = None
        self._connecting: asyncio.Lock | None = None
        self._heartbeat: asyncio.TimerHandle | None = None
        self._last_recv = self._last_send = time.monotonic()
        self.peer_name = ""
        self.peer_host = ""
        self.same_host = False
        self._broken_reason = ""
        self.broke: Broke | None = None  # why the session last broke (module docstring)

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._state is SessionState.CLOSED

    @property
    def ready(self) -> bool:
        """Whether the session is authenticated and unbroken."""
        return self._state is SessionState.READY

    @property
    def queued(self) -> int:
        """Messages waiting for room in the socket (the server is not reading fast enough)."""
        return 0 if self._pump is None else self._pump.queued

    async def wait_room(self, timeout: float | None = None) -> None:
        """Wait until the send queue is below ``limits.send_queue`` (backpressure).

        ``request`` does this itself; callers pipelining with ``submit`` call it in between.

        Raises:
            Timeout: the server did not drain the queue within ``timeout`` seconds.
        """
        if self._pump is None or self._pump.queued < self.limits.send_queue:
            return
        try:
            await self._pump.wait_room(timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"{self.address} did not take messages for {timeout}s") from None

    @property
    def pending(self) -> int:
        """Requests waiting for a reply (sent, or held back by the in-flight window)."""
        return len(self._pending)

    @property
    def held(self) -> int:
        """Requests held back by the in-flight window (not sent yet)."""
        return len(self._held_ids)

    def _open_socket(self, same_host: bool = True) -> None:
        name = None if self._curve or not same_host else stream.local_name(self.address)
        if name is not None:  # a server on this host: its UNIX path, if it listens
            try:
                unix = stream.connect(name)
            except OSError as exc:
                self.unix_fallback = f"connect: {exc}"
            else:
                self._pump = StreamPump(
                    unix,
                    self._on_batch,
                    queue_limit=self.limits.send_queue,
                    max_message=self.limits.max_message_bytes,
                    on_lost=self._on_stream_lost,
                )
                self.via_unix = True
                return
        self.via_unix = False
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, self.limits.hwm)
            sock.setsockopt(zmq.RCVHWM, self.limits.hwm)
            sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
            if self._curve:
                sock.curve_serverkey = curve_server_keys(self._token)[0]
                sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
            sock.connect(self.address)
        except BaseException:
            sock.close(linger=0)
            raise
        self._pump = SocketPump(sock, self._on_batch, head=1, queue_limit=self.limits.send_queue)

    async def connect(self, timeout: float | None = None) -> Client:
        """Open the socket (once) and perform the handshake if the session is not ready,
        within ``timeout`` seconds (default ``connect_timeout``).

        Raises:
            ClosedError: the client was closed.
            AuthError: the server rejected our token, or could not prove it knows it.
            Timeout: no handshake within ``connect_timeout``.
        """
        if self._state is SessionState.CLOSED:
            raise ClosedError(f"client {self.name} is closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._state is SessionState.READY:
                return self
            if self._pump is None:
                self._open_socket()
                if self._heartbeat is None:
                    self._schedule_heartbeat()
            limit = self._connect_timeout if timeout is None else timeout
            try:
                await self._do_handshake(limit)
            except BrokenError:
                if not self._unix_refused():
                    raise
                # the same-host path is full (its server closed us before a word): ZeroMQ
                log.info("%s: the UNIX path to %s is full; using ZeroMQ", self.name, self.address)
                self.unix_fallback = "closed by the server before its challenge (full)"
                if self._pump is not None:
                    self._pump.close()
                self._open_socket(same_host=False)
                await self._do_handshake(limit)
        return self

    def _unix_refused(self) -> bool:
        """Whether a handshake that broke on the UNIX path was refused by a server that still
        listens (closed before its CHALLENGE: full), rather than lost to a server going away."""
        if not self.via_unix or self.hello_answered:
            return False
        return self._still_listens()  # nothing listens: gone, ZeroMQ would only time out

    def _on_stream_lost(self, reason: str) -> None:
        """The UNIX connection ended: fail what waits now; the next request reconnects (UNIX
        path or ZeroMQ).

        With an infinite ``heartbeat_timeout`` the owner learns of the peer's death another
        way and fails what waits with the death's cause (``fail_pending``), so the session
        stays as it is, as on ZeroMQ — but only while the peer looks dead: a failure of ours
        (a send the kernel refused, a frame that does not parse) breaks it at once, and so
        does a server that still listens a moment after closing us (its process is alive:
        no death will come to end the calls).
        """
        if self._state is SessionState.CLOSED:
            return
        pump = self._pump
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(BrokenError(f"{self.address}: {reason}"))
        elif (
            self._state is SessionState.READY
            and math.isinf(self._hb_timeout)
            and isinstance(pump, StreamPump)
            and pump.peer_gone
        ):
            asyncio.get_running_loop().call_later(
                _RECHECK[0], self._recheck_listener, pump, reason, 1
            )
            return
        self._pump = None
        self._break(f"connection lost: {reason}", "lost")

    def _recheck_listener(self, pump: StreamPump, reason: str, attempt: int) -> None:
        ready = self._state is SessionState.READY
        if not ready or self._pump is not pump or not self._still_listens():
            return  # handled meanwhile, or the server is gone: its owner fails what waits
        if attempt < len(_RECHECK):
            asyncio.get_running_loop().call_later(
                _RECHECK[attempt], self._recheck_listener, pump, reason, attempt + 1
            )
            return
        self._pump = None
        self._break(f"connection lost: {reason} (the server still listens)", "lost")

    def _still_listens(self) -> bool:
        """Whether the server's UNIX path still takes connections (its process is alive)."""
        name = stream.local_name(self.address)
        if name is None:
            return False
        try:
            stream.connect(name).close()
        except OSError:
            return False
        return True

    async def aclose(self) -> None:
        """Fail pending requests with ClosedError and close the socket. Idempotent."""
        if self._state is SessionState.CLOSED:
            return
        was_ready = self._state is SessionState.READY
        self._state = SessionState.CLOSED
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._fail_all(ClosedError(f"client {self.name} was closed"))
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(ClosedError(f"client {self.name} was closed"))
        pump = self._pump
        if pump is not None:
            if was_ready and isinstance(pump, StreamPump):
                try:
                    pump.send(envelope(Kind.BYE, 0))
                except ClosedError:
                    pass
            elif was_ready:
                try:
                    pump.sock.send(envelope(Kind.BYE, 0)[0], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass
            pump.close()

    def _break(self, reason: str, why: Broke) -> None:
        if self._state is not SessionState.READY:
            return
        self._state = SessionState.BROKEN
        self._broken_reason = reason
        self.broke = why
        self._fail_all(
            BrokenError(f"session with {self.peer_name or self.address} broke: {reason}")
        )
        if self._on_broken is not None:
            try:
                self._on_broken(reason)
            except Exception:
                log.exception("%s: on_broken hook failed", self.name)

    # -- receiving ---------------------------------------------------------------------

    def _on_batch(self, batch: list[Frames]) -> None:
        self._last_recv = time.monotonic()
        if self.trace is not None:
            self._batch_ns = time.time_ns()
        for msg in batch:
            try:
                self._on_message(msg)
            except Exception as exc:
                log.warning("%s: dropped a bad message from %s: %s", self.name, self.address, exc)

    def _on_message(self, msg: Frames) -> None:
        kind, req_id, payload = open_envelope(msg, 0)
        if kind is Kind.REPLY or kind is Kind.ERROR:
            entry = self._pending.pop(req_id, None)
            if entry is None:
                return  # a late reply to a request that timed out or was cancelled
            self._answered()
            fut, timer = entry
            if timer is not None:
                timer.cancel()
            if fut.done():
                return
            try:
                value = codec.decode(
                    payload,
                    device=self._device,
                    allow_pickle=self._allow_pickle,
                    max_header=self.limits.max_header_bytes,
                )
            except Exception as exc:
                value = ProtocolError(f"undecodable reply: {exc}")
                fut.set_exception(value)
                self._ended(req_id, value)
                return
            if kind is Kind.ERROR:
                if not isinstance(value, BaseException):
                    value = ProtocolError(f"error reply that is not an error: {value!r:.200}")
                elif self._error_hook is not None:
                    try:
                        value = self._error_hook(value)
                    except Exception as exc:  # the error as it came: never a call left waiting
                        log.warning("%s: error hook failed on %r: %r", self.name, value, exc)
                fut.set_exception(value)
                self._ended(req_id, value)
            else:
                fut.set_result(value)
                if self.trace is not None:
                    self.trace.append((ENDED, self.trace_key, req_id, self._batch_ns, None))
        elif kind is Kind.PONG:
            pass
        elif kind is Kind.ONEWAY:
            if self._on_oneway is not None:
                body = codec.decode(payload, device=self._device, allow_pickle=self._allow_pickle)
                self._on_oneway(body)
        elif kind in (Kind.CHALLENGE, Kind.WELCOME) or (kind is Kind.REJECT and req_id == 0):
            body = msgpack.unpackb(bytes(payload[0]), raw=False) if payload else {}
            if kind is Kind.REJECT and self._state is SessionState.READY:
                forgotten = body.get("code") == RejectCode.NEED_HANDSHAKE
                reason = str(body.get("reason", "rejected"))
                self._break(reason, "forgotten" if forgotten else "rejected")
            elif self._handshake is not None and not self._handshake.done():
                self._handshake.set_result((kind, body if isinstance(body, dict) else {}))
        elif kind is Kind.REJECT:  # a request the server no longer has a session for
            self._break("the server forgot the session (restarted or expired)", "forgotten")
        else:
            raise ProtocolError(f"unexpected {kind.name}")

    # -- heartbeats --------------------------------------------------------------------

    def set_heartbeat(self, interval: float, timeout: float) -> None:
        """Change the heartbeat interval and timeout (e.g. to what the server announced).

        Raises:
            ValueError: ``timeout`` does not exceed ``interval``.
        """
        if timeout <= interval:
            raise ValueError("heartbeat_timeout must exceed heartbeat_interval")
        self._hb_interval, self._hb_timeout = interval, timeout

    def _schedule_heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        self._beat_due = time.monotonic() + self._hb_interval / 2
        self._heartbeat = loop.call_later(self._hb_interval / 2, self._beat)

    def _beat(self) -> None:
        if self._state is SessionState.CLOSED:
            return
        now = time.monotonic()
        late = now - self._beat_due
        if late > self._hb_interval:  # our own loop was blocked: we could not have heard
            self._last_recv = max(self._last_recv, now - self._hb_interval)
        if self._state is SessionState.READY and self._pump is not None:
            if now - self._last_recv > self._hb_timeout:
                self._break(f"no heartbeat for {now - self._last_recv:.1f}s", "silent")
            elif now - self._last_send >= self._hb_interval or self._pending:
                try:
                    self._pump.send(envelope(Kind.PING, 0))
                    self._last_send = now
                except RaylessError:
                    pass
        self._schedule_heartbeat()

    # -- requests --------------------------------------------------------------------------

    async def request(
        self,
        body: Any,
        *,
        timeout: float | None = None,
        sent: Callable[[int], None] | None = None,
    ) -> Any:
        """Send ``body`` and wait for the reply; ``sent(request id)`` is called once it is
        sent (a tracer's record).

        Raises:
            Timeout: no reply within ``timeout`` seconds.
            ClosedError / BrokenError: the client closed, or the session broke.
            TypeError: ``body`` cannot be encoded.
            RaylessError or RemoteError: whatever the server's handler raised.
        """
        if self._state is not SessionState.READY:
            await self.connect()
        elif self._pump is not None and self._pump.queued >= self.limits.send_queue:
            await self.wait_room(timeout)
        req_id, fut = self._send_request(body, timeout)
        if sent is not None:
            sent(req_id)
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
        if self._state is not SessionState.READY:
            if self._state is SessionState.CLOSED:
                raise ClosedError(f"client {self.name} is closed")
            raise BrokenError(f"no session with {self.address}: {self._broken_reason or 'new'}")
        req_id, fut = self._send_request(body, timeout)
        fut.add_done_callback(lambda f: self._abandon(req_id) if f.cancelled() else None)
        return fut

    def submit_nowait(self, body: Any, timeout: float | None = None) -> asyncio.Future[Any] | None:
        """The fastest submit: a future of the reply, or None when the session is not ready
        or the send queue is backed up (then use :meth:`request`). An encoding error comes
        back inside the future. Cancelling the future cancels the request at the server."""
        if self._state is not SessionState.READY or (self._pump is not None and self._pump.queued):
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
        req_id = self.last_request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, self._expire, req_id, timeout)
        self._pending[req_id] = (fut, timer)
        assert self._pump is not None  # internal invariant: READY implies an open socket
        message = envelope(Kind.REQUEST, req_id, frames)
        if self._sent >= self._window or self._held:
            self._held.append((req_id, message))
            self._held_ids.add(req_id)
            return req_id, fut
        self._sent += 1
        self._pump.send(message)
        self._last_send = time.monotonic()
        return req_id, fut

    def _answered(self) -> None:
        """A sent request is answered or cancelled: its room in the window goes to the
        requests held back, in order."""
        self._sent -= 1
        held = self._held
        while held and self._sent < self._window:
            req_id, message = held.popleft()
            if req_id not in self._held_ids:
                continue  # cancelled or timed out while held: never sent
            self._held_ids.discard(req_id)
            if self._pump is None or self._state is not SessionState.READY:
                return
            self._sent += 1
            self._pump.send(message)
            self._last_send = time.monotonic()

    def send_oneway(self, body: Any) -> None:
        """Send a one-way message (no reply).

        Raises:
            ClosedError / BrokenError: the client is closed, or its session is not ready.
            TypeError: ``body`` cannot be encoded.
        """
        if self._state is not SessionState.READY or self._pump is None:
            raise (ClosedError if self._state is SessionState.CLOSED else BrokenError)(
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

    def _ended(self, req_id: int, why: BaseException | str) -> None:
        """Record, in the ``trace`` ring if there is one, that a request ended without a
        result (``why``: its error, or what became of it)."""
        if self.trace is not None:
            if isinstance(why, BaseException):
                why = describe(why, _WHY_CHARS)
            self.trace.append((ENDED, self.trace_key, req_id, time.time_ns(), why))

    def _abandon(self, req_id: int, why: str = "cancelled") -> None:
        """Forget a request the caller gave up on and tell the server to cancel it (CANCEL)."""
        entry = self._pending.pop(req_id, None)
        if entry is None:
            return  # answered already, or failed with the session
        self._ended(req_id, why)
        if entry[1] is not None:
            entry[1].cancel()
        if req_id in self._held_ids:  # never sent: nothing to cancel at the server
            self._held_ids.discard(req_id)
            return
        if self._state is SessionState.READY and self._pump is not None:
            try:
                self._pump.send(envelope(Kind.CANCEL, req_id))
            except (RaylessError, zmq.ZMQError):  # closing: nothing to cancel any more
                pass
        self._answered()

    def _expire(self, req_id: int, timeout: float) -> None:
        entry = self._pending.get(req_id)
        error = Timeout(f"no reply from {self.peer_name or self.address} within {timeout:g}s")
        if entry is not None and not entry[0].done():
            entry[0].set_exception(error)
        self._abandon(req_id, f"Timeout: {error}")

    def fail_pending(self, exc: RaylessError) -> None:
        """Fail every request waiting for a reply with ``exc`` (a higher layer knows why).

        Used by the actor runtime when the head reports that the peer's process died, which
        it learns long before a heartbeat could time out.
        """
        self._fail_all(exc)

    def _fail_all(self, exc: RaylessError) -> None:
        pending, self._pending = self._pending, {}
        self._sent = 0
        self._held.clear()
        self._held_ids.clear()
        for req_id, (fut, timer) in pending.items():
            if timer is not None:
                timer.cancel()
            if not fut.done():
                fut.set_exception(exc)
            self._ended(req_id, exc)

    # -- handshake (see ``transport.protocol``) --------------------------------------------

    async def _do_handshake(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        nonce_c = new_nonce()
        self.trace_key = session_key(nonce_c)
        hello = {
            "v": PROTOCOL,  # a server of another revision refuses us with a clear error
            "nonce": nonce_c,
            "name": self.name,
            "host": host_id(),
            "limits": self.limits.advertised(),  # the server checks its replies against them
        }
        deadline = time.monotonic() + timeout
        self.hello_answered = False
        kind, body = await self._exchange(loop, Kind.HELLO, hello, deadline, timeout)
        self.hello_answered = True  # the server is there and talks to us
        if kind is not Kind.CHALLENGE:
            raise self._rejection(body)
        check_version(body.get("v"), f"the server at {self.address}")
        nonce_s = body.get("nonce")
        if not isinstance(nonce_s, bytes):
            raise ProtocolError(f"server at {self.address} sent a malformed CHALLENGE")
        server_ok = proofs_match(server_proof(self._token, nonce_c, nonce_s), body.get("proof"))
        # Answer even when the server's proof failed, so that the server (ours, with another
        # token) can count and log the failed attempt; our proof reveals nothing of the token.
        proof = client_proof(self._token, nonce_s, nonce_c)
        kind, welcome = await self._exchange(loop, Kind.AUTH, {"proof": proof}, deadline, timeout)
        if not server_ok:
            raise AuthError(f"server at {self.address} could not prove it knows the token")
        if kind is not Kind.WELCOME:
            raise self._rejection(welcome)
        limits = body.get("limits")
        self._bounds = self._merge_bounds(limits if isinstance(limits, dict) else {})
        self._window = inflight_window(self.limits, limits)
        if self._pump is not None:  # a coalesced batch must stay under the server's bound
            self._pump.batch_limit = min(self._pump.batch_limit, self._bounds[0])
        self.peer_name = str(body.get("name", ""))
        self.peer_host = str(body.get("host", ""))
        self.same_host = self.peer_host == host_id()
        self._last_recv = time.monotonic()
        self._state = SessionState.READY

    def _merge_bounds(self, advertised: dict[str, Any]) -> tuple[int, int, int]:
        return peer_bounds(self.limits, advertised)

    async def _exchange(
        self,
        loop: asyncio.AbstractEventLoop,
        kind: Kind,
        body: dict[str, Any],
        deadline: float,
        timeout: float,
    ) -> tuple[Kind, dict[str, Any]]:
        if self._pump is None:  # the stream ended between two steps (the peer went away)
            if self._state is SessionState.CLOSED:
                raise ClosedError(f"client {self.name} was closed during the handshake")
            raise BrokenError(f"{self.address}: the connection was lost during the handshake")
        self._handshake = loop.create_future()
        self._pump.send(envelope(kind, 0, [msgpack.packb(body)]))
        try:
            return await asyncio.wait_for(self._handshake, max(0.0, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise Timeout(f"no handshake with {self.address} within {timeout:.1f}s") from None
        finally:
            self._handshake = None

    def _rejection(self, body: dict[str, Any]) -> RaylessError:
        code, reason = body.get("code"), body.get("reason", "rejected")
        if code == RejectCode.LIMIT:
            return LimitError(f"{self.address} refused the connection: {reason}")
        if code == RejectCode.PROTOCOL:
            return ProtocolError(f"{self.address} refused the handshake: {reason}")
        return AuthError(f"{self.address} rejected us: {reason} (wrong cluster token?)")


__all__ = ["Client"]
