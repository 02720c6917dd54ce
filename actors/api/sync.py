"""The synchronous facade: the same verbs as :class:`~actors.Cluster` for plain threaded code.

``SyncCluster`` owns a :class:`~rayless.actors.api.portal.Portal` (an event loop in a daemon
thread); every verb runs there and blocks the calling thread until done (each with a
timeout). That loop becomes this process's *home loop*, so ``handle.method.call(x)`` and
``handle.method.remote(x)`` from any thread go through it too, and ``SyncStore`` uses it::

    with actors.Cluster.local_sync(nodes=2, gpus_per_node=4) as cluster:
        learner = cluster.spawn(Learner, gpus=1)
        loss = learner.step.call(batch)
        futures = [learner.step.remote(b) for b in batches]  # concurrent.futures
        done, pending = cluster.wait(futures, num_returns=1)
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from rayless.actors.api import portal as portals
from rayless.actors.api.handle import ActorHandle, _call, split_ready
from rayless.transport.errors import ClosedError, Timeout

T = TypeVar("T")
A = TypeVar("A")

if TYPE_CHECKING:
    from rayless.actors.api.cluster import Cluster
    from rayless.actors.control.messages import ActorPage, ClusterSummary

DEFAULT_TIMEOUT = 300.0


class SyncCluster:
    """A blocking wrapper around a :class:`Cluster`, driven by its own loop thread."""

    def __init__(self, portal: portals.Portal, cluster: Cluster) -> None:
        self.portal = portal
        self.cluster = cluster
        self._closed = False

    @classmethod
    def open(cls, opener: Callable[[], Awaitable[Cluster]], timeout: float) -> SyncCluster:
        """Run ``opener()`` (a Cluster's start or join) on a new loop thread; wrap its result.

        ``Cluster.local_sync`` and ``Cluster.connect_sync`` call this. Raises what
        ``opener`` raises (the loop thread is stopped then).
        """
        portal = portals.Portal("rayless-sync")
        try:
            cluster: Cluster = portal.run(opener(), timeout=timeout)
        except BaseException:
            portal.stop()
            raise
        portals.set_home_loop(portal.loop)
        return cls(portal, cluster)

    def run(self, aw: Awaitable[T], timeout: float | None = DEFAULT_TIMEOUT) -> T:
        """Run ``aw`` on this facade's loop and block until its result.

        Raises:
            ClosedError: the facade is closed.
            Timeout: no result within ``timeout``.
            RuntimeError: called from a thread that runs an event loop.
        """
        if self._closed:
            if isinstance(aw, Coroutine):
                aw.close()
            raise ClosedError("this sync cluster is closed")
        return self.portal.run(aw, timeout)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self._closed

    @property
    def address(self) -> str:
        """The head's address."""
        return self.cluster.address

    def spawn(self, cls: type[A], *args: Any, **kwargs: Any) -> ActorHandle[A]:
        """Start an actor and return its handle (arguments as ``Cluster.spawn``)."""
        return self.run(self.cluster.spawn(cls, *args, **kwargs))

    def kill(self, handle: ActorHandle[Any]) -> bool:
        """Kill the actor for good."""
        return bool(self.run(self.cluster.kill(handle)))

    def get_actor(self, name: str) -> ActorHandle[Any]:
        """The live actor called ``name``."""
        return self.run(self.cluster.get_actor(name))

    def nodes(self, *, actors: bool = True) -> list[dict[str, Any]]:
        """Every node with its resources and actors (as ``Cluster.nodes``)."""
        return self.run(self.cluster.nodes(actors=actors))

    def summary(self, limit: int | None = 100) -> ClusterSummary:
        """The cluster's totals and first nodes and actors (as ``Cluster.summary``)."""
        return self.run(self.cluster.summary(limit))

    def list_actors(self, limit: int | None = 100, offset: int = 0) -> ActorPage:
        """A page of the live actors (as ``Cluster.list_actors``)."""
        return self.run(self.cluster.list_actors(limit, offset))

    def timeline(self, path: str = "timeline.json", *, since: float | None = None) -> str:
        """Write the cluster's timeline to ``path`` (as ``Cluster.timeline``)."""
        return self.run(self.cluster.timeline(path, since=since))

    def submit(
        self, handle: ActorHandle[Any], method: str, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Start a call and return a ``concurrent.futures.Future`` of its result (the same as
        ``getattr(handle, method).remote(*args)`` from a thread)."""
        if self._closed:
            raise ClosedError("this sync cluster is closed")
        getattr(handle, method)  # AttributeError at once for a method the class lacks
        return self.portal.submit(_call(handle, method, args, kwargs))

    def wait(
        self,
        futures: Iterable[concurrent.futures.Future[Any]],
        num_returns: int = 1,
        timeout: float | None = None,
    ) -> tuple[list[concurrent.futures.Future[Any]], list[concurrent.futures.Future[Any]]]:
        """Like ``ray.wait``: (ready, not_ready) once ``num_returns`` are done or at timeout;
        ``ready`` holds at most ``num_returns``, the first done ones in the order given, and
        ``not_ready`` all the others (done or not), in the order given."""
        futs = list(futures)
        if not 1 <= num_returns <= max(1, len(futs)):
            raise ValueError(f"num_returns must be in 1..{len(futs)}, got {num_returns}")
        done: set[concurrent.futures.Future[Any]] = {f for f in futs if f.done()}
        pending = set(futs) - done
        deadline = None if timeout is None else _now() + timeout
        while len(done) < num_returns and pending:
            left = None if deadline is None else max(0.0, deadline - _now())
            if left == 0.0:
                break
            newly, pending = concurrent.futures.wait(
                pending, timeout=left, return_when=concurrent.futures.FIRST_COMPLETED
            )
            done |= newly
        return split_ready(futs, num_returns)

    def get(
        self,
        futures: Iterable[concurrent.futures.Future[Any]] | concurrent.futures.Future[Any],
        timeout: float | None = None,
    ) -> Any:
        """All results in order, or the first error at once (``ray.get``); a single future
        gives its result. ``timeout`` bounds the whole wait, not each future.

        Like ``ray.get``, a timeout cancels nothing: the calls go on (``future.cancel()``
        cancels one, in its actor too).

        Raises:
            Timeout: not all results arrived within ``timeout`` seconds.
        """
        if isinstance(futures, concurrent.futures.Future):
            return self.get([futures], timeout)[0]
        futs = list(futures)
        _, pending = concurrent.futures.wait(
            futs, timeout=timeout, return_when=concurrent.futures.FIRST_EXCEPTION
        )
        for f in futs:  # an error raised at once, as ray.get: the others are not waited for
            error = f.exception() if f.done() and not f.cancelled() else None
            if error is not None:
                raise error  # (a method's own TimeoutError as itself)
        if pending:
            raise Timeout(f"{len(pending)} of {len(futs)} results did not arrive within {timeout}s")
        return [f.result() for f in futs]

    def close(self) -> None:
        """End the session (and a local cluster) and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.portal.run(self.cluster.aclose(), timeout=120)
        finally:
            if portals._home is self.portal.loop:
                portals.set_home_loop(None)
            self.portal.stop()

    def __enter__(self) -> SyncCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _now() -> float:
    return time.monotonic()
