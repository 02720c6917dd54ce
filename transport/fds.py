"""How many file descriptors this process can still spend on peers that have not
authenticated: the bounds on strangers (``transport.gate``, ``transport.unix_listener``, the
dashboard) must fit under the soft ``RLIMIT_NOFILE``, or a flood of strangers runs the process
out of descriptors before any bound applies, and then it can accept nobody, token holders
included, nor open a file.
"""

from __future__ import annotations

import os
import resource

__all__ = ["FD_MARGIN", "fds_left"]

FD_MARGIN = 64  # descriptors kept for everything else the process does


def fds_left(margin: int = FD_MARGIN) -> int | None:
    """Descriptors this process may still open, less ``margin`` (0 at least); None when the
    soft limit is unlimited. Counted now: call it at start, before serving."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 64
    return max(0, soft - used - margin)
