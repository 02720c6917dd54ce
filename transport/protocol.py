"""The wire protocol: control frames, message kinds, the HMAC handshake and configurable limits.

Every message is ``[control, *payload]`` (a ROUTER adds the peer's routing id in front). The
control block is 12 bytes, ``<BBHQ``: protocol version, kind, flags, request id. The payload is
the codec's frames (a msgpack header and out-of-band buffers) or, for handshake messages, one
msgpack map. With flag ``INLINE`` the first payload frame (a header under 64 KiB) follows the
control block in the same ZeroMQ frame, which saves a frame per message on the hot path. See
docs/protocol.md.

Handshake (mutual, the token never travels)::

    client → HELLO      {v, nonce_c, name, host}
    server → CHALLENGE  {v, nonce_s, name, host,
                         proof_s = HMAC(token, "rayless-server" | nonce_c | nonce_s)}
    client → AUTH       {proof_c = HMAC(token, "rayless-client" | nonce_s | nonce_c)}
    server → WELCOME    {}            or REJECT {reason, code}

The server's nonce is fresh per handshake and consumed by the first AUTH, so a recorded
handshake cannot be replayed; a client that cannot verify ``proof_s`` aborts with AuthError.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from typing import Any

from rayless.transport.errors import LimitError, ProtocolError

VERSION = 1
CONTROL = struct.Struct("<BBHQ")
CONTROL_SIZE = CONTROL.size
NONCE_BYTES = 32
INLINE = 1  # flag: the header follows the control block in frame 0
INLINE_MAX = 65536


class Kind(IntEnum):
    """Message kinds carried in the control frame."""

    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    WELCOME = 4
    REJECT = 5
    REQUEST = 6
    REPLY = 7
    ERROR = 8
    ONEWAY = 9
    PING = 10
    PONG = 11
    BYE = 12
    CANCEL = 13  # client → server: the caller gave up on request ``req_id`` (no reply)


_KIND_OF = {int(k): k for k in Kind}  # Kind(value) is slow: it goes through EnumMeta


class RejectCode(IntEnum):
    """Why a server refused a peer."""

    AUTH = 1
    NEED_HANDSHAKE = 2
    LIMIT = 3
    PROTOCOL = 4


@dataclass(frozen=True)
class Limits:
    """Bounds that keep a server alive under hostile or runaway peers.

    max_message_bytes: total size of one message (all frames); bigger inbound messages are
        dropped (and ZeroMQ disconnects peers whose single frame exceeds it).
    max_frames: frames in one message.
    max_header_bytes: size of the msgpack header frame.
    max_inflight_per_peer: requests a peer may have outstanding at a server; past it the peer
        gets a LimitError reply, and the handler does not run.
    max_peers: authenticated peers a server keeps; past it new handshakes are rejected.
    max_pending_handshakes: half-open handshakes remembered, and connections that have not
        authenticated yet (past it the oldest are forgotten / dropped).
    max_preauth_bytes: bytes a TCP connection may send before it authenticates (ZMTP greeting
        and handshake included); past it the server drops the connection (``transport.gate``).
    handshake_timeout: seconds a connection may stay unauthenticated before it is dropped.
    send_queue: messages a client queues while the socket is full before ``request`` waits.
    hwm: ZeroMQ send/receive high-water marks (messages).
    """

    max_message_bytes: int = 4 * 2**30
    max_frames: int = 65_000  # tens of thousands of tensors; the UNIX path frames <= 65,535
    max_header_bytes: int = 16 * 2**20
    max_inflight_per_peer: int = 16_384
    max_peers: int = 4096
    max_pending_handshakes: int = 1024
    send_queue: int = 4096
    hwm: int = 10_000
    max_preauth_bytes: int = 64 * 2**10
    handshake_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            real = name in _FLOAT_LIMITS
            kinds = (int, float) if real else int
            if not isinstance(value, kinds) or isinstance(value, bool) or not value > 0:
                what = "number" if real else "int"
                raise ValueError(f"Limits.{name} must be a positive {what}, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, overridden by ``RAYLESS_<FIELD>`` variables (``RAYLESS_MAX_PEERS=64``).

        Every server and client that is given no ``limits`` reads them here, so one variable
        set before a cluster starts configures the head, the agents and every actor.

        Raises:
            ValueError: a variable that is not a positive int.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in cls.__dataclass_fields__:
            raw = env.get(f"RAYLESS_{name.upper()}")
            if raw is None or raw == "":
                continue
            kind = float if name in _FLOAT_LIMITS else int
            try:
                values[name] = kind(raw)
            except ValueError:
                raise ValueError(
                    f"RAYLESS_{name.upper()} must be a{'' if kind is float else 'n'} "
                    f"{kind.__name__}, got {raw!r}"
                ) from None
        return cls(**values) if values else _DEFAULT_LIMITS

    def advertised(self) -> dict[str, int]:
        """The bounds an endpoint tells its peer in the handshake (it checks before sending):
        the server in CHALLENGE, the client in HELLO (the server checks replies)."""
        return {
            "max_message_bytes": self.max_message_bytes,
            "max_frames": self.max_frames,
            "max_header_bytes": self.max_header_bytes,
            "max_inflight_per_peer": self.max_inflight_per_peer,
        }


_FLOAT_LIMITS = frozenset({"handshake_timeout"})
_DEFAULT_LIMITS = Limits()
HANDSHAKE_MAX = 4096  # bytes of a HELLO or AUTH body


def peer_bounds(own: Limits, advertised: object) -> tuple[int, int, int]:
    """(message bytes, frames, header bytes) to send to a peer: ``own`` limits, lowered to
    what the peer advertised (ignored unless a map of positive ints)."""
    theirs = advertised if isinstance(advertised, dict) else {}

    def bound(name: str) -> int:
        mine: int = getattr(own, name)
        value = theirs.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(mine, value)
        return mine

    return bound("max_message_bytes"), bound("max_frames"), bound("max_header_bytes")


def inflight_window(own: Limits, advertised: object) -> int:
    """How many requests a client sends before it waits for replies: half the server's
    in-flight bound (its advertised ``max_inflight_per_peer``, else ours), 1 at least. Half,
    so that requests the client cancelled but the server still runs (a ``def`` method runs to
    its end) never take the server past its bound."""
    theirs = advertised if isinstance(advertised, dict) else {}
    bound = theirs.get("max_inflight_per_peer")
    if not (isinstance(bound, int) and not isinstance(bound, bool) and bound > 0):
        bound = own.max_inflight_per_peer
    return max(1, bound // 2)


def check_outgoing(frames: Sequence[Any], bounds: tuple[int, int, int], peer: str) -> None:
    """Raise LimitError for a message (codec frames) that ``peer`` with ``bounds`` refuses.

    Raises:
        LimitError: too many frames, too many bytes, or a header too big.
    """
    max_bytes, max_frames, max_header = bounds
    if len(frames) > max_frames:
        raise LimitError(f"a message of {len(frames)} frames exceeds {max_frames} of {peer}")
    size = frames_nbytes(frames)
    if size > max_bytes:
        raise LimitError(
            f"a message of {size} bytes exceeds the limit of {max_bytes} bytes of "
            f"{peer} (RAYLESS_MAX_MESSAGE_BYTES)"
        )
    if frames:
        header = frames_nbytes(frames[:1])
        if header > max_header:
            raise LimitError(
                f"a message header of {header} bytes exceeds the limit of {max_header} bytes "
                f"of {peer} (RAYLESS_MAX_HEADER_BYTES; big bytes/str values travel in the "
                "header: send them as tensors or numpy arrays)"
            )


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total bytes of a message's frames (bytes, memoryviews, zmq frames, buffers)."""
    total = 0
    for f in frames:
        total += f.nbytes if isinstance(f, memoryview) else len(f)
    return total


def curve_server_keys(token: bytes) -> tuple[bytes, bytes]:
    """The CURVE key pair of every server of the cluster with ``token``: (public, secret).

    Derived from the token, so every process that knows the token can encrypt to any server
    (the HMAC handshake still authenticates both sides). Z85-encoded, as ZeroMQ wants them.

    Raises:
        RuntimeError: this libzmq was built without CURVE.
    """
    import zmq
    from zmq.utils import z85

    if not zmq.has("curve"):
        raise RuntimeError("this libzmq has no CURVE support (built without libsodium)")
    secret = z85.encode(hashlib.sha256(b"rayless-curve" + token).digest())
    return zmq.curve_public(secret), secret


def curve_enabled(curve: bool | None) -> bool:
    """``curve`` if given, else whether ``RAYLESS_CURVE`` is set to 1/true/yes."""
    if curve is not None:
        return curve
    return os.environ.get("RAYLESS_CURVE", "").lower() in ("1", "true", "yes")


ENV_ALLOW_PICKLE = "RAYLESS_ALLOW_PICKLE"


def pickle_allowed(allow: bool | None = None) -> bool:
    """``allow`` if given, else whether ``RAYLESS_ALLOW_PICKLE`` is set to 1/true/yes: the
    cluster-wide opt-in that lets values the codec has no record for travel pickled
    (cloudpickle, as Ray sends everything), between authenticated peers only. Every process of
    the cluster needs it (its receivers refuse pickled values otherwise)."""
    if allow is not None:
        return allow
    return os.environ.get(ENV_ALLOW_PICKLE, "").lower() in ("1", "true", "yes")


def pack_control(kind: Kind, req_id: int = 0, flags: int = 0) -> bytes:
    """The 12-byte control frame of a message."""
    return CONTROL.pack(VERSION, kind, flags, req_id)


def envelope(kind: Kind, req_id: int, payload: Sequence[Any] = ()) -> list[Any]:
    """The frames of a message: control (with a small header inlined) and the payload."""
    if payload:
        head = payload[0]
        if type(head) is bytes and len(head) <= INLINE_MAX:
            return [CONTROL.pack(VERSION, kind, INLINE, req_id) + head, *payload[1:]]
    return [CONTROL.pack(VERSION, kind, 0, req_id), *payload]


def open_envelope(msg: Sequence[Any], start: int) -> tuple[Kind, int, list[Any]]:
    """Parse ``msg[start:]`` into (kind, request id, payload frames).

    Raises:
        ProtocolError: a short control block, wrong version, unknown kind or bad flags.
    """
    first = msg[start]
    size = len(first)
    if size < CONTROL_SIZE:
        raise ProtocolError(f"control block of {size} bytes, expected {CONTROL_SIZE}")
    version, kind, flags, req_id = CONTROL.unpack_from(first)
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, expected {VERSION}")
    found = _KIND_OF.get(kind)
    if found is None:
        raise ProtocolError(f"unknown message kind {kind}")
    if flags & INLINE:
        payload = [memoryview(first)[CONTROL_SIZE:], *msg[start + 1 :]]
    elif size != CONTROL_SIZE or flags:
        raise ProtocolError("bad control flags")
    else:
        payload = list(msg[start + 1 :])
    return found, req_id, payload


def as_token(token: bytes | str) -> bytes:
    """The cluster token as bytes.

    Raises:
        ValueError: an empty token, or one shorter than 16 bytes.
    """
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if len(raw) < 16:
        raise ValueError("a cluster token must have at least 16 bytes (use new_token())")
    return raw


def new_token() -> str:
    """A fresh random cluster token (64 hex characters)."""
    return os.urandom(32).hex()


def new_nonce() -> bytes:
    """A fresh handshake nonce."""
    return os.urandom(NONCE_BYTES)


def session_key(nonce_c: bytes) -> int:
    """A number both ends of a session know, drawn from the client's handshake nonce (28
    bits): with a request's id it names the request on both sides (a timeline's flows)."""
    return int.from_bytes(nonce_c[:4], "big") >> 4


def server_proof(token: bytes, nonce_c: bytes, nonce_s: bytes) -> bytes:
    """What a server sends to prove it knows the token."""
    return hmac.new(token, b"rayless-server" + nonce_c + nonce_s, hashlib.sha256).digest()


def client_proof(token: bytes, nonce_s: bytes, nonce_c: bytes) -> bytes:
    """What a client sends to prove it knows the token."""
    return hmac.new(token, b"rayless-client" + nonce_s + nonce_c, hashlib.sha256).digest()


def proofs_match(expected: bytes, given: object) -> bool:
    """Constant-time comparison of an expected proof with whatever a peer sent."""
    return isinstance(given, bytes) and hmac.compare_digest(expected, given)


@lru_cache(maxsize=1)
def host_id() -> str:
    """An identifier of this machine's running kernel: equal for processes on the same host.

    Used to decide whether CUDA IPC handles (and shared memory) can reach a peer.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


# -- session revision and coalesced batches (docs/protocol.md) ---------------------------------

# The session protocol revision, sent as ``v`` in HELLO and CHALLENGE. The control block's
# version byte (VERSION) stays 1 so that peers of every revision can still parse each other's
# handshake and refuse a mismatch with a clear error. Revision 2 added BATCH; revision 3 made
# the control plane's messages typed (``actors.protocol.messages``, docs/protocol.md).
PROTOCOL = 3
# Kind byte of a coalesced batch; outside ``Kind`` on purpose: batches are split by the socket
# pump before any message reaches a handler, and a batch inside a batch is an unknown kind.
BATCH = 32
_SUBLEN = struct.Struct("<I")


def check_version(theirs: object, peer: str) -> None:
    """Raise ProtocolError unless ``theirs`` (a handshake's ``v``) is our PROTOCOL.

    Raises:
        ProtocolError: the peer speaks another revision (the message says which and what to do).
    """
    if theirs != PROTOCOL:
        raise ProtocolError(
            f"{peer} speaks rayless protocol version {theirs!r}, this process speaks {PROTOCOL}: "
            "run the same rayless version on both sides"
        )


def pack_batch(messages: Sequence[bytes]) -> bytes:
    """One frame carrying ``messages`` (each a one-frame message: control block + header):
    a control block of kind BATCH whose request id is the count, then ``<I length> message``
    for each."""
    parts = [CONTROL.pack(VERSION, BATCH, 0, len(messages))]
    sub = _SUBLEN.pack
    for m in messages:
        parts.append(sub(len(m)))
        parts.append(m)
    return b"".join(parts)


def is_batch(frame: Any) -> bool:
    """Whether a received control frame is a BATCH (cheap: looks at the kind byte only)."""
    return len(frame) > CONTROL_SIZE and frame[1] == BATCH


def split_batch(frame: Any) -> list[memoryview]:
    """The messages of a BATCH frame, as views into it (no copies).

    Raises:
        ProtocolError: a wrong version, flags, count or length (nothing of it is delivered).
    """
    view = memoryview(frame)
    if len(view) < CONTROL_SIZE:
        raise ProtocolError("short batch")
    version, kind, flags, count = CONTROL.unpack_from(view)
    if version != VERSION or kind != BATCH or flags:
        raise ProtocolError("bad batch control block")
    out: list[memoryview] = []
    pos, end = CONTROL_SIZE, len(view)
    unpack = _SUBLEN.unpack_from
    while pos < end:
        if end - pos < _SUBLEN.size:
            raise ProtocolError("truncated batch")
        (size,) = unpack(view, pos)
        pos += _SUBLEN.size
        if size > end - pos:
            raise ProtocolError("a batch entry runs past the frame")
        out.append(view[pos : pos + size])
        pos += size
    if len(out) != count:
        raise ProtocolError(f"batch of {len(out)} messages, announced {count}")
    return out
