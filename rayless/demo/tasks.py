"""Awaiting a step's calls together: all of them, or none left running after a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

__all__ = ["first_error"]


async def first_error(*aws: Awaitable[Any]) -> list[Any]:
    """Await all; on the first failure cancel the others and raise it (a dead worker ends
    the iteration at once instead of after the other stages' timeouts)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
