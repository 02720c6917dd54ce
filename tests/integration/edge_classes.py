"""Actor classes for tests/integration/test_actors_edges.py (importable by actor processes)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class Holder:
    """Holds its own event loop, starts children, reads its own log."""

    async def hold(self, seconds: float) -> str:
        time.sleep(seconds)  # a long synchronous step inside an async method
        return "held"

    async def ping(self) -> str:
        await asyncio.sleep(0)
        return "pong"

    async def hold_marked(self, mark: str, seconds: float) -> str:
        """Create file ``mark``, then hold the loop for ``seconds``."""
        Path(mark).touch()
        time.sleep(seconds)
        return "held"

    def own_log(self) -> str:
        return Path(os.readlink("/proc/self/fd/2")).read_text()

    def start_children(self) -> list[int]:
        """A child in the actor's process group and a grandchild that escaped it (setsid)."""
        child = subprocess.Popen(["sleep", "300"])
        escaped = subprocess.Popen(["sleep", "301"], start_new_session=True)
        return [child.pid, escaped.pid]

    def token_seen(self) -> dict[str, str | None]:
        """The cluster token as this process and a child of it see it."""
        out = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ.get('RAYLESS_TOKEN', '<none>'))"],
            capture_output=True,
            text=True,
            check=True,
        )
        return {"actor": os.environ.get("RAYLESS_TOKEN"), "child": out.stdout.strip()}

    def pid(self) -> int:
        return os.getpid()


class FailsOnRestart:
    """Starts once; every restart fails in ``setup`` after a pause."""

    def __init__(self, marker: str) -> None:
        self.marker = Path(marker)

    def setup(self) -> None:
        if self.marker.exists():
            time.sleep(2.0)
            raise RuntimeError("restart refused")
        self.marker.write_text("started")

    def pid(self) -> int:
        return os.getpid()


class SlowInitMarksTerm:
    """Writes its pid, notes a SIGTERM in ``pid_file + '.term'``, takes ``seconds`` to
    construct."""

    def __init__(self, pid_file: str, seconds: float) -> None:
        import signal
        import threading

        from rayless.actors.api.portal import home_loop

        loop, installed = home_loop(), threading.Event()

        def install() -> None:  # (the constructor runs in a worker thread; the loop handles
            # signals, and this handler replaces the one that stops the actor)
            loop.add_signal_handler(
                signal.SIGTERM, lambda: Path(pid_file + ".term").write_text("SIGTERM")
            )
            installed.set()

        loop.call_soon_threadsafe(install)
        installed.wait(30)
        Path(pid_file).write_text(str(os.getpid()))
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # not a wait: a SIGTERM does not cut it short
            time.sleep(0.05)

    def pid(self) -> int:
        return os.getpid()


class SlowInit:
    """Writes its pid, then takes ``seconds`` to construct."""

    def __init__(self, pid_file: str, seconds: float) -> None:
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(seconds)

    def pid(self) -> int:
        return os.getpid()


class Parent:
    """Spawns a child actor, then may hold its own loop."""

    async def adopt(self) -> int:
        from rayless import actors
        from tests.integration.actor_classes import Counter

        cluster = await actors.connect()
        self.child = await cluster.spawn(Counter)
        return int(await self.child.add(1))

    async def hold(self, seconds: float) -> str:
        time.sleep(seconds)  # a long synchronous step on the actor's loop
        return "held"

    async def child_add(self) -> int:
        return int(await self.child.add(1))


class Closing:
    """Counts its calls and leaves a mark when its ``teardown`` runs."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.n = 0

    def step(self, seconds: float) -> int:
        time.sleep(seconds)
        self.n += 1
        return self.n

    def teardown(self) -> None:
        Path(self.mark).write_text(str(self.n))


class Pinger:
    """Calls another actor through a handle it was given (its own, new connection)."""

    async def ping(self, other: Any) -> str:
        return str(await other.ping())
