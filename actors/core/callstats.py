"""Counters of one actor process's calls, for the cluster's metrics (``rayless status
--prometheus``, the dashboard): calls and errors per method since the process started, and
its queue depth now (calls waiting for a ``def`` slot or the async concurrency limit, calls
running). Always on: one dict update per call. Read through the debug listener's
``metrics`` command (:func:`dump`).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

__all__ = ["STATS", "CallStats", "dump"]

_LAST_ERROR_CHARS = 300


class CallStats:
    """Calls and errors per method, and a probe of the actor's queues."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}  # updated on the actor's loop only
        self.errors: dict[str, int] = {}  # from the loop and the def methods' threads
        self.last_error = ""  # "method: Type: message" of the latest call that raised
        self._lock = threading.Lock()
        self._host: Any = None

    def reset(self) -> None:
        """Start from zero (a forked child)."""
        self.calls.clear()
        self.errors.clear()
        self.last_error = ""
        self._lock = threading.Lock()
        self._host = None

    def watch(self, host: Any) -> None:
        """Report the queues of ``host`` (the process's ``ActorHost``)."""
        self._host = host

    def call(self, method: str) -> None:
        """Count one call of ``method``."""
        self.calls[method] = self.calls.get(method, 0) + 1

    def error(self, method: str, exc: BaseException | None = None) -> None:
        """Count one call of ``method`` that raised ``exc`` (from any thread)."""
        with self._lock:
            self.errors[method] = self.errors.get(method, 0) + 1
            if exc is not None:
                self.last_error = f"{method}: {_describe(exc)}"[:_LAST_ERROR_CHARS]

    def queues(self) -> dict[str, int]:
        """``queued`` (waiting to start) and ``running`` calls now."""
        host = self._host
        if host is None:
            return {"queued": 0, "running": 0}
        # the default group's limit and threads, then each concurrency group's
        lanes = [(getattr(host, "semaphore", None), getattr(host, "worker", None))]
        lanes += list((getattr(host, "groups", None) or {}).values())
        queued = running = 0
        for semaphore, worker in lanes:
            queued += len(getattr(worker, "_waiting", ()) or ())
            running += int(getattr(worker, "running", 0) or 0)
            queued += len(getattr(semaphore, "_waiters", None) or ())
        monitor = getattr(host, "monitor", None)
        running += len(getattr(monitor, "running", ()) or ())
        return {"queued": queued, "running": running}

    def snapshot(self) -> dict[str, Any]:
        """Plain values: the counters, the queues, the pid."""
        with self._lock:
            errors, last = dict(self.errors), self.last_error
        return {"pid": os.getpid(), "calls": dict(self.calls), "errors": errors,
                "last_error": last, **self.queues()}  # fmt: skip


def _describe(exc: BaseException) -> str:
    """``Type: message``; an exception whose ``__str__`` raises still gets a line."""
    try:
        text = str(exc)
    except Exception:
        text = "(its str() raised)"
    return f"{type(exc).__name__}: {text}"


STATS = CallStats()
os.register_at_fork(after_in_child=STATS.reset)


def dump() -> str:
    """The debug listener's ``metrics`` answer: one JSON line of :meth:`CallStats.snapshot`."""
    return json.dumps(STATS.snapshot()) + "\n"
