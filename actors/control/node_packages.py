"""A node agent's extracted packages: a spawn's files (Ray's ``runtime_env`` ``working_dir``
and ``py_modules``), fetched from the head's package store once per node and extracted into
a private directory (mode 0700) that goes when the agent closes.

A zip is checked against its digest before it is opened, and extracted entry by entry: a
name that is absolute or climbs out (``..``), a link, or more than :data:`MAX_EXTRACTED`
bytes in all is refused with a :class:`PackageError` (an archive is never trusted to stay in
its directory). An extract appears under its final name only once complete.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
import zipfile
from collections.abc import Awaitable, Callable

from rayless.actors.errors import PackageError
from rayless.actors.protocol.messages import PackageFetch, PackageRef
from rayless.transport import owners

__all__ = ["MAX_EXTRACTED", "NodePackages", "extract"]

MAX_EXTRACTED = 4 * 2**30  # one package's files, extracted (a zip bomb stops here)
FETCH_PART = 4 * 2**20  # bytes travel in the message header (16 MiB at most)

Fetch = Callable[[PackageFetch], Awaitable[bytes]]


class NodePackages:
    """Packages extracted on this node, by digest; ``fetch`` asks the head for a part."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._dir: str | None = None
        self._ready: dict[str, asyncio.Future[str]] = {}

    async def path(self, ref: PackageRef) -> str:
        """The directory ``ref`` is extracted in (fetched and extracted at its first use).

        Raises:
            PackageError: the head does not hold it, its bytes do not match its digest, or
                its archive is refused.
        """
        fut = self._ready.get(ref.digest)
        if fut is None:
            fut = self._ready[ref.digest] = asyncio.ensure_future(self._get(ref))
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if fut.done() and self._ready.get(ref.digest) is fut:
                del self._ready[ref.digest]  # the next spawn tries again
            raise

    async def _get(self, ref: PackageRef) -> str:
        if self._dir is None:
            self._dir = owners.mkdtemp("rayless-node-packages-")
        zip_path = os.path.join(self._dir, f"{ref.digest}.zip")
        hasher = hashlib.sha256()
        with open(zip_path, "wb") as out:
            offset = 0
            while offset < ref.size:
                part = await self._fetch(PackageFetch(ref.digest, offset, FETCH_PART))
                if not part:
                    raise PackageError(f"package {ref.digest[:12]} ended at {offset} bytes")
                out.write(part)
                hasher.update(part)
                offset += len(part)
        try:
            if hasher.hexdigest() != ref.digest or offset != ref.size:
                raise PackageError(f"package {ref.digest[:12]}: its bytes do not match")
            target = os.path.join(self._dir, ref.digest)
            await asyncio.to_thread(extract, zip_path, target)
        finally:
            os.unlink(zip_path)
        return target

    def close(self) -> None:
        """Remove every extract. Idempotent."""
        for fut in self._ready.values():
            fut.cancel()
        self._ready.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def extract(zip_path: str, target: str) -> None:
    """Extract ``zip_path`` into ``target`` (which must not exist), refusing what would
    leave it.

    Raises:
        PackageError: an absolute or climbing name, a link or device entry, or more than
            :data:`MAX_EXTRACTED` bytes.
    """
    partial = f"{target}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.mkdir(partial, 0o700)
    try:
        with zipfile.ZipFile(zip_path) as archive:
            total = 0
            for info in archive.infolist():
                name = info.filename
                parts = name.replace("\\", "/").split("/")
                if name.startswith("/") or ".." in parts or ":" in parts[0]:
                    raise PackageError(f"a package entry {name!r} would leave its directory")
                mode = info.external_attr >> 16
                if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise PackageError(f"a package entry {name!r} is not a file or directory")
                total += info.file_size
                if total > MAX_EXTRACTED:
                    raise PackageError(
                        f"a package extracts to more than {MAX_EXTRACTED // 2**30} GiB"
                    )
                archive.extract(info, partial)
                if mode and stat.S_ISREG(mode):
                    os.chmod(os.path.join(partial, name), stat.S_IMODE(mode) & 0o755 | 0o600)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
