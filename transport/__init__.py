"""Wire format and sockets: the codec, ROUTER/DEALER endpoints and the authenticated handshake.

Imports nothing of ours; every other layer builds on it. The error root lives here.
"""

from transport.codec import decode, encode, register_extension
from transport.errors import (
    ActorDiedError,
    AuthError,
    BrokenError,
    ClosedError,
    LimitError,
    PlacementError,
    ProtocolError,
    RaylessError,
    RemoteError,
    StoreError,
    Timeout,
    TransportError,
)

__all__ = [
    "ActorDiedError",
    "AuthError",
    "BrokenError",
    "ClosedError",
    "LimitError",
    "PlacementError",
    "ProtocolError",
    "RaylessError",
    "RemoteError",
    "StoreError",
    "Timeout",
    "TransportError",
    "decode",
    "encode",
    "register_extension",
]
