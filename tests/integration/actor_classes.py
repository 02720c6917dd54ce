"""Actor classes for the integration tests (importable by the actor processes)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from rayless.actors import Actor, ActorHandle

if TYPE_CHECKING:  # torch is imported where used: a cluster of these actors need not import it
    import torch


class Counter(Actor):
    def __init__(self, start: int = 0, *, step: int = 1) -> None:
        self.n = start
        self.step = step
        self.setups = 0

    async def setup(self) -> None:
        self.setups += 1
        print(f"counter ready at {self.n}", flush=True)

    def add(self, k: int | None = None) -> int:
        self.n += self.step if k is None else k
        return self.n

    async def aadd(self, k: int) -> int:
        self.n += k
        return self.n

    def get_setups(self) -> int:
        return self.setups

    def pid(self) -> int:
        return os.getpid()

    def env(self, *names: str) -> dict[str, str | None]:
        return {n: os.environ.get(n) for n in names}

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def fail_key(self) -> None:
        raise KeyError("missing")

    async def sleep(self, seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "slept"

    def block(self, seconds: float) -> str:
        time.sleep(seconds)
        return "blocked"

    def tensor_sum(self, t: torch.Tensor) -> float:
        return float(t.sum())

    def make_tensor(self, n: int) -> torch.Tensor:
        import torch

        return torch.arange(n, dtype=torch.float32)

    def _private(self) -> str:
        return "never"


class Concurrency(Actor):
    """Records how many calls run at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.lock = threading.Lock()

    def _enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def _leave(self) -> None:
        with self.lock:
            self.now -= 1

    def sync_work(self, seconds: float) -> int:
        self._enter()
        time.sleep(seconds)
        self._leave()
        return threading.get_ident()

    async def async_work(self, seconds: float) -> None:
        self._enter()
        await asyncio.sleep(seconds)
        self._leave()

    def reset(self) -> None:
        self.peak = 0

    def get_peak(self) -> int:
        return self.peak


class Relay(Actor):
    """Calls another actor through a handle it was given."""

    def __init__(self, target: ActorHandle | None = None) -> None:
        self.target = target

    async def forward(self, k: int) -> Any:
        assert self.target is not None
        return await self.target.add(k)

    def forward_sync(self, k: int) -> Any:
        assert self.target is not None
        return self.target.add.call(k, timeout=30)

    async def via(self, handle: ActorHandle, k: int) -> Any:
        return await handle.add(k)

    def me(self, handle: ActorHandle) -> ActorHandle:
        return handle

    async def call_blocking(self, k: int) -> Any:
        """``.call()`` on the actor's own event loop: refused (it would block the loop)."""
        assert self.target is not None
        return self.target.add.call(k, timeout=5)

    def target_methods(self) -> list[str]:
        """What the travelled handle knows, and how it refuses a typo."""
        assert self.target is not None
        try:
            self.target.typo  # noqa: B018
        except AttributeError as exc:
            return [*dir(self.target), str(exc)]
        return []


class Shapeshifter(Actor):
    """A class whose methods differ where it is loaded: the actor process's view counts."""

    def everywhere(self) -> str:
        return "here"

    # Loaded in a rayless process (an actor, or the fork template that preloads actor modules
    # for it), not in the test driver. Not "pytest not in sys.modules": the template has pytest
    # once it preloaded a test module whose actor class ran before (xdist orders vary).
    if getattr(sys.modules["__main__"].__spec__, "name", "").startswith("rayless.actors."):

        def only_in_the_actor(self) -> str:
            return "there"


class BadSetup(Actor):
    async def setup(self) -> None:
        raise RuntimeError("setup exploded")


class Printer(Actor):
    def say(self, text: str) -> None:
        print(text, flush=True)


class Threads(Actor):
    """Reports torch's intra-op thread count on the loop thread and on the worker thread."""

    async def on_loop(self) -> int:
        import torch

        return torch.get_num_threads()

    def in_worker(self) -> int:
        import torch

        return torch.get_num_threads()


class Importer(Actor):
    """Imports a module by name where it runs (what a spawn's packages shipped)."""

    def value(self, module: str, attr: str) -> object:
        import importlib

        return getattr(importlib.import_module(module), attr)

    def cwd(self) -> str:
        return os.getcwd()

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()
