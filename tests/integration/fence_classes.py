"""Actors of the writer-fence tests (importable by actor processes): same-host clients in
processes of their own, killed with SIGKILL in the middle of a put."""

from __future__ import annotations

import os
import threading

import torch
from tensordict import TensorDict

from rayless.actors import Actor
from rayless.store import Store


class Writer(Actor):
    """A same-host client that puts ``rows`` rows of 4 KiB each into partition ``p``."""

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self.never = threading.Event()

    async def pid(self) -> int:
        return os.getpid()

    async def put(self, rows: int, value: float, timeout: float) -> None:
        """A put that waits up to ``timeout`` s for room (killed meanwhile, or it finishes)."""
        st = await Store.connect(self.store_name)
        td = TensorDict({"x": torch.full((rows, 1024), value)}, [rows])
        await st.put(td, partition="p", timeout=timeout)

    async def hang_in_put(self, rows: int) -> None:
        """A put that reserves its slots and then never copies (killed meanwhile)."""
        st = await Store.connect(self.store_name)
        st._plane._copy_in = lambda *args: self.never.wait() or True  # type: ignore[method-assign]
        td = TensorDict({"x": torch.ones(rows, 1024)}, [rows])
        await st.put(td, partition="p")
