"""The messages between a node agent (``spawner.ZygoteSpawner``) and its host's zygote.

Each is a frozen dataclass registered with the codec (``actors.protocol.wire.message``) under
``zyg.<Name>``; on the zygote's private UNIX socket each travels as one codec header (no
out-of-band frames) behind a 4-byte big-endian length (:func:`pack`, :func:`unpack`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rayless.actors.protocol.wire import message
from rayless.transport import codec
from rayless.transport.errors import ProtocolError

__all__ = [
    "MAX_FRAME", "Exited", "Fork", "ForkFailed", "Forked", "Preload", "Preloaded", "pack",
    "unpack",
]  # fmt: skip

LENGTH = struct.Struct(">I")
MAX_FRAME = 16 * 2**20


@message("zyg.Fork")
@dataclass(frozen=True)
class Fork:
    """Agent → zygote: fork an actor process whose environment is ``env`` (the whole of it:
    the agent's own plus the actor's), its output appended to ``log``, in ``cwd``; the child
    gets ``token`` in memory."""

    tag: int
    env: dict[str, str]
    log: str
    cwd: str | None
    token: str


@message("zyg.Preload")
@dataclass(frozen=True)
class Preload:
    """Agent → zygote: import ``module`` ahead of forks (best effort)."""

    module: str


@message("zyg.Forked")
@dataclass(frozen=True)
class Forked:
    """Zygote → agent: the fork of request ``tag`` is process ``pid``."""

    tag: int
    pid: int


@message("zyg.ForkFailed")
@dataclass(frozen=True)
class ForkFailed:
    """Zygote → agent: the fork of request ``tag`` failed."""

    tag: int
    error: str


@message("zyg.Exited")
@dataclass(frozen=True)
class Exited:
    """Zygote → agent: a forked process exited with ``code`` (< 0: killed by signal -code)."""

    pid: int
    code: int


@message("zyg.Preloaded")
@dataclass(frozen=True)
class Preloaded:
    """Zygote → agent: the outcome of a :class:`Preload`."""

    module: str
    ok: bool
    error: str


ZygoteMessage = Fork | Preload | Forked | ForkFailed | Exited | Preloaded


def pack(msg: ZygoteMessage) -> bytes:
    """One framed message.

    Raises:
        TypeError: a field cannot be encoded.
    """
    frames = codec.encode(msg)
    if len(frames) != 1:  # (no field is a tensor)
        raise TypeError(f"a zygote message travels in one frame, not {len(frames)}")
    body = bytes(frames[0])
    return LENGTH.pack(len(body)) + body


def unpack(body: bytes) -> object:
    """The message in one frame's body (its type is the receiver's to check).

    Raises:
        ProtocolError: the body is not a valid codec header.
    """
    if len(body) > MAX_FRAME:
        raise ProtocolError("zygote frame too large")
    return codec.decode([body])
