"""What an upper layer does to an actor method's result before the result is sent.

The Ray layer (``rayless.ray.object_ref``) adds one hook: a Ray ref travels with its value,
so a result holding refs (the result itself, or one level inside a list, tuple or dict)
waits until each is made. A ``def`` method's result goes through ``blocking`` on the
method's worker thread, an ``async def`` one's through ``awaiting`` on the actor's loop.
With no hook added, a result costs one empty-list check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HOOKS", "ResultHook", "add_result_hook"]


@dataclass(frozen=True)
class ResultHook:
    """Two forms of one hook; neither may raise for a result it has nothing to do with."""

    blocking: Callable[[Any], None]  # on a worker thread: may block
    awaiting: Callable[[Any], Awaitable[None]]  # on the actor's loop: must not block


HOOKS: list[ResultHook] = []


def add_result_hook(hook: ResultHook) -> None:
    """Run ``hook`` on every method result of this process from now on (once, however often
    it is added)."""
    if hook not in HOOKS:
        HOOKS.append(hook)
