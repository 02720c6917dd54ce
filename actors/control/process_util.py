"""Small process-level helpers: die with the parent, logging setup, terminating children."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import time

from rayless.transport.shm import pid_alive

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Exits at once if the parent is already gone (the race the kernel call cannot close).
    """
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: rely on heartbeats
        return
    if os.getppid() != parent or parent == 1:
        os._exit(1)


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
