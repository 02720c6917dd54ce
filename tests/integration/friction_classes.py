"""Actor classes of the driver-end and slot tests; importable by actor processes."""

from __future__ import annotations

import subprocess
import threading
import time

from rayless.actors import Actor


class Slow(Actor):
    """A ``def`` method that takes a while, recording how many run at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.finished = 0

    def work(self, seconds: float) -> str:
        """Sleep ``seconds`` on a worker thread, counting concurrent calls."""
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(seconds)
        with self._lock:
            self.now -= 1
            self.finished += 1
        return "done"

    async def counts(self) -> dict[str, int]:
        """How many run now, the most that ever ran at once, and how many finished."""
        return {"now": self.now, "peak": self.peak, "finished": self.finished}


class Parent(Actor):
    """An actor that starts a child process of its own (a reward sandbox, a compiler)."""

    def __init__(self) -> None:
        self.child = subprocess.Popen(["sleep", "600"])

    async def child_pid(self) -> int:
        """The pid of the ``sleep 600`` this actor started."""
        return self.child.pid
