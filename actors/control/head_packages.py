"""The head's package store: the zips of spawns' files (Ray's ``runtime_env`` ``working_dir``
and ``py_modules``), by their sha256, for the nodes that extract them.

A driver uploads a package in parts (:class:`PackageUpload`) once per cluster: a package the
store holds already is answered at once. Parts go to a partial file of that connection's
own; the whole is checked against its digest before it is kept. Agents read it back in parts
(:class:`PackageFetch`). Everything lives in a private directory (mode 0700) removed when
the head closes. Limits: :data:`MAX_PACKAGE` per package, :data:`MAX_STORE` in all (kept and
partial), :data:`MAX_PARTIALS` uploads at once per connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field

from rayless.actors.errors import PackageError
from rayless.actors.protocol.messages import PackageFetch, PackageUpload
from rayless.actors.protocol.wire import handles
from rayless.transport import owners
from rayless.transport.errors import ProtocolError
from rayless.transport.peer import Peer

__all__ = ["MAX_PACKAGE", "MAX_PART", "MAX_STORE", "HeadPackages"]

MAX_PACKAGE = 512 * 2**20  # one package's zip (Ray's working_dir limit is about this)
MAX_STORE = 8 * 2**30  # every package the head holds, and those on their way
MAX_PART = 8 * 2**20  # one upload or fetch message's data (under the 16 MiB header bound)
MAX_PARTIALS = 4  # uploads under way per connection
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass
class _Partial:
    """One connection's upload of one package, under way."""

    path: str
    size: int
    written: int = 0
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)


class HeadPackages:
    """The package store's requests (a collaborator of the head's dispatch)."""

    def __init__(self) -> None:
        self._dir: str | None = None
        self._kept: dict[str, int] = {}  # digest -> size
        self._partials: dict[tuple[bytes, str], _Partial] = {}
        self._lock = asyncio.Lock()  # one part written at a time: the sizes stay exact

    def _directory(self) -> str:
        if self._dir is None:
            self._dir = owners.mkdtemp("rayless-packages-")
        return self._dir

    def _used(self) -> int:
        return sum(self._kept.values()) + sum(p.size for p in self._partials.values())

    @handles(PackageUpload)
    async def op_package_upload(self, peer: Peer, msg: PackageUpload) -> bool:
        """Take a part of a package; whether the head holds all of it now.

        Raises:
            ProtocolError: a malformed digest, a part out of order or too big.
            PackageError: the package is too big, or the store is full.
        """
        digest = _checked(msg.digest)
        if digest in self._kept:
            return True
        if len(msg.data) > MAX_PART:
            raise ProtocolError(f"a package part of {len(msg.data)} bytes (at most {MAX_PART})")
        key = (peer.routing_id, digest)
        async with self._lock:
            part = self._partials.get(key)
            if msg.offset == 0:
                if part is not None:
                    self._drop(key)
                part = self._start(peer, key, msg.size)
            elif part is None or msg.offset != part.written or msg.size != part.size:
                raise ProtocolError(f"package {digest[:12]}: a part out of order")
            if part.written + len(msg.data) > part.size:
                self._drop(key)
                raise ProtocolError(f"package {digest[:12]}: more bytes than its size")
            await asyncio.to_thread(_append, part.path, msg.data)
            part.hasher.update(msg.data)
            part.written += len(msg.data)
            if part.written < part.size:
                return False
            del self._partials[key]
            if part.hasher.hexdigest() != digest:
                os.unlink(part.path)
                raise PackageError(f"package {digest[:12]}: its bytes do not have its digest")
            os.replace(part.path, os.path.join(self._directory(), f"{digest}.zip"))
            self._kept[digest] = part.size
            return True

    def _start(self, peer: Peer, key: tuple[bytes, str], size: int) -> _Partial:
        if not 0 < size <= MAX_PACKAGE:
            raise PackageError(
                f"a package of {size} bytes: at most {MAX_PACKAGE // 2**20} MiB (zipped) can be "
                "shipped; leave big files out with runtime_env 'excludes'"
            )
        if sum(1 for p, _ in self._partials if p == peer.routing_id) >= MAX_PARTIALS:
            raise PackageError(f"more than {MAX_PARTIALS} package uploads at once")
        if self._used() + size > MAX_STORE:
            raise PackageError(
                f"the head's package store is full ({MAX_STORE // 2**30} GiB): restart the "
                "cluster to empty it"
            )
        path = os.path.join(self._directory(), f"partial-{key[0].hex()}-{key[1]}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        part = self._partials[key] = _Partial(path, size)
        return part

    def _drop(self, key: tuple[bytes, str]) -> None:
        part = self._partials.pop(key, None)
        if part is not None:
            try:
                os.unlink(part.path)
            except FileNotFoundError:
                pass

    @handles(PackageFetch)
    async def op_package_fetch(self, peer: Peer, msg: PackageFetch) -> bytes:
        """Up to ``length`` bytes of a kept package from ``offset``.

        Raises:
            ProtocolError: a malformed digest, offset or length.
            PackageError: the head does not hold that package.
        """
        digest = _checked(msg.digest)
        size = self._kept.get(digest)
        if size is None:
            raise PackageError(f"the head holds no package {digest[:12]}")
        if not (0 <= msg.offset <= size and 0 < msg.length <= MAX_PART):
            raise ProtocolError(f"package {digest[:12]}: a fetch out of range")
        path = os.path.join(self._directory(), f"{digest}.zip")
        return await asyncio.to_thread(_read, path, msg.offset, msg.length)

    def peer_gone(self, routing_id: bytes) -> None:
        """A connection went away: its uploads under way are dropped."""
        for key in [k for k in self._partials if k[0] == routing_id]:
            self._drop(key)

    def close(self) -> None:
        """Remove every package. Idempotent."""
        self._partials.clear()
        self._kept.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _checked(digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise ProtocolError("a package digest is 64 hex digits")
    return digest


def _append(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _read(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)
