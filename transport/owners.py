"""Who owns a file on this host, whether that owner still runs, and removing what dead owners left.

Every file and directory rayless leaves on a host while it runs (shared-memory segments in
``/dev/shm``, temporary directories in ``/tmp``) carries its owner in its name: the owner's pid
and the process's start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot),
``<pid>-<start>`` (:func:`tag`). The owner is alive while a process with that pid *and* that
start time runs (:func:`alive`), so a pid reused by an unrelated process does not keep a dead
owner's files. Whoever survives (a node agent, the reaper a local cluster leaves behind, the
next rayless process on the host) calls :func:`sweep` on a directory to remove the entries of
dead owners (an entry modified in the last ``grace`` seconds may be left for a later sweep).

Only entries of this user are removed (``/dev/shm`` and ``/tmp`` are shared), never through a
symbolic link. Where ``/proc`` is missing (not Linux) the start time is 0 and liveness falls
back to the pid alone.

Imports nothing of ours.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time

__all__ = ["alive", "mkdtemp", "pid_alive", "start_time", "sweep", "tag"]

_TAG: tuple[int, str] | None = None  # (pid, tag) of this process, computed once per pid


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (also one of another user); False for a bad pid."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field
    22); None when there is no such process or it has exited (a zombie its parent has not
    reaped yet); 0 where ``/proc`` is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else (0 if pid_alive(pid) else None)
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; field 22 is the
    # 20th after the closing parenthesis
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        if fields[0] in (b"Z", b"X"):  # exited: only its exit status is left
            return None
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def tag() -> str:
    """This process's owner tag, ``<pid>-<start time>`` (what :func:`alive` checks)."""
    global _TAG
    pid = os.getpid()
    if _TAG is None or _TAG[0] != pid:  # computed again in a forked child
        _TAG = (pid, f"{pid}-{start_time(pid) or 0}")
    return _TAG[1]


def alive(pid: int, start: int) -> bool:
    """Whether the owner ``pid``/``start`` still runs (a reused pid does not count)."""
    if pid <= 0:
        return False
    now = start_time(pid)
    if now is None:
        return False
    return now == start or now == 0 or start == 0


def mkdtemp(prefix: str, directory: str | None = None) -> str:
    """A new private directory ``<prefix><tag>-<random>`` (mode 0700) in ``directory``
    (default: the temporary directory), owned by this process for :func:`sweep`."""
    return tempfile.mkdtemp(prefix=f"{prefix}{tag()}-", dir=directory)


def sweep(directory: str, pattern: re.Pattern[str], grace: float = 0.0) -> list[str]:
    """Remove the entries of ``directory`` whose name fully matches ``pattern`` (with groups
    ``pid`` and ``start``) and whose owner no longer runs; files are unlinked, directories
    removed with what they hold. Entries of other users, links, entries modified less than
    ``grace`` seconds ago and entries of live owners are left. Returns the names removed;
    raises OSError when ``directory`` cannot be listed."""
    uid, now, removed = os.getuid(), time.time(), []
    with os.scandir(directory) as entries:
        for entry in entries:
            found = pattern.fullmatch(entry.name)
            if found is None or alive(int(found["pid"]), int(found["start"])):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if info.st_uid != uid or now - info.st_mtime < grace:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    shutil.rmtree(entry.path)
                elif stat.S_ISREG(info.st_mode):
                    os.unlink(entry.path)
                else:
                    continue
            except OSError:
                continue
            removed.append(entry.name)
    return removed
