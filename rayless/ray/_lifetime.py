"""Ray's actor lifetime: an actor this process started ends once its handle is gone.

In Ray, a non-detached actor is terminated when every handle to it has gone out of scope,
after the calls already submitted to it. A trainer that starts an evaluator per epoch, or a
helper actor inside a function, relies on that to give back its CPUs and GPUs. Here, the
handle that ``ActorClass.remote()`` returns carries a :class:`Scope`. When Python collects
that handle, the session waits for the answers to the calls made through it, then sends the
actor ``__ray_terminate__`` and gives back its placement-group bundle. A handle that started
a streaming call is kept (its stream's later steps would find the actor gone). Ray's
``ray.kill`` stays the way to end an actor at once. A start that finds no room while such
actors are still ending waits for them (:func:`ended`) and tries again, as Ray's pending
actor would wait for the resources they free.

Ray counts handles across processes. This process cannot see handles held elsewhere, so an
actor whose handle left this process is left running, as if it were shared: a handle passed
as an argument of a task or actor call, inside a value, or through ``ray.put``. It then
ends with its owner, as every actor does. Named actors are not ended by scope either: a
program that starts one and later finds it with ``ray.get_actor`` keeps working
(docs/moving-from-ray.md lists both differences).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayless.ray._worker import Session

__all__ = ["END_WAIT", "Scope", "ended", "own"]

END_WAIT = 300.0  # how long a start that found no room waits for actors still ending
_ENDING: set[asyncio.Task[None]] = set()


class Scope:
    """The part of an owned handle its finalizer needs (never the handle itself): how the
    actor starts, whether the handle left this process, and the calls still unanswered."""

    __slots__ = ("calls", "escaped", "pending")

    def __init__(self, pending: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
        self.pending = pending
        self.escaped = False  # the handle left this process (or streams): it is kept
        self.calls: set[Any] = set()

    def track(self, fut: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
        """A call made through the handle: the actor ends only after it is answered (each
        call travels in its own task, so a later terminate could otherwise overtake it)."""
        self.calls.add(fut)
        fut.add_done_callback(self.calls.discard)


def own(s: Session, handle: object, pending: Any) -> Scope:
    """Have ``s`` end the actor that ``pending`` starts once ``handle`` is collected (unless
    the handle left this process first: :attr:`Scope.escaped`)."""
    scope = Scope(pending)
    weakref.finalize(handle, _collected, s, scope).atexit = False
    return scope


async def ended(timeout: float = END_WAIT) -> bool:
    """Wait (on the session's loop, at most ``timeout`` s) for the actors this process is
    ending because their handles are gone; whether there were any."""
    ending = [t for t in _ENDING if not t.done()]
    if not ending:
        return False
    await asyncio.wait(ending, timeout=timeout)
    return True


def _collected(s: Session, scope: Scope) -> None:
    """The handle is gone (any thread, inside the garbage collector): schedule the end."""
    if scope.escaped or sys.is_finalizing():
        return
    with contextlib.suppress(RuntimeError):  # the session's loop is closed: nothing to end
        s.loop.call_soon_threadsafe(_start, s, scope)


def _start(s: Session, scope: Scope) -> None:
    task = s.loop.create_task(_end(s, scope))
    _ENDING.add(task)
    task.add_done_callback(_ENDING.discard)


async def _end(s: Session, scope: Scope) -> None:
    pending = scope.pending
    try:
        if isinstance(pending, concurrent.futures.Future):
            inner = await asyncio.wrap_future(pending)
        else:
            inner = await pending
    except BaseException:  # it never started: nothing to end
        return
    calls = [
        asyncio.wrap_future(c) if isinstance(c, concurrent.futures.Future) else c
        for c in list(scope.calls)
    ]
    if calls:
        await asyncio.wait(calls)
    if scope.escaped:  # sent (or streaming) while it was starting or answering
        return
    with contextlib.suppress(Exception):  # already gone, killed, or the cluster closed
        await inner.__ray_terminate__()
    where = s.placements.pop(inner.actor_id, None)
    if where is not None:
        where.release()
