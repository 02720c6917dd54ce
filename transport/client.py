"""The DEALER side: a client that authenticates to one server and makes requests to it.

Many requests may be in flight on one :class:`Client`; replies are matched by request id.
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
the session's lifecycle, the routing of received messages and heartbeats. Its parts:
``transport.client_requests`` (requests, their timeouts and cancellation) and
``transport.client_handshake`` (the client's side of the handshake, the session's states).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Literal

import msgpack
import zmq

from rayless.transport import codec, stream
from rayless.transport.client_handshake import _BROKEN, _CLOSED, _NEW, _READY, ClientHandshake
from rayless.transport.client_requests import ClientRequests
from rayless.transport.errors import (
    BrokenError,
    ClosedError,
    ProtocolError,
    RaylessError,
    Timeout,
)
from rayless.transport.protocol import (
    Kind,
    Limits,
    RejectCode,
    as_token,
    curve_enabled,
    curve_server_keys,
    envelope,
    open_envelope,
)
from rayless.transport.pump import Frames, SocketPump
from rayless.transport.stream_pump import StreamPump

log = logging.getLogger("rayless.transport")

Broke = Literal["forgotten", "lost", "silent", "rejected"]


class Client(ClientRequests, ClientHandshake):
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
        allow_pickle: bool = False,
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
        self._allow_pickle = allow_pickle
        self._ctx = context or zmq.Context.instance()
        self._state = _NEW
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], asyncio.TimerHandle | None]] = {}
        self._pump: SocketPump | StreamPump | None = None
        self.via_unix = False  # the session runs over the same-host UNIX path
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
        return self._state == _CLOSED

    @property
    def ready(self) -> bool:
        """Whether the session is authenticated and unbroken."""
        return self._state == _READY

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
        """Requests waiting for a reply."""
        return len(self._pending)

    def _open_socket(self, same_host: bool = True) -> None:
        name = None if self._curve or not same_host else stream.local_name(self.address)
        if name is not None:  # a server on this host: its UNIX path, if it listens
            try:
                unix = stream.connect(name)
            except OSError:
                pass
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
        if self._state == _CLOSED:
            raise ClosedError(f"client {self.name} is closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._state == _READY:
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
                if self._pump is not None:
                    self._pump.close()
                self._open_socket(same_host=False)
                await self._do_handshake(limit)
        return self

    def _unix_refused(self) -> bool:
        """Whether a handshake that broke on the UNIX path was refused by a server that still
        listens (closed before its CHALLENGE: full), rather than lost to a server going away."""
        name = stream.local_name(self.address)
        if not self.via_unix or self.hello_answered or name is None:
            return False
        try:
            stream.connect(name).close()
        except OSError:  # nothing listens: the server is gone, ZeroMQ would only time out
            return False
        return True

    def _on_stream_lost(self, reason: str) -> None:
        """The UNIX connection ended (the server exited, kill -9 included): fail what waits
        now; the next request reconnects (UNIX path or ZeroMQ). With an infinite
        ``heartbeat_timeout`` (the owner learns of the peer's death another way) the session
        stays as it is, as on ZeroMQ: the owner fails what waits (``fail_pending``)."""
        if self._state == _CLOSED:
            return
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(BrokenError(f"{self.address}: {reason}"))
        elif self._state == _READY and math.isinf(self._hb_timeout):
            return
        self._pump = None
        self._break(f"connection lost: {reason}", "lost")

    async def aclose(self) -> None:
        """Fail pending requests with ClosedError and close the socket. Idempotent."""
        if self._state == _CLOSED:
            return
        was_ready = self._state == _READY
        self._state = _CLOSED
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
        if self._state != _READY:
            return
        self._state = _BROKEN
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
                fut.set_exception(ProtocolError(f"undecodable reply: {exc}"))
                return
            if kind is Kind.ERROR:
                if not isinstance(value, BaseException):
                    value = ProtocolError(f"error reply that is not an error: {value!r:.200}")
                elif self._error_hook is not None:
                    value = self._error_hook(value)
                fut.set_exception(value)
            else:
                fut.set_result(value)
        elif kind is Kind.PONG:
            pass
        elif kind is Kind.ONEWAY:
            if self._on_oneway is not None:
                body = codec.decode(payload, device=self._device, allow_pickle=self._allow_pickle)
                self._on_oneway(body)
        elif kind in (Kind.CHALLENGE, Kind.WELCOME) or (kind is Kind.REJECT and req_id == 0):
            body = msgpack.unpackb(bytes(payload[0]), raw=False) if payload else {}
            if kind is Kind.REJECT and self._state == _READY:
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
        if self._state == _CLOSED:
            return
        now = time.monotonic()
        late = now - self._beat_due
        if late > self._hb_interval:  # our own loop was blocked: we could not have heard
            self._last_recv = max(self._last_recv, now - self._hb_interval)
        if self._state == _READY and self._pump is not None:
            if now - self._last_recv > self._hb_timeout:
                self._break(f"no heartbeat for {now - self._last_recv:.1f}s", "silent")
            elif now - self._last_send >= self._hb_interval or self._pending:
                try:
                    self._pump.send(envelope(Kind.PING, 0))
                    self._last_send = now
                except RaylessError:
                    pass
        self._schedule_heartbeat()


__all__ = ["Client"]
