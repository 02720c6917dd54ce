"""What dead rayless processes left on this host, and who removes it within seconds.

A rayless process leaves three kinds of things on its host while it runs, each carrying its
owner (pid and start time, ``rayless.transport.owners``):

* shared-memory segments, ``/dev/shm/rayless-<pid>-<start>-<serial>-<hex>`` (message buffers,
  published weight versions, storage columns: ``rayless.transport.shm``/``segments``);
* temporary directories, ``/tmp/rayless-{local,zygote,launch}-<pid>-<start>-<random>`` (a local
  cluster's sockets and logs, an agent's own fork template, a launch's token file);
* runtime entries of a local cluster's head, ``cluster-<head pid>.json`` and its ``.token``
  (``rayless.actors.core.published``: the entry holds the head's pid and start time).

An owner that exits normally, or on SIGINT, SIGTERM or SIGHUP (a driver: see
``rayless.actors.api.signals``), removes its own. One killed with SIGKILL cannot, and a kill
often takes several processes at once (a job's cgroup, a head killed with its driver). So
whoever survives on the host sweeps with :func:`sweep_host` (one listing of each directory,
filtered by our prefixes; entries of live owners are left):

* every node agent, every ``SWEEP_INTERVAL`` seconds (a launched cluster: each host has one);
* the **reaper**, a small process every local cluster (``Cluster.local``, the test fixture)
  starts beside it (``python -m rayless.actors.control.reaper PID:START ...``): in its own
  session, holding no token, it polls the cluster's processes (the driver, head, fork templates
  and agents) every ``POLL_INTERVAL`` seconds, sweeps every ``SWEEP_INTERVAL`` seconds, and
  exits ``LINGER`` seconds after the last of them is gone (after a final sweep: the actors,
  which die after their agent, are gone by then), or at once on SIGTERM (the cluster's own
  clean stop, after which the driver sweeps once itself); it also sweeps once as it starts,
  which is "the next rayless command on the host" for leftovers of clusters that had no
  survivor.

The head runs no sweep of its own: every host of a launched cluster has a node agent (the
head's too), and a local cluster has its reaper.

Why a process rather than only the head and agents: when a driver with an embedded cluster is
killed with SIGKILL, the kernel ends its head and agents with it (``PR_SET_PDEATHSIG``), so
nothing of the cluster survives to remove the driver's segments (a published weight version
is hundreds of MiB of RAM) or its directory. The reaper is the one process that outlives
them, and it needs neither the token nor torch (it imports only the sweeps). What a dead
owner left is gone within ``SWEEP_INTERVAL`` seconds of its death (``POLL_INTERVAL`` when
the last watched process dies).
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import tempfile
import time
from types import FrameType

from rayless.actors.core import published
from rayless.actors.errors import ConnectError
from rayless.transport import owners, shm

log = logging.getLogger("rayless.reaper")

POLL_INTERVAL = 0.5  # seconds between two checks of the watched processes
SWEEP_INTERVAL = 2.0  # seconds between two sweeps
LINGER = 3.0  # seconds the reaper sweeps on after the last watched process is gone
# the temporary directories of rayless processes (``owners.mkdtemp`` with these prefixes)
DIR_PREFIXES = (
    "rayless-local-",
    "rayless-zygote-",
    "rayless-launch-",
    "rayless-packages-",  # the head's package store
    "rayless-node-packages-",  # a node agent's extracted packages
    "rayless-job-",  # a submitted job's supervisor: its log and its entrypoint's token file
)
DIRS = re.compile(
    r"rayless-(?:local|zygote|launch|packages|node-packages|job)-(?P<pid>[0-9]+)-(?P<start>[0-9]+)"
    r"-[A-Za-z0-9_]+",
    re.ASCII,
)

__all__ = ["DIRS", "DIR_PREFIXES", "SWEEP_INTERVAL", "main", "reaper_args", "sweep_host"]


def sweep_host() -> list[str]:
    """Remove what dead rayless processes of this user left on this host: segments, temporary
    directories and runtime entries (see the module docstring). Returns the names of the
    segments and directories removed; never raises."""
    removed: list[str] = []
    try:
        removed += shm.cleanup_stale()
    except OSError:
        pass
    try:
        removed += owners.sweep(tempfile.gettempdir(), DIRS)
    except OSError:
        pass
    try:
        published.discover()  # removes the entries of heads that are gone
    except (ConnectError, OSError):  # an untrusted runtime directory: nothing is read there
        pass
    return removed


def reaper_args(pids: list[int]) -> list[str]:
    """The reaper's arguments watching ``pids`` (``PID:START`` each; pids already gone are
    left out)."""
    out = []
    for pid in pids:
        start = owners.start_time(pid)
        if start is not None:
            out.append(f"{pid}:{start}")
    return out


class _Stop(Exception):
    """SIGTERM: the cluster stopped on its own."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def watch(watched: list[tuple[int, int]]) -> None:
    """Sweep every ``SWEEP_INTERVAL`` s until ``LINGER`` s after every watched owner is gone."""
    gone_since: float | None = None
    next_sweep = 0.0
    while True:
        now = time.monotonic()
        if now >= next_sweep:
            next_sweep = now + SWEEP_INTERVAL
            sweep_host()
        if gone_since is None and not any(owners.alive(p, s) for p, s in watched):
            gone_since = now
            next_sweep = now  # at once
        if gone_since is not None and now - gone_since >= LINGER:
            sweep_host()
            return
        time.sleep(POLL_INTERVAL)


def main() -> None:
    """Entry point of ``python -m rayless.actors.control.reaper PID:START ...``."""
    watched = []
    for arg in sys.argv[1:]:
        pid, _, start = arg.partition(":")
        watched.append((int(pid), int(start)))
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the driver's
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # outlives the terminal it started from
    try:
        watch(watched)
    except _Stop:
        pass


if __name__ == "__main__":
    main()
