"""Actor classes of the call-budget tests; importable by actor processes."""

from __future__ import annotations

from rayless.actors import Actor
from rayless.transport.counters import COUNTERS


class Pinger(Actor):
    """Trivial ``def`` and ``async def`` methods, and this process's wake-up counters."""

    def ping(self) -> int:
        """A plain method: runs on the actor's worker thread."""
        return 1

    async def aping(self) -> int:
        """An async method: runs on the actor's loop."""
        return 1

    async def counters(self) -> dict[str, int]:
        """This actor process's counts so far (``transport.counters``)."""
        return COUNTERS.snapshot()
