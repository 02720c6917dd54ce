"""Small process-level helpers: die with the parent, logging setup, terminating children."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

from rayless.transport.shm import pid_alive

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    SIGTERM by default: a head, node agent or zygote whose driver or launch died (killed by
    any signal, ``kill -9`` included) shuts down as on a stop, and takes its actors and what
    they started along (a SIGKILL would leave those behind). Exits at once if the parent is
    already gone (the race the kernel call cannot close).
    """
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: rely on heartbeats
        return
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def pdeathsig_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get ``sig`` when its parent's starting thread
    ends (``PR_SET_PDEATHSIG``, Linux; None elsewhere). Start the child from a thread that
    lives as long as the process (the main thread, an event loop's)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return hook


def become_subreaper() -> bool:
    """Make orphaned descendants of this process's children its own children (Linux only).

    An actor's child that outlives it (or escaped its process group with ``setsid``) is then
    reparented here instead of to init, where :func:`kill_orphans` finds it. False where the
    kernel call is not available.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the process group ``pgid`` (an actor and its children)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` right now (from /proc; empty where it is missing)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def kill_orphans(keep: set[int]) -> list[int]:
    """SIGKILL this process's children that are not in ``keep``: orphans reparented to us.

    Returns the pids signalled (their exits are reaped by the caller's reaper).
    """
    killed = []
    for pid in children(os.getpid()):
        if pid not in keep:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def setup_logging(role: str) -> None:
    """Log warnings and errors of rayless to stderr, prefixed with the process's role."""
    level = os.environ.get("RAYLESS_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING),
        format=f"[{role} pid={os.getpid()}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def terminate(pids: list[int], grace: float) -> dict[int, str]:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, SIGKILL the rest.

    Returns how each ended ("terminated" / "killed" / "gone"). Only for processes that are
    not our children (children must be reaped by their parent's reaper).
    """
    outcome: dict[int, str] = {}
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            outcome[pid] = "gone"
    deadline = time.monotonic() + grace
    alive = [p for p in pids if p not in outcome]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if pid_alive(p)]
    for pid in pids:
        if pid in outcome:
            continue
        if pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                outcome[pid] = "killed"
            except ProcessLookupError:
                outcome[pid] = "terminated"
        else:
            outcome[pid] = "terminated"
    return outcome
