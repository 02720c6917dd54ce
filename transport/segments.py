"""Same-host shared memory for long-lived data: versioned segments, leases, cleanup after kill -9.

The transport's segments (``rayless.transport.shm``) carry one message and die when read. The
segments here live on: a writer fills one, *commits* it with a version, and any number of
readers on the host copy out of it, many times; the writer then rewrites it for a later
version. Weight sync (``rayless.weights.client``) uses them, and any storage unit can (a column
that readers map instead of receiving it over the socket).

API (all of it synchronous; run big copies in a thread):

* :class:`Segment` ``.create(payload_bytes)`` / ``.open(name)``: a mapped file
  ``/dev/shm/rayless-<pid>-<start>-<serial>-<hex>`` (the transport's naming rule) with a 64-byte
  header (magic, committed version, payload size, writers' fence) and ``payload`` (a writable
  memoryview).
* :class:`SlotPool` (writer): ``begin(nbytes)`` gives a :class:`Segment` leased exclusively
  (never the newest committed one, never one a reader holds: double buffering that grows to at
  most ``max_slots`` segments); ``commit(segment, version)``; ``close()`` unlinks them all.
* :class:`Reader` (reader): ``with reader.lease(name, version) as payload:`` a shared lease on
  the segment while it still holds ``version``, else :class:`Superseded` (re-ask which
  segment is newest). A reader never sees a half-written version: the writer writes under an
  exclusive lease and commits the header last.
* :func:`reap` unlinks every segment of a dead process now; :func:`owned` lists this
  process's segments.

Leases are ``flock`` locks on the segment's file: the kernel drops them when their process
dies, so a reader or writer killed with SIGKILL never blocks anyone. The file itself follows
the transport's rule: the periodic ``transport.shm.cleanup_stale`` of node agents and of a
local cluster's reaper removes segments whose creator no longer runs, within seconds (and
whoever learns of the death first may :func:`reap` them sooner); this process unlinks its own
at exit (a driver ended by SIGTERM or SIGHUP exits through it too:
``rayless.actors.api.signals``). Readers may keep a mapping of an
unlinked segment: its memory lives until they drop it (``Reader.close``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import mmap
import os
import stat
import struct
from collections.abc import Iterator

from rayless.transport import shm as _tshm
from rayless.transport.errors import ProtocolError

__all__ = ["HEADER", "Reader", "Segment", "SlotPool", "Superseded", "owned", "reap"]

HEADER = 64  # bytes before the payload (keeps the payload 64-byte aligned)
_MAGIC = b"RLSEG001"
_HDR = struct.Struct("<8sqq")  # magic, committed version (-1: being written), payload bytes
_FENCE_AT = _HDR.size  # then the writers' fence (see ``Segment.fence``)
_UNCOMMITTED = -1
_OWNED: set[str] = set()  # segments this process created and has not unlinked yet


class Superseded(Exception):
    """The segment no longer holds the version asked for (rewritten, being rewritten or gone)."""


def _forget_parent() -> None:
    _OWNED.clear()  # the parent owns (and unlinks) them


os.register_at_fork(after_in_child=_forget_parent)


def _unlink_owned() -> None:
    for name in list(_OWNED):
        _unlink(name)


atexit.register(_unlink_owned)


def _path(name: str) -> str:
    return os.path.join(_tshm.SHM_DIR, name)


def _unlink(name: str) -> None:
    _OWNED.discard(name)
    try:
        os.unlink(_path(name))
    except OSError:
        pass


def owned() -> list[str]:
    """Names of the segments this process created and has not unlinked."""
    return sorted(_OWNED)


def reap(pid: int, directory: str | None = None) -> list[str]:
    """Unlink every segment created by ``pid`` if that process no longer runs; their names.

    Does nothing for a live process (or this one). Raises OSError when the directory cannot
    be listed. (``rayless.transport.shm.reap``: the node agent calls it when an actor exits.)
    """
    return _tshm.reap(pid, directory)


class Segment:
    """One mapped shared-memory file: a header and ``payload``. See the module docstring."""

    def __init__(self, name: str, fd: int, mapping: mmap.mmap, payload_bytes: int) -> None:
        self.name = name
        self.fd = fd
        self.mapping = mapping
        self.payload_bytes = payload_bytes
        self.payload = memoryview(mapping)[HEADER : HEADER + payload_bytes]

    @classmethod
    def create(cls, payload_bytes: int) -> Segment:
        """A new segment with room for ``payload_bytes``, uncommitted, owned by this process.

        Raises OSError when ``/dev/shm`` cannot hold it (ENOSPC, no shared memory).
        """
        name = _tshm.new_name()
        fd = os.open(_path(name), _tshm.CREATE_FLAGS, 0o600)
        _OWNED.add(name)
        try:
            size = HEADER + max(1, payload_bytes)
            os.posix_fallocate(fd, 0, size)  # ENOSPC now, not a SIGBUS on first touch
            # no MAP_POPULATE: mmap() would populate while holding the GIL (a stalled event
            # loop); the first write faults the pages in with the GIL released instead
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
        except OSError:
            os.close(fd)
            _unlink(name)
            raise
        mapping[:HEADER] = _HDR.pack(_MAGIC, _UNCOMMITTED, payload_bytes).ljust(HEADER, b"\0")
        return cls(name, fd, mapping, payload_bytes)

    @classmethod
    def open(cls, name: str) -> Segment:
        """Map the existing segment ``name`` (of this user).

        Raises ProtocolError for a bad name or a file that is not one of ours, Superseded when
        it is gone (unlinked since its name was announced).
        """
        if type(name) is not str or not _tshm.NAME.fullmatch(name):
            raise ProtocolError(f"bad shared memory segment name {name!r}")
        try:
            fd = os.open(_path(name), _tshm.OPEN_FLAGS)
        except FileNotFoundError:
            raise Superseded(f"segment {name} is gone") from None
        except OSError as exc:
            raise ProtocolError(f"shared memory segment {name}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise ProtocolError(f"shared memory segment {name} is not one of ours")
            if info.st_size < HEADER:
                raise ProtocolError(f"shared memory segment {name} is too short")
            mapping = mmap.mmap(fd, info.st_size, flags=mmap.MAP_SHARED)  # see create
        except BaseException:
            os.close(fd)
            raise
        magic, _, payload = _HDR.unpack_from(mapping, 0)
        if magic != _MAGIC or HEADER + payload > info.st_size:
            mapping.close()
            os.close(fd)
            raise ProtocolError(f"shared memory segment {name} has no valid header")
        return cls(name, fd, mapping, payload)

    @property
    def version(self) -> int:
        """The committed version, or -1 while a writer holds it."""
        return int(_HDR.unpack_from(self.mapping, 0)[1])

    def _set_version(self, version: int) -> None:
        struct.pack_into("<q", self.mapping, 8, version)

    @property
    def fence(self) -> int:
        """The writers' fence: a writer that was handed slots under one fence copies into them
        only while the header still holds it (``rayless.store.samehost.columns``; 0 when never
        set)."""
        return int(struct.unpack_from("<q", self.mapping, _FENCE_AT)[0])

    def _set_fence(self, fence: int) -> None:
        struct.pack_into("<q", self.mapping, _FENCE_AT, fence)

    def unlinked(self) -> bool:
        """Whether the file is gone from ``/dev/shm`` (its memory lives only while mapped)."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def lock(self, exclusive: bool, wait: bool) -> bool:
        """Take the lease (``flock``); False when ``wait`` is False and someone holds it."""
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.fd, flags)
        except BlockingIOError:
            return False
        return True

    def unlock(self) -> None:
        """Drop the lease."""
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self, unlink: bool = False) -> None:
        """Unmap and close (and unlink: the creator's cleanup). Idempotent; never raises."""
        self.payload.release()
        with contextlib.suppress(BufferError, ValueError):
            self.mapping.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        if unlink:
            _unlink(self.name)


class SlotPool:
    """The writer's segments: double buffering with leases, at most ``max_slots`` of them."""

    def __init__(self, max_slots: int = 3) -> None:
        if max_slots < 2:
            raise ValueError(f"max_slots must be >= 2, got {max_slots}")
        self.max_slots = max_slots
        self.slots: list[Segment] = []
        self.newest: Segment | None = None

    def begin(self, nbytes: int) -> Segment:
        """A segment of ``nbytes`` payload, leased exclusively and marked uncommitted.

        Reuses a free segment of the right size (not the newest committed one); creates one
        while fewer than ``max_slots`` exist; else waits for the oldest reader to finish.
        Raises OSError when shared memory is exhausted.
        """
        for seg in self.slots:
            if seg is not self.newest and seg.payload_bytes == nbytes and seg.lock(True, False):
                seg._set_version(_UNCOMMITTED)
                return seg
        for seg in [s for s in self.slots if s is not self.newest and s.payload_bytes != nbytes]:
            if seg.lock(True, False):  # a segment of another size: replace it
                self.slots.remove(seg)
                seg.close(unlink=True)
        if len(self.slots) < self.max_slots:
            seg = Segment.create(nbytes)
            seg.lock(True, True)
            self.slots.append(seg)
            return seg
        seg = next(s for s in self.slots if s is not self.newest)
        seg.lock(True, True)  # readers hold leases only while they copy
        seg._set_version(_UNCOMMITTED)
        return seg

    def commit(self, seg: Segment, version: int) -> None:
        """Mark ``seg`` as holding ``version`` (header last) and drop the exclusive lease."""
        seg._set_version(version)
        seg.unlock()
        self.newest = seg

    def abort(self, seg: Segment) -> None:
        """Give back a segment from :meth:`begin` without committing it."""
        seg.unlock()

    def close(self) -> None:
        """Unlink every segment (readers' mappings stay valid until they drop them)."""
        for seg in self.slots:
            seg.close(unlink=True)
        self.slots.clear()
        self.newest = None


class Reader:
    """A reader's cache of opened segments and its leases. Not thread-safe: one per thread.

    A cached mapping keeps its segment's memory even after the writer unlinked it (a version
    of another size, a closed publisher): opening another segment first drops the cached
    mappings of unlinked segments."""

    def __init__(self, max_open: int = 8) -> None:
        self.max_open = max_open
        self._open: dict[str, Segment] = {}

    @contextlib.contextmanager
    def lease(self, name: str, version: int) -> Iterator[memoryview]:
        """Hold a shared lease on segment ``name`` while it holds ``version``; its payload.

        Raises Superseded when the segment is gone, being rewritten or holds another version
        (ask again which segment is newest); ProtocolError for a segment that is not ours.
        """
        seg = self._open.get(name)
        if seg is None:
            for gone in [n for n, s in self._open.items() if s.unlinked()]:
                self._open.pop(gone).close()  # its writer dropped it: give its memory back
            seg = Segment.open(name)
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open))).close()
            self._open[name] = seg
        if not seg.lock(False, False):
            raise Superseded(f"segment {name} is being rewritten")
        try:
            if seg.version != version:
                self._open.pop(name, None)
                raise Superseded(f"segment {name} holds version {seg.version}, not {version}")
            yield seg.payload
        finally:
            if seg.fd >= 0:
                seg.unlock()
            if name not in self._open:
                seg.close()

    def close(self) -> None:
        """Drop every mapping (their memory is freed once the writer unlinked them)."""
        for seg in self._open.values():
            seg.close()
        self._open.clear()
