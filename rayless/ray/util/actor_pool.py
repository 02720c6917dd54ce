"""``ray.util.ActorPool``: a fixed set of actors that work through submitted values, each
actor given one value at a time, results handed back in submission order or as they come.

Written on ``rayless.ray``'s own ``wait`` and ``get``; the same methods, arguments, results
and errors as Ray's (``StopIteration`` with nothing left, ``TimeoutError`` past a timeout,
``ValueError`` for ``get_next`` after ``get_next_unordered`` and for pushing a pool's own
actor). An actor whose call raised ``ActorDiedError`` leaves the pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["ActorPool"]

V = TypeVar("V")
Submit = Callable[[Any, V], Any]  # (actor, value) -> an ObjectRef (or a list of them)
_TIMED_OUT = "Timed out waiting for result"


def _key(ref: Any) -> Any:
    """A hashable key for what a submit function returned (a ref, or a list of refs)."""
    return tuple(ref) if isinstance(ref, list) else ref


class ActorPool:
    """Run ``fn(actor, value)`` for submitted values on whichever actor is idle.

    >>> pool = ActorPool([Worker.remote(), Worker.remote()])
    >>> list(pool.map(lambda a, v: a.double.remote(v), [1, 2, 3]))
    [2, 4, 6]
    """

    def __init__(self, actors: Iterable[Any]) -> None:
        self._idle_actors: list[Any] = list(actors)
        self._future_to_actor: dict[Any, tuple[int, Any]] = {}  # key -> (index, actor)
        self._index_to_future: dict[int, Any] = {}
        self._next_task_index = 0
        self._next_return_index = 0
        self._pending_submits: deque[tuple[Submit[Any], Any]] = deque()

    def map(self, fn: Submit[V], values: Iterable[V]) -> Iterator[Any]:
        """Submit every value, then an iterator of the results in submission order.

        Earlier submissions still unread are dropped first (as in Ray: a finished one is
        read, and raises if it failed; an unfinished one is ignored).
        """
        while self.has_next():
            try:
                self.get_next(timeout=0, ignore_if_timedout=True)
            except TimeoutError:
                pass
        for v in values:
            self.submit(fn, v)
        return self._results(ordered=True)

    def map_unordered(self, fn: Submit[V], values: Iterable[V]) -> Iterator[Any]:
        """Like :meth:`map`, the results in the order they complete (earlier submissions
        still unread are waited for and dropped first, as in Ray)."""
        while self.has_next():
            try:
                self.get_next_unordered(timeout=0)
            except TimeoutError:
                pass
        for v in values:
            self.submit(fn, v)
        return self._results(ordered=False)

    def _results(self, ordered: bool) -> Iterator[Any]:
        while self.has_next():
            yield self.get_next() if ordered else self.get_next_unordered()

    def submit(self, fn: Submit[V], value: V) -> None:
        """Start ``fn(actor, value)`` on an idle actor, or queue it until one is free."""
        if not self._idle_actors:
            self._pending_submits.append((fn, value))
            return
        actor = self._idle_actors.pop()
        ref = fn(actor, value)
        self._future_to_actor[_key(ref)] = (self._next_task_index, actor)
        self._index_to_future[self._next_task_index] = ref
        self._next_task_index += 1

    def has_next(self) -> bool:
        """Whether a submitted value's result is still to be read."""
        return bool(self._future_to_actor) or bool(self._pending_submits)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order, waiting at most ``timeout`` seconds.

        Raises:
            StopIteration: nothing is left to read.
            ValueError: after :meth:`get_next_unordered` skipped results.
            TimeoutError: no result within ``timeout`` (with ``ignore_if_timedout`` that
                value is dropped and its actor goes back to the pool).
            Whatever the call raised (its actor leaves the pool on ``ActorDiedError``).
        """
        from rayless import ray

        if not self.has_next():
            raise StopIteration("No more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("It is not allowed to call get_next() after get_next_unordered().")
        ref = self._index_to_future[self._next_return_index]
        timed_out = False
        if timeout is not None:
            ready, _ = ray.wait([ref], timeout=timeout)
            if not ready:
                if not ignore_if_timedout:
                    raise TimeoutError(_TIMED_OUT)
                timed_out = True
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        _, actor = self._future_to_actor.pop(_key(ref))
        if timed_out:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMED_OUT}. The task {ref} has been ignored.")
        return self._get_result(ref, actor)

    def get_next_unordered(
        self, timeout: float | None = None, ignore_if_timedout: bool = False
    ) -> Any:
        """Whichever result comes first, waiting at most ``timeout`` seconds.

        Raises:
            StopIteration: nothing is left to read.
            TimeoutError: no result within ``timeout``.
            Whatever the call raised (its actor leaves the pool on ``ActorDiedError``).
        """
        from rayless import ray

        if not self.has_next():
            raise StopIteration("No more results to get")
        ready, _ = ray.wait(list(self._future_to_actor), num_returns=1, timeout=timeout)
        if not ready:
            if not ignore_if_timedout:
                raise TimeoutError(_TIMED_OUT)
            # Ray drops the oldest submission it waited on
            ref = next(iter(self._future_to_actor))
        else:
            ref = ready[0]
        index, actor = self._future_to_actor.pop(ref)
        del self._index_to_future[index]
        self._next_return_index = max(self._next_return_index, index + 1)
        if not ready:
            self._return_actor(actor)
            raise TimeoutError(f"{_TIMED_OUT}. The task {ref} has been ignored.")
        return self._get_result(ref, actor)

    def _get_result(self, ref: Any, actor: Any) -> Any:
        from rayless import ray

        alive = True
        try:
            return ray.get(ref)
        except ray.exceptions.ActorDiedError:
            alive = False
            raise
        finally:
            self._return_actor(actor, alive)

    def _return_actor(self, actor: Any, alive: bool = True) -> None:
        """``actor`` is free again (a dead one is dropped); start a queued submit on it."""
        if alive:
            self._idle_actors.append(actor)
        if self._pending_submits and self._idle_actors:
            self.submit(*self._pending_submits.popleft())

    def has_free(self) -> bool:
        """Whether an actor is idle and no submit waits for one."""
        return bool(self._idle_actors) and not self._pending_submits

    def pop_idle(self) -> Any | None:
        """Take an idle actor out of the pool (None if none is free)."""
        return self._idle_actors.pop() if self.has_free() else None

    def push(self, actor: Any) -> None:
        """Add ``actor`` to the pool (it takes a queued submit at once, if any).

        Raises:
            ValueError: the actor is in this pool already.
        """
        busy = [a for _, a in self._future_to_actor.values()]
        if actor in self._idle_actors or actor in busy:
            raise ValueError("Actor already belongs to current ActorPool")
        self._return_actor(actor)
