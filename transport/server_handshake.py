"""A server's side of the HELLO/CHALLENGE/AUTH/WELCOME handshake (see ``transport.protocol``).

Messages of peers that have not authenticated come here: a HELLO is answered with a challenge
that proves our knowledge of the cluster token, an AUTH whose proof checks makes the peer a
:class:`~rayless.transport.peer.Peer`; anything else gets a rejection or is dropped and counted.
``transport.gate`` bounds what an unauthenticated connection may send and for how long. Part of
:class:`~rayless.transport.server.Server` (a mixin; the server holds the state it declares).
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any

import msgpack

from rayless.transport.errors import ProtocolError
from rayless.transport.gate import Gate, Link
from rayless.transport.peer import Peer
from rayless.transport.protocol import (
    HANDSHAKE_MAX,
    PROTOCOL,
    Kind,
    Limits,
    RejectCode,
    check_version,
    client_proof,
    envelope,
    frames_nbytes,
    new_nonce,
    open_envelope,
    peer_bounds,
    proofs_match,
    server_proof,
)
from rayless.transport.pump import Frames
from rayless.transport.ratelog import RateLimitedLog


class ServerHandshake:
    """The server's handling of strangers: HELLO, AUTH, and what comes before them."""

    # the server's state that the handshake uses (set by ``Server.__init__``)
    name: str
    limits: Limits
    stats: collections.Counter[str]
    _token: bytes
    _host: str
    _peers: dict[bytes, Peer]
    _pending: collections.OrderedDict[bytes, tuple[bytes, bytes, dict[str, Any], object]]
    _gate: Gate | None
    _ratelog: RateLimitedLog

    if TYPE_CHECKING:  # the server's sending and drop counting (``transport.server``)

        def _send(self, rid: bytes, frames: list[Any]) -> None: ...

        def _reject(self, rid: bytes, code: RejectCode, reason: str, req_id: int = 0) -> None: ...

        def _drop(self, category: str, detail: str, rid: bytes | None = None) -> None: ...

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


__all__ = ["ServerHandshake"]
