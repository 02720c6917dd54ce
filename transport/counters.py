"""Process-wide counts of the events that cost a wake-up: socket sends and reads, cross-thread
hand-offs. Always on (an integer increment each, on paths that cost microseconds anyway).

They make speed budgets machine-independent: a test runs N calls and checks the events per
call against docs/performance.md, whatever the machine's speed or load.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Counters:
    """What this process did so far (totals since start; compare two snapshots)."""

    socket_sends: int = 0  # sendmsg calls of the same-host path + ZeroMQ message sends
    socket_reads: int = 0  # loop wake-ups by a socket that brought at least one message
    thread_handoffs: int = 0  # loop -> def-method thread wake-ups (a sleeping thread woken)
    thread_starts: int = 0  # def-method threads started
    loop_wakeups: int = 0  # def-method thread -> loop wake-ups (call_soon_threadsafe)
    def_calls: int = 0  # def-method calls run by the worker threads

    def snapshot(self) -> dict[str, int]:
        """The counts now, by name."""
        return asdict(self)


COUNTERS = Counters()

__all__ = ["COUNTERS", "Counters"]
