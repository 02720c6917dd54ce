"""Wire format and sockets: the codec, ROUTER/DEALER endpoints and the authenticated handshake.

Imports nothing of ours; every other layer builds on it. The error root lives here.
"""

from transport.client import Client
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
from transport.protocol import Limits, new_token
from transport.server import Peer, Request, Server

__all__ = [
    "ActorDiedError",
    "AuthError",
    "BrokenError",
    "Client",
    "ClosedError",
    "LimitError",
    "Limits",
    "Peer",
    "PlacementError",
    "ProtocolError",
    "RaylessError",
    "RemoteError",
    "Request",
    "Server",
    "StoreError",
    "Timeout",
    "TransportError",
    "decode",
    "encode",
    "new_token",
    "register_extension",
]
