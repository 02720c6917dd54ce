"""SyncStore: the blocking facade over :class:`~store.client.Store` for plain threaded code.

Every call runs on the process's home loop (``actors.runtime.run_sync``: the sync cluster's
loop thread in a driver, the actor's loop thread elsewhere) and blocks until done::

    with actors.Cluster.local_sync(nodes=2) as cluster:
        st = SyncStore.create(cluster, num_units=2)
        meta = st.put(td, partition="train")
        td = st.get(st.get_meta("train", ["obs"], batch_size=8, task="learner"))
"""

from __future__ import annotations

from typing import Any

from rayless.actors.api.runtime import run_sync
from rayless.store.client import DEFAULT_NAME, Store

__all__ = ["SyncStore"]

DEFAULT_TIMEOUT = 300.0


class SyncStore:
    """Blocking versions of every :class:`Store` method (same names and arguments)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @classmethod
    def create(cls, cluster: Any, *args: Any, **kwargs: Any) -> SyncStore:
        """Create a store on ``cluster`` (a Cluster or a SyncCluster); see ``Store.create``."""
        inner = getattr(cluster, "cluster", cluster)
        return cls(run_sync(Store.create(inner, *args, **kwargs), DEFAULT_TIMEOUT))

    @classmethod
    def connect(cls, name: str = DEFAULT_NAME, cluster: Any = None) -> SyncStore:
        """Connect to a running store by its controller's name; see ``Store.connect``."""
        inner = getattr(cluster, "cluster", cluster)
        return cls(run_sync(Store.connect(name, inner), DEFAULT_TIMEOUT))

    @property
    def store_id(self) -> str:
        """The store's id."""
        return self.store.store_id

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if not callable(method) or name.startswith("_"):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return run_sync(method(*args, **kwargs), DEFAULT_TIMEOUT)

        call.__name__ = name
        call.__doc__ = method.__doc__
        return call
