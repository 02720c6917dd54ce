"""Wire format and sockets: the codec, ROUTER/DEALER endpoints and the authenticated handshake.

Imports nothing of ours; every other layer builds on it. The error root lives here.
"""

from typing import TYPE_CHECKING

from rayless.transport.lazy import exports

if TYPE_CHECKING:
    from rayless.transport.client import Client
    from rayless.transport.codec import (
        decode,
        encode,
        join_family,
        leave_family,
        register_extension,
        register_family,
    )
    from rayless.transport.errors import (
        AuthError,
        BrokenError,
        ClosedError,
        LimitError,
        ProtocolError,
        RaylessError,
        RemoteError,
        Timeout,
        TransportError,
    )
    from rayless.transport.protocol import Limits, new_token, pickle_allowed
    from rayless.transport.server import Peer, Request, Server

__all__ = [
    "AuthError",
    "BrokenError",
    "Client",
    "ClosedError",
    "LimitError",
    "Limits",
    "Peer",
    "ProtocolError",
    "RaylessError",
    "RemoteError",
    "Request",
    "Server",
    "Timeout",
    "TransportError",
    "decode",
    "encode",
    "join_family",
    "leave_family",
    "new_token",
    "pickle_allowed",
    "register_extension",
    "register_family",
]

__getattr__, __dir__ = exports(__name__)
