"""Actors of the streaming tests (importable by actor processes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from rayless.actors import Actor

if TYPE_CHECKING:  # torch is imported where used: a cluster of these actors need not import it
    import torch


class Streamer(Actor):
    """Generator methods of every kind, counting what they produced and closed."""

    def __init__(self) -> None:
        self.produced = 0
        self.finalized = 0

    def count(self, n: int) -> Iterator[int]:
        yield from range(n)

    async def acount(self, n: int) -> AsyncIterator[int]:
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    def forever(self) -> Iterator[int]:
        try:
            while True:
                self.produced += 1
                yield self.produced
        finally:
            self.finalized += 1

    async def aforever(self) -> AsyncIterator[int]:
        try:
            while True:
                self.produced += 1
                yield self.produced
        finally:
            self.finalized += 1

    def fails_after(self, n: int) -> Iterator[int]:
        yield from range(n)
        raise ValueError(f"bad item {n}")

    def leaks_stop_iteration(self) -> Iterator[int]:
        yield 1
        next(iter([]))  # PEP 479: a RuntimeError in a generator

    def tensors(self, n: int) -> Iterator[torch.Tensor]:
        import torch

        for i in range(n):
            yield torch.full((1024,), float(i))

    def stats(self) -> tuple[int, int]:
        return self.produced, self.finalized

    def reset(self) -> None:
        self.produced = self.finalized = 0

    def plain(self) -> str:
        return "plain"
