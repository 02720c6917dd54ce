"""A client's side of the HELLO/CHALLENGE/AUTH/WELCOME handshake, and the session's states.

:meth:`~rayless.transport.client.Client.connect` runs it: send HELLO (our protocol version,
nonce and limits), check the server's proof and version in its CHALLENGE, answer with our
proof (AUTH), and take the server's advertised bounds from the WELCOME. A rejection becomes the
error it stands for (AuthError, LimitError, ProtocolError). Part of
:class:`~rayless.transport.client.Client` (a mixin; the client holds the state it declares).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack

from rayless.transport.errors import (
    AuthError,
    BrokenError,
    ClosedError,
    LimitError,
    ProtocolError,
    RaylessError,
    Timeout,
)
from rayless.transport.protocol import (
    PROTOCOL,
    Kind,
    Limits,
    RejectCode,
    check_version,
    client_proof,
    envelope,
    host_id,
    new_nonce,
    peer_bounds,
    proofs_match,
    server_proof,
)
from rayless.transport.pump import SocketPump
from rayless.transport.stream_pump import StreamPump

# a client's session: not yet handshaken, authenticated, broken (the next request handshakes
# again), closed for good
_NEW, _READY, _BROKEN, _CLOSED = "new", "ready", "broken", "closed"


class ClientHandshake:
    """The client's handshake with its server (see ``transport.protocol``)."""

    # the client's state that the handshake uses (set by ``Client.__init__``)
    address: str
    name: str
    limits: Limits
    peer_name: str
    peer_host: str
    same_host: bool
    _token: bytes
    _state: str
    _bounds: tuple[int, int, int]
    _pump: SocketPump | StreamPump | None
    _handshake: asyncio.Future[tuple[Kind, dict[str, Any]]] | None
    _last_recv: float
    hello_answered: bool  # whether the last handshake got past HELLO

    async def _do_handshake(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        nonce_c = new_nonce()
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
        if self._pump is not None:  # a coalesced batch must stay under the server's bound
            self._pump.batch_limit = min(self._pump.batch_limit, self._bounds[0])
        self.peer_name = str(body.get("name", ""))
        self.peer_host = str(body.get("host", ""))
        self.same_host = self.peer_host == host_id()
        self._last_recv = time.monotonic()
        self._state = _READY

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
            if self._state == _CLOSED:
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


__all__ = ["ClientHandshake"]
