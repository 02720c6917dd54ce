"""Run rayless's event loops: uvloop when it is installed (an optional speed-up), else asyncio.

uvloop cuts the per-wake-up cost of the loop (measured: +12% request/reply round trips on one
side alone). It is never required; ``RAYLESS_UVLOOP=0`` turns it off. Install it with the
``fast`` extra (``pip install 'rayless[fast]'``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_enabled() -> bool:
    """Whether :func:`run` will use uvloop."""
    if os.environ.get("RAYLESS_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a uvloop loop when available.

    When ``main`` ends, the signal wakeup fd is dropped before the loop closes: asyncio's
    ``close()`` closes its self-pipe first and resets the wakeup fd only afterwards, so a
    signal arriving in between (a SIGTERM to a process already shutting down) printed
    "Exception ignored when trying to write to the signal wakeup fd: [Errno 9] Bad file
    descriptor". Signals that arrive from then on are ignored: the process is exiting.
    """
    if uvloop_enabled():
        import uvloop

        result: T = uvloop.run(_then_drop_wakeup_fd(main))
        return result
    return asyncio.run(_then_drop_wakeup_fd(main))


async def _then_drop_wakeup_fd(main: Coroutine[Any, Any, T]) -> T:
    try:
        return await main
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(-1)
