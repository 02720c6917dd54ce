"""Waiting in tests: every wait has a deadline and says what it waited for.

``await wait_until(pred, timeout=..., what="...")`` polls ``pred`` (a function returning a
value or an awaitable) until its value is truthy and returns that value; past the deadline it
fails with :class:`WaitTimeout`, naming ``what`` and the last value seen. ``wait_until_sync``
is the same for plain (threaded, subprocess-driving) test code; ``eventually`` answers
whether the condition came true in time (for measuring code that records a miss, and
``eventually_sync`` likewise).

Every timeout scales with ``RAYLESS_TEST_TIMEOUT_SCALE`` (default 1; a slow CI may set 3), and
so does pytest-timeout's per-test limit (see tests/conftest.py). Scale a deadline of your own
with :func:`scaled`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = [
    "SCALE_ENV",
    "WaitTimeout",
    "eventually",
    "scaled",
    "timeout_scale",
    "wait_until",
    "wait_until_sync",
]

SCALE_ENV = "RAYLESS_TEST_TIMEOUT_SCALE"

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A wait in a test passed its deadline (an AssertionError: the test fails, not errors)."""


def timeout_scale() -> float:
    """The factor every test timeout is multiplied by (``RAYLESS_TEST_TIMEOUT_SCALE``).

    Raises ValueError for a value that is not a positive number."""
    raw = os.environ.get(SCALE_ENV, "1") or "1"
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV}={raw!r} is not a number") from None
    if not scale > 0:
        raise ValueError(f"{SCALE_ENV}={raw!r} must be > 0")
    return scale


def scaled(seconds: float) -> float:
    """``seconds`` times the test timeout scale."""
    return seconds * timeout_scale()


def _fail(what: str, timeout: float, last: Any) -> WaitTimeout:
    shown = repr(last)
    if len(shown) > 2000:
        shown = shown[:2000] + "..."
    return WaitTimeout(f"timed out after {timeout:g} s waiting for {what}; last value: {shown}")


async def wait_until(
    pred: Callable[[], T | Awaitable[T]],
    timeout: float,
    what: str,
    *,
    interval: float = 0.01,
) -> T:
    """Poll ``pred()`` (awaited if it returns an awaitable) every ``interval`` s until it is
    truthy and return its value. Raises WaitTimeout (with ``what`` and the last value) after
    ``scaled(timeout)`` s; exceptions of ``pred`` propagate."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = pred()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise _fail(what, limit, value)
        await asyncio.sleep(interval)


def wait_until_sync(
    pred: Callable[[], T],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
) -> T:
    """:func:`wait_until` for synchronous code: blocks this thread between polls."""
    limit = scaled(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _fail(what, limit, value)
        time.sleep(interval)


async def eventually(
    pred: Callable[[], Any], *, timeout: float, interval: float = 0.01, what: str = "a condition"
) -> bool:
    """Whether ``pred()`` came true within ``scaled(timeout)`` s (:func:`wait_until`, with the
    timeout answered False instead of raised)."""
    try:
        await wait_until(pred, timeout=timeout, what=what, interval=interval)
    except WaitTimeout:
        return False
    return True


def eventually_sync(
    pred: Callable[[], Any], *, timeout: float, interval: float = 0.05, what: str = "a condition"
) -> bool:
    """:func:`eventually` for synchronous code."""
    try:
        wait_until_sync(pred, timeout=timeout, what=what, interval=interval)
    except WaitTimeout:
        return False
    return True
