"""What an upper layer waits for in an actor method's result before the result is sent.

The Ray layer (``rayless.ray.object_ref``) adds one hook: a Ray ref travels with its value,
so a result holding refs (the result itself, or one level inside a list, tuple or dict)
is sent once each is made. The wait runs on the actor's loop *after* the method has
returned: a ``def`` method's thread (and an ``async def`` one's concurrency slot) is free
for the next call meanwhile, so a method may return refs of calls queued on its own actor.
With no hook added, a result costs one empty-list check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["HOOKS", "ResultHook", "add_result_hook", "pending_waits"]


@dataclass(frozen=True)
class ResultHook:
    """What a result must wait for: ``pending(result)`` is None when nothing (decided without
    blocking, on any thread), else an awaitable to run on the actor's loop before the result
    is sent. Neither it nor the awaitable may raise for a result it has nothing to do with."""

    pending: Callable[[Any], Awaitable[None] | None]


HOOKS: list[ResultHook] = []


def add_result_hook(hook: ResultHook) -> None:
    """Run ``hook`` on every method result of this process from now on (once, however often
    it is added)."""
    if hook not in HOOKS:
        HOOKS.append(hook)


def pending_waits(result: Any) -> list[Awaitable[None]]:
    """What ``result`` waits for before it is sent, by every hook (an empty list: nothing)."""
    waits = []
    for hook in HOOKS:
        wait = hook.pending(result)
        if wait is not None:
            waits.append(wait)
    return waits
