"""Actor output: per-actor log files on the node, forwarded line by line to the driver.

Each actor's stdout and stderr go to a file in the agent's log directory. The agent's
:class:`LogTailer` reads new lines every ``interval`` seconds and sends them (via the head)
to the session that owns the actor, which prints them prefixed with the actor's name and pid
and node, as Ray does: ``(learner pid=1234 node=n0) loss 0.31``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from rayless.actors.protocol.messages import LogLines

MAX_LINE = 8192
MAX_LINES_PER_TICK = 2000


@dataclass
class _Watched:
    actor_id: str
    name: str
    pid: int
    node: str
    path: str
    offset: int = 0
    partial: bytes = b""


class LogTailer:
    """Follows actors' log files and hands new lines to ``send``."""

    def __init__(self, send: Callable[[LogLines], None], interval: float = 0.1) -> None:
        self._send = send
        self._interval = interval
        self._files: dict[str, _Watched] = {}

    def watch(self, actor_id: str, name: str, pid: int, node: str, path: str) -> None:
        """Start following ``path`` (from its current end: a restart appends to it)."""
        try:
            offset = os.path.getsize(path)
        except OSError:
            offset = 0
        self._files[actor_id] = _Watched(actor_id, name, pid, node, path, offset)

    def forget(self, actor_id: str) -> None:
        """Stop following an actor's file."""
        self._files.pop(actor_id, None)

    async def final(self, actor_id: str) -> None:
        """Forward what an exited actor wrote last, including an unterminated line."""
        watched = self._files.get(actor_id)
        if watched is not None:
            self._read(watched, final=True)

    async def flush(self) -> None:
        """Forward everything written so far."""
        for watched in list(self._files.values()):
            self._read(watched, final=True)

    async def run(self) -> None:
        """Poll the files until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            for watched in list(self._files.values()):
                self._read(watched)

    def _read(self, w: _Watched, final: bool = False) -> None:
        try:
            with open(w.path, "rb") as f:
                f.seek(w.offset)
                data = f.read(MAX_LINE * MAX_LINES_PER_TICK)
        except OSError:
            return
        if not data and not (final and w.partial):
            return
        w.offset += len(data)
        data = w.partial + data
        lines = data.split(b"\n")
        w.partial = lines.pop()
        if final and w.partial:
            lines.append(w.partial)
            w.partial = b""
        if len(w.partial) > MAX_LINE:
            lines.append(w.partial)
            w.partial = b""
        if lines:
            text = tuple(ln[:MAX_LINE].decode("utf-8", "replace") for ln in lines)
            self._send(LogLines(w.actor_id, w.name, w.pid, w.node, text))


def print_lines(batch: LogLines, stream: TextIO | None = None) -> None:
    """Print a forwarded batch of an actor's lines with Ray's prefix."""
    out = stream or sys.stderr
    prefix = f"({batch.name} pid={batch.pid} node={batch.node}) "
    out.write("".join(prefix + line + "\n" for line in batch.lines))
    out.flush()
