"""Actor classes for the debugging tests (importable by actor processes)."""

from __future__ import annotations

import asyncio
import os
import time


class Debuggee:
    """Methods that stop at ``breakpoint()`` or run until a file appears."""

    def pause(self, x: int) -> int:
        y = x * 2
        breakpoint()
        return y + 1

    async def apause(self, x: int) -> int:
        z = x + 100
        await asyncio.sleep(0)
        breakpoint()
        return z

    def spin_until(self, started: str, path: str) -> str:
        with open(started, "w"):
            pass
        while not os.path.exists(path):  # not a wait: the test's stack dump looks at this loop
            time.sleep(0.01)
        return "done"

    async def await_until(self, started: str, path: str) -> str:
        with open(started, "w"):
            pass
        while not os.path.exists(path):  # not a wait: the test's stack dump looks at this loop
            await asyncio.sleep(0.01)
        return "done"

    def ping(self) -> str:
        return "pong"


class PausedAtStart:
    """Stops at ``breakpoint()`` in its constructor (before the actor is ready)."""

    def __init__(self) -> None:
        w = 7
        breakpoint()
        self.w = w

    def value(self) -> int:
        return self.w


class PatientListener:
    """An actor whose debug listener gives strangers 10 minutes to handshake and never cuts
    one for a newcomer (instead of ``debug.HANDSHAKE_TIMEOUT`` and ``EVICT_AFTER``), so that a
    test's idle connections hold its slots while the test looks: as strangers opening fresh
    connections all the time would."""

    def __init__(self) -> None:
        from rayless.actors.control import debug

        assert debug._server is not None
        debug._server.handshake_timeout = 600.0
        debug._server.evict_after = 600.0

    def ping(self) -> str:
        return "pong"
