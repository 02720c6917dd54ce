"""Ray's actor lifetime: an actor this process started ends once its handle is gone.

In Ray, a non-detached actor is terminated when every handle to it has gone out of scope,
after the calls already submitted to it. A trainer that starts an evaluator per epoch, or a
helper actor inside a function, relies on that to give back its CPUs and GPUs. Here, the
handle that ``ActorClass.remote()`` returns is owned (:func:`own`). Once Python has
collected it, the session waits for the answers to the calls made through it, then sends the
actor ``__ray_terminate__`` and gives back its placement-group bundle; a streaming call
counts as answered once its generator has ended, been closed or dropped. Ray's
``ray.kill`` stays the way to end an actor at once. A start that finds no room while such
actors are still ending waits for them (:func:`ended`) and tries again, as Ray's pending
actor would wait for the resources they free.

Nothing runs inside the garbage collector: a collected handle's weak reference is appended
to a deque by the reference's C-level callback (``deque.append`` runs no Python code), and
the session's loop drains that deque at safe points: a tick every :data:`TICK` seconds
while owned handles exist, and before an actor start waits for room.

Ray counts handles across processes. This process cannot see handles held elsewhere, so an
actor whose handle left this process is left running, as if it were shared: a handle passed
as an argument of a task or actor call, inside a value, or through ``ray.put``. It then
ends with its owner, as every actor does. Named actors are not ended by scope either: a
program that starts one and later finds it with ``ray.get_actor`` keeps working
(docs/moving-from-ray.md lists both differences).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayless.ray._worker import Session

__all__ = ["END_WAIT", "TICK", "Scope", "ended", "own"]

END_WAIT = 300.0  # how long a start that found no room waits for actors still ending
TICK = 0.5  # seconds between the loop's looks at collected handles while any are owned

# Appended to by the garbage collector (the weak references' callback is this deque's C
# `append`); drained on a session's loop.
_COLLECTED: collections.deque[weakref.ref[Any]] = collections.deque()
# id(weak reference) -> (the reference, its session, its scope): keeps each reference alive
# until it is drained (a reference collected first would never call back).
_OWNED: dict[int, tuple[weakref.ref[Any], Session, Scope]] = {}
# id() -> the sessions whose loop has a tick scheduled (held, so that an id is not reused by
# a later session while its entry stands; a closed session's entry is dropped by `own`)
_TICKING: dict[int, Session] = {}
_ENDING: set[asyncio.Task[None]] = set()


class Scope:
    """The part of an owned handle its end needs (never the handle itself): how the actor
    starts, whether the handle left this process, and the calls still unanswered."""

    __slots__ = ("calls", "escaped", "pending")

    def __init__(self, pending: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
        self.pending = pending
        self.escaped = False  # the handle left this process: it is kept
        self.calls: set[Any] = set()

    def track(self, fut: asyncio.Future[Any] | concurrent.futures.Future[Any]) -> None:
        """A call made through the handle: the actor ends only after it is answered (each
        call travels in its own task, so a later terminate could otherwise overtake it)."""
        self.calls.add(fut)
        fut.add_done_callback(self.calls.discard)


def own(s: Session, handle: object, pending: Any) -> Scope:
    """Have ``s`` end the actor that ``pending`` starts once ``handle`` is collected (unless
    the handle left this process first: :attr:`Scope.escaped`). Any thread."""
    scope = Scope(pending)
    ref = weakref.ref(handle, _COLLECTED.append)
    _OWNED[id(ref)] = (ref, s, scope)
    if _TICKING.get(id(s)) is not s:
        for key, session in list(_TICKING.items()):
            if session.loop.is_closed():  # its tick will never run
                _TICKING.pop(key, None)
        _TICKING[id(s)] = s
        with contextlib.suppress(RuntimeError):  # the session's loop is closed
            s.loop.call_soon_threadsafe(_tick, s)
    return scope


async def ended(s: Session, timeout: float = END_WAIT) -> bool:
    """Wait (on ``s``'s loop, at most ``timeout`` s) until one of the actors this process is
    ending because their handles are gone (collected ones included) has ended; whether one
    did."""
    _drain(s)
    ending = [t for t in _ENDING if not t.done()]
    if not ending or timeout <= 0:
        return False
    done, _ = await asyncio.wait(ending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    return bool(done)


def _tick(s: Session) -> None:
    """On ``s``'s loop: end what was collected; look again in :data:`TICK` s while handles
    are owned."""
    _drain(s)
    if not _OWNED:  # (an old session's handle still alive keeps the tick: a deque's check)
        _TICKING.pop(id(s), None)
        if not _OWNED or _TICKING.get(id(s)) is s:
            return
        _TICKING[id(s)] = s  # owned meanwhile by another thread: keep looking
    s.loop.call_later(TICK, _tick, s)


def _drain(s: Session) -> None:
    """On ``s``'s loop: start ending the actors whose handles were collected."""
    while _COLLECTED:
        try:
            ref = _COLLECTED.popleft()
        except IndexError:  # drained by another session's loop meanwhile
            return
        entry = _OWNED.pop(id(ref), None)
        if entry is None:
            continue
        _, session, scope = entry
        if scope.escaped:
            continue
        if session is s:
            _start(s, scope)
        else:  # another session's handle: its own loop ends it (a closed loop: nothing to end)
            with contextlib.suppress(RuntimeError):
                session.loop.call_soon_threadsafe(_start, session, scope)


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
    if scope.escaped:  # sent while it was starting or answering
        return
    with contextlib.suppress(Exception):  # already gone, killed, or the cluster closed
        await inner.__ray_terminate__()
    where = s.placements.pop(inner.actor_id, None)
    if where is not None:
        where.release()
