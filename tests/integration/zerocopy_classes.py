"""Actors of the same-host data plane tests (importable by actor processes)."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from rayless.actors import Actor
from rayless.store import Store


class Holder(Actor):
    """A client in its own process: holds zero-copy views, or hangs in the middle of a put."""

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self.views: list[Any] = []
        self.never = threading.Event()

    async def pid(self) -> int:
        return os.getpid()

    async def hold_view(self, partition: str, n: int) -> float:
        """Fetch ``n`` samples and keep them as views (their slots stay leased); their sum."""
        st = await Store.connect(self.store_name)
        meta = await st.get_meta(partition, ["x"], n, task="holder", timeout=10)
        td = await st.get(meta, zero_copy=True)
        self.views.append(td)
        return float(td["x"].sum())

    async def hang_in_put(self, n: int) -> None:
        """A put that reserves its slots and then never copies (killed meanwhile)."""
        from rayless.store.samehost import plane

        plane.INLINE_COPY_BYTES = -1  # the copy hangs in a thread, as a big one would
        st = await Store.connect(self.store_name)
        st._plane._copy_in = lambda *args: self.never.wait() or True  # type: ignore[method-assign]
        from tensordict import TensorDict

        await st.put(TensorDict({"x": torch.ones(n, 4)}, [n]), partition="p")
