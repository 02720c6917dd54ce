"""Shared-memory segments for large CPU buffers sent to a peer on the same host.

The sender writes a buffer into a fresh file ``/dev/shm/rayless-<pid>-<start>-<counter>-<hex>``
(:func:`write`; ``<pid>-<start>`` is its owner tag, ``rayless.transport.owners``) and sends
its name and size instead of the bytes; the receiver maps it, unlinks it at once and builds
its tensor on the mapping (:func:`open_segment`), so the bytes are copied once, by the sender.
The sender writes with ``pwrite`` rather than through a mapping: tmpfs then allocates pages
without zeroing them first (about twice as fast as a populated mapping on these machines), and a
full ``/dev/shm`` fails with ENOSPC instead of a SIGBUS.

Leaks: the sender remembers the segments it created; :func:`sweep` (every ``SWEEP_INTERVAL``
seconds from encode, and at exit) unlinks those older than ``SHM_MAX_AGE``, which the receiver
normally unlinked long before (a message still unread after ``SHM_MAX_AGE`` then fails to decode
with ProtocolError). A process killed with SIGKILL cannot sweep: :func:`cleanup_stale` removes
segments whose creator no longer runs (same pid and start time: a reused pid does not count);
node agents and the reaper of a local cluster call it every few seconds
(``rayless.actors.control.reaper``), and an agent removes an actor's segments (:func:`reap`) as
soon as it exits. A message whose sender died before the receiver opened it then fails to decode
(ProtocolError), as its sender's call fails. No grace after the owner's death: the kernel
stamps a mapped segment's modification time when its dying owner unmaps it, so a grace
counted from the last write would be counted from the death. Processes that share a host id
are assumed to share ``/dev/shm`` and a pid namespace.

Imports neither torch nor numpy.
"""

from __future__ import annotations

import atexit
import logging
import mmap
import os
import re
import stat
import threading
import time
from typing import Any

from rayless.transport import owners
from rayless.transport.errors import ProtocolError
from rayless.transport.owners import pid_alive

__all__ = [
    "NAME",
    "SHM_DIR",
    "cleanup_stale",
    "discard",
    "new_name",
    "open_segment",
    "pid_alive",
    "reap",
    "sweep",
    "write",
]

log = logging.getLogger("rayless.transport")

SHM_DIR = "/dev/shm"
SHM_MAX_AGE = 60.0  # seconds after which the sender unlinks a segment nobody consumed
SWEEP_INTERVAL = 5.0  # seconds between two sweeps run from encode
NAME = re.compile(r"rayless-(?P<pid>[0-9]+)-(?P<start>[0-9]+)-[0-9]+-[0-9a-f]+", re.ASCII)
# Below ~8 MiB, creating, mapping and unlinking a segment costs as much as the socket copy
# (measured: a tie from 1 to 16 MiB, then 1.5-2x faster at 64-256 MiB).
_DEFAULT_MIN = 8 << 20
# how a segment is created (new, private to this user, never through a link) and opened
CREATE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def _min_bytes() -> int:
    raw = os.environ.get("RAYLESS_SHM_MIN_BYTES")
    if raw is None:
        return _DEFAULT_MIN
    try:
        value = int(raw)
        if value < 0:
            raise ValueError(raw)
    except ValueError:
        log.warning("ignoring RAYLESS_SHM_MIN_BYTES=%r (not a byte count)", raw)
        return _DEFAULT_MIN
    return value


# Buffers of at least this many bytes go through shared memory when enabled; 0 disables.
SHM_MIN_BYTES = _min_bytes()

LIVE: dict[str, float] = {}  # segments this process created: name -> time.monotonic() at birth


_NAME_LOCK = threading.Lock()


class _State:
    serial = 0  # segments created by this process
    next_sweep = 0.0  # time.monotonic() before which maybe_sweep does nothing
    warned = False  # the fallback to frames was logged
    atexit = False  # the exit sweep is registered


def _forget_parent() -> None:
    LIVE.clear()  # the parent sweeps its own segments


os.register_at_fork(after_in_child=_forget_parent)


def _unavailable(exc: OSError) -> None:
    if not _State.warned:
        _State.warned = True
        log.info("shared memory unavailable in %s (%s): large buffers use the socket", SHM_DIR, exc)


def _unlink(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:  # FileNotFoundError: the receiver unlinked it already
        pass


def new_name() -> str:
    """A fresh segment name of this process, ``rayless-<pid>-<start>-<serial>-<hex>`` (what
    :data:`NAME` matches and the sweeps parse). Thread-safe."""
    with _NAME_LOCK:
        _State.serial += 1
        serial = _State.serial
    return f"rayless-{owners.tag()}-{serial}-{os.urandom(4).hex()}"


def write(view: memoryview) -> str | None:
    """Copy the bytes of ``view`` into a new segment and return its name.

    Returns None when shared memory cannot be used (no or read-only ``/dev/shm``, ENOSPC...):
    the caller then sends the buffer as a frame. Raises nothing else.
    """
    name = new_name()
    try:
        fd = os.open(os.path.join(SHM_DIR, name), CREATE_FLAGS, 0o600)
    except OSError as exc:
        _unavailable(exc)
        return None
    LIVE[name] = time.monotonic()
    if not _State.atexit:
        _State.atexit = True
        atexit.register(sweep)
    try:
        try:
            done, size = 0, view.nbytes
            while done < size:
                done += os.pwrite(fd, view[done:], done)
        finally:
            os.close(fd)
    except OSError as exc:
        discard([name])
        _unavailable(exc)
        return None
    maybe_sweep()
    return name


def discard(names: list[str]) -> None:
    """Unlink segments this process created for a message that will not be sent."""
    for name in names:
        LIVE.pop(name, None)
        _unlink(name)


def open_segment(name: Any, size: Any) -> memoryview:
    """Map the segment ``name`` of ``size`` bytes, unlink it, and return a writable view.

    The mapping lives as long as the view (and whatever is built on it). Raises ProtocolError
    for a malformed name or size, a missing segment, or one whose size or owner differ.
    """
    if type(name) is not str or not NAME.fullmatch(name):
        raise ProtocolError(f"bad shared memory segment name {name!r}")
    if type(size) is not int or size <= 0:
        raise ProtocolError(f"bad shared memory segment size {size!r}")
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError as exc:
        raise ProtocolError(f"shared memory segment {name}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ProtocolError(f"shared memory segment {name} is not one of ours")
        if info.st_size != size:
            raise ProtocolError(
                f"shared memory segment {name} has {info.st_size} bytes, not {size}"
            )
        mapping = mmap.mmap(fd, size, flags=_MAP_FLAGS)
        os.unlink(path)
    except OSError as exc:
        raise ProtocolError(f"shared memory segment {name}: {exc}") from None
    finally:
        os.close(fd)
    return memoryview(mapping)


def sweep(max_age: float | None = None) -> int:
    """Unlink this process's segments older than ``max_age`` seconds (default ``SHM_MAX_AGE``).

    Returns how many were still there (not yet consumed by a receiver).
    """
    limit = SHM_MAX_AGE if max_age is None else max_age
    now = time.monotonic()
    removed = 0
    for name, born in list(LIVE.items()):
        if now - born >= limit:
            LIVE.pop(name, None)
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                removed += 1
            except OSError:
                pass
    return removed


def maybe_sweep() -> None:
    """:func:`sweep` unless one ran in the last ``SWEEP_INTERVAL`` seconds."""
    now = time.monotonic()
    if now >= _State.next_sweep:
        _State.next_sweep = now + SWEEP_INTERVAL
        sweep()


def reap(pid: int, directory: str | None = None) -> list[str]:
    """Unlink every segment created by ``pid`` now if that process no longer runs; their names.

    For whoever learns of a death first (the node agent, when its actor exits). Does nothing for
    a live process (or this one); the segments of an earlier process that had the same pid go
    too. Raises OSError when the directory cannot be listed.
    """
    if pid == os.getpid():
        return []
    removed = []
    with os.scandir(directory or SHM_DIR) as entries:
        for entry in entries:
            found = NAME.fullmatch(entry.name)
            if found is None or int(found["pid"]) != pid:
                continue
            if owners.alive(pid, int(found["start"])):
                continue
            try:
                os.unlink(entry.path)
                removed.append(entry.name)
            except OSError:
                pass
    return removed


def cleanup_stale(max_age: float = 0.0, directory: str | None = None) -> list[str]:
    """Remove segments whose creating process no longer runs, last written ``max_age`` s ago.

    For processes that died without sweeping (SIGKILL). Segments of live processes (and of
    this one) are left alone. Returns the names removed. Raises OSError when ``directory``
    (default ``SHM_DIR``) cannot be listed.
    """
    return owners.sweep(SHM_DIR if directory is None else directory, NAME, max_age)
