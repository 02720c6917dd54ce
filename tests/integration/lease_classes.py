"""Actors of the lease tests (importable by actor processes): a same-host client that puts
once and keeps the lease of its next put, killed with SIGKILL afterwards."""

from __future__ import annotations

import os

import torch
from tensordict import TensorDict

from rayless.actors import Actor
from rayless.store import Store


class LeaseHolder(Actor):
    """A client of store ``store_name`` that put ``rows`` rows into ``partition``."""

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name
        self.store: Store | None = None

    async def pid(self) -> int:
        return os.getpid()

    async def put_once(self, partition: str, rows: int) -> int:
        """Put ``rows`` rows (the client then leases its next put); returns the leased count
        it sees on the controller."""
        self.store = await Store.connect(self.store_name)
        await self.store.put(TensorDict({"x": torch.ones(rows, 8)}, [rows]), partition)
        return int((await self.store.stats())["leased"])
