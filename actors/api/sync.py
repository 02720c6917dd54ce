"""The synchronous facade: the same verbs as :class:`~actors.Cluster` for plain threaded code.

``SyncCluster`` owns an event loop in a daemon thread; every verb runs there and blocks the
calling thread until done (each with a timeout). That loop becomes this process's *home
loop*, so ``handle.method.call(x)`` from any thread goes through it too::

    with actors.Cluster.local_sync(nodes=2, gpus_per_node=4) as cluster:
        learner = cluster.spawn(Learner, gpus=1)
        loss = learner.step.call(batch)
        futures = [cluster.submit(learner, "step", b) for b in batches]
        done, pending = cluster.wait(futures, num_returns=1)
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from rayless.actors.api import runtime
from rayless.actors.api.handle import ActorHandle, _call
from rayless.transport.errors import Timeout

if TYPE_CHECKING:
    from rayless.actors.api.cluster import Cluster

DEFAULT_TIMEOUT = 300.0


class SyncCluster:
    """A blocking wrapper around a :class:`Cluster`, driven by its own loop thread."""

    def __init__(self, portal: runtime.LoopThread, cluster: Cluster) -> None:
        self._portal = portal
        self.cluster = cluster
        self._closed = False

    @classmethod
    def open(
        cls, opener: Callable[[], Coroutine[Any, Any, Cluster]], timeout: float
    ) -> SyncCluster:
        """Run ``opener()`` (a Cluster's start or join) on a new loop thread; wrap its result.

        ``Cluster.local_sync`` and ``Cluster.connect_sync`` call this. Raises what
        ``opener`` raises (the loop thread is stopped then).
        """
        portal = runtime.LoopThread("rayless-sync")
        try:
            cluster: Cluster = portal.run(opener(), timeout=timeout)
        except BaseException:
            portal.stop()
            raise
        runtime.set_home_loop(portal.loop)
        return cls(portal, cluster)

    def _run(self, coro: Any, timeout: float | None = DEFAULT_TIMEOUT) -> Any:
        return self._portal.run(coro, timeout)

    @property
    def address(self) -> str:
        """The head's address."""
        return self.cluster.address

    def spawn(self, cls: type, *args: Any, **kwargs: Any) -> ActorHandle:
        """Start an actor and return its handle (arguments as ``Cluster.spawn``)."""
        return self._run(self.cluster.spawn(cls, *args, **kwargs))

    def kill(self, handle: ActorHandle) -> bool:
        """Kill the actor for good."""
        return bool(self._run(self.cluster.kill(handle)))

    def get_actor(self, name: str) -> ActorHandle:
        """The live actor called ``name``."""
        return self._run(self.cluster.get_actor(name))

    def nodes(self) -> list[dict[str, Any]]:
        """Every node with its resources and actors."""
        return self._run(self.cluster.nodes())

    def submit(
        self, handle: ActorHandle, method: str, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        """Start a call and return a ``concurrent.futures.Future`` of its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(
            _call(handle, method, args, kwargs), self._portal.loop
        )

    def wait(
        self,
        futures: Iterable[concurrent.futures.Future[Any]],
        num_returns: int = 1,
        timeout: float | None = None,
    ) -> tuple[list[concurrent.futures.Future[Any]], list[concurrent.futures.Future[Any]]]:
        """Like ``ray.wait``: (done, pending) once ``num_returns`` are done or at timeout."""
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
        return [f for f in futs if f in done], [f for f in futs if f not in done]

    def get(
        self, futures: list[concurrent.futures.Future[Any]], timeout: float | None = None
    ) -> list[Any]:
        """All results in order (the first error is raised).

        Raises:
            Timeout: not all results arrived within ``timeout``.
        """
        try:
            return [f.result(timeout) for f in futures]
        except concurrent.futures.TimeoutError:
            raise Timeout(f"not all results arrived within {timeout}s") from None

    def close(self) -> None:
        """End the session (and a local cluster) and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self.cluster.aclose(), timeout=120)
        finally:
            if runtime._home is self._portal.loop:
                runtime.set_home_loop(None)
            self._portal.stop()

    def __enter__(self) -> SyncCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _now() -> float:
    import time

    return time.monotonic()
