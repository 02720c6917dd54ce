"""SyncStore: the blocking face of :class:`~rayless.store.client.store.Store` for plain threaded
code.

It shares the actors layer's one sync mechanism (``rayless.actors.api.portal``): given a
``SyncCluster`` every call runs on that facade's portal; otherwise on the process's home loop
(the actor's own loop inside an actor, whose sync methods run in a worker thread). Each method
blocks until done and has the same name, arguments and errors as its ``Store`` method::

    with actors.Cluster.local_sync(nodes=2) as cluster:
        with SyncStore.create(cluster, num_units=2) as st:
            meta = st.put(td, partition="train")
            td = st.get(st.get_meta("train", ["obs"], batch_size=8, task="learner"))

Calling it from a thread that runs an event loop raises RuntimeError (use ``Store`` there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tensordict import TensorDict, TensorDictBase

from rayless.actors import ActorHandle, Cluster
from rayless.actors.api.portal import run_sync
from rayless.actors.api.sync import SyncCluster
from rayless.store.client.checkpoint import Restored
from rayless.store.client.store import DEFAULT_NAME, PUT_TIMEOUT, KVBatchMeta, Store
from rayless.store.controller.fetches import check_timeout
from rayless.store.data.meta import BatchMeta

__all__ = ["SyncStore"]

T = TypeVar("T")
DEFAULT_TIMEOUT = 300.0
SLACK = 30.0  # beyond a call's own timeout, for the round trips around it


def _split(cluster: Cluster | SyncCluster) -> tuple[Cluster, SyncCluster | None]:
    if isinstance(cluster, SyncCluster):
        return cluster.cluster, cluster
    return cluster, None


def _block(sync: SyncCluster | None, aw: Awaitable[T], timeout: float | None) -> T:
    return sync.run(aw, timeout) if sync is not None else run_sync(aw, timeout)


class SyncStore:
    """Blocking versions of every :class:`Store` method (same names, arguments, errors).

    A context manager: leaving ``with`` runs :meth:`close` (``Store.aclose``).
    """

    def __init__(self, store: Store, sync: SyncCluster | None = None) -> None:
        self.store = store
        self._sync = sync

    def _run(self, aw: Awaitable[T], timeout: float | None = DEFAULT_TIMEOUT) -> T:
        return _block(self._sync, aw, timeout)

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def create(cls, cluster: Cluster | SyncCluster, *args: Any, **kwargs: Any) -> SyncStore:
        """Create a store on ``cluster`` (arguments and errors as ``Store.create``)."""
        inner, sync = _split(cluster)
        return cls(_block(sync, Store.create(inner, *args, **kwargs), DEFAULT_TIMEOUT), sync)

    @classmethod
    def connect(
        cls, name: str = DEFAULT_NAME, cluster: Cluster | SyncCluster | None = None
    ) -> SyncStore:
        """A client of a running store by its controller's name (see ``Store.connect``)."""
        inner, sync = _split(cluster) if cluster is not None else (None, None)
        return cls(_block(sync, Store.connect(name, inner), DEFAULT_TIMEOUT), sync)

    def close(self) -> None:
        """``Store.aclose``: end this client (the creator's also kills the store). Idempotent."""
        self._run(self.store.aclose())

    def shutdown(self) -> None:
        """``Store.shutdown``: kill the store now (its creator only; StoreError otherwise)."""
        self._run(self.store.shutdown())

    def __enter__(self) -> SyncStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def store_id(self) -> str:
        """The store's id."""
        return self.store.store_id

    @property
    def controller(self) -> ActorHandle[Any]:
        """The controller actor (ClosedError once closed)."""
        return self.store.controller

    @property
    def units(self) -> list[dict[str, Any]]:
        """The storage units' info (ClosedError once closed)."""
        return self.store.units

    @property
    def owned(self) -> bool:
        """Whether this client created the store."""
        return self.store.owned

    @property
    def closed(self) -> bool:
        """Whether the client is closed."""
        return self.store.closed

    # -- placement -----------------------------------------------------------------------

    def refresh(self) -> None:
        """``Store.refresh``: reload the units' info."""
        self._run(self.store.refresh())

    def unit_for_node(self, node_id: str) -> int:
        """``Store.unit_for_node``: the shard number of the unit on ``node_id``."""
        return self.store.unit_for_node(node_id)

    def set_env_nodes(self, env_nodes: Mapping[str, str]) -> None:
        """``Store.set_env_nodes``."""
        self._run(self.store.set_env_nodes(env_nodes))

    def set_env_shards(self, env_shards: Mapping[str, int] | None) -> None:
        """``Store.set_env_shards``."""
        self._run(self.store.set_env_shards(env_shards))

    # -- data plane ----------------------------------------------------------------------

    def put(
        self,
        td: TensorDictBase,
        partition: str | None = None,
        *,
        meta: BatchMeta | None = None,
        env_ids: Sequence[str] | None = None,
        group_ids: Sequence[Any] | None = None,
        custom_meta: Sequence[Mapping[str, Any]] | None = None,
        timeout: float = PUT_TIMEOUT,
        keys: Sequence[str] | None = None,
        group_size: int | None = None,
    ) -> BatchMeta:
        """``Store.put``."""
        aw = self.store.put(
            td,
            partition,
            meta=meta,
            env_ids=env_ids,
            group_ids=group_ids,
            custom_meta=custom_meta,
            timeout=timeout,
            keys=keys,
            group_size=group_size,
        )
        return self._run(aw, timeout + SLACK)

    def get_meta(
        self,
        partition: str,
        fields: Sequence[str],
        batch_size: int | None = None,
        *,
        task: str = "default",
        mode: str = "fetch",
        sampler: Any = None,
        timeout: float | None = None,
        share: tuple[str, int] | None = None,
    ) -> BatchMeta:
        """``Store.get_meta`` (``timeout`` None waits as long as it takes; same checks and
        errors: StoreInputError for a bad timeout, StoreTimeoutError when it passes)."""
        check_timeout(timeout)
        aw = self.store.get_meta(
            partition,
            fields,
            batch_size,
            task=task,
            mode=mode,
            sampler=sampler,
            timeout=timeout,
            share=share,
        )
        return self._run(aw, None if timeout is None else timeout + SLACK)

    def get(
        self,
        meta: BatchMeta,
        fields: Sequence[str] | None = None,
        *,
        device: Any = None,
        zero_copy: bool = False,
    ) -> TensorDict:
        """``Store.get``."""
        return self._run(self.store.get(meta, fields, device=device, zero_copy=zero_copy))

    def clear(self, meta: BatchMeta) -> None:
        """``Store.clear``."""
        self._run(self.store.clear(meta))

    def clear_partition(self, partition: str) -> None:
        """``Store.clear_partition``."""
        self._run(self.store.clear_partition(partition))

    def partitions(self) -> list[str]:
        """``Store.partitions``."""
        return self._run(self.store.partitions())

    def production_status(self, partition: str) -> dict[str, Any]:
        """``Store.production_status``."""
        return self._run(self.store.production_status(partition))

    def consumption_status(self, partition: str, task: str = "default") -> dict[str, int]:
        """``Store.consumption_status``."""
        return self._run(self.store.consumption_status(partition, task))

    def reset_consumption(
        self,
        task: str | None = "default",
        partition: str | None = None,
        *,
        meta: BatchMeta | None = None,
    ) -> None:
        """``Store.reset_consumption``."""
        self._run(self.store.reset_consumption(task, partition, meta=meta))

    def lost_samples(self, partition: str) -> BatchMeta:
        """``Store.lost_samples``."""
        return self._run(self.store.lost_samples(partition))

    def set_custom_meta(self, meta: BatchMeta, custom: Sequence[Mapping[str, Any]]) -> None:
        """``Store.set_custom_meta``."""
        self._run(self.store.set_custom_meta(meta, custom))

    def stats(self) -> dict[str, Any]:
        """``Store.stats``."""
        return self._run(self.store.stats())

    def metrics(self) -> dict[str, Any]:
        """``Store.metrics``."""
        return self._run(self.store.metrics())

    def save_checkpoint(
        self, directory: str | Path, *, metadata: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """``Store.save_checkpoint``."""
        return self._run(self.store.save_checkpoint(directory, metadata=metadata), None)

    def load_checkpoint(self, directory: str | Path) -> Restored:
        """``Store.load_checkpoint``."""
        return self._run(self.store.load_checkpoint(directory), None)

    # -- KV face -------------------------------------------------------------------------

    def kv_put(
        self, keys: Sequence[str], td: TensorDictBase, *, timeout: float = PUT_TIMEOUT
    ) -> None:
        """``Store.kv_put``."""
        self._run(self.store.kv_put(keys, td, timeout=timeout), timeout + SLACK)

    def kv_get(
        self, keys: Sequence[str], fields: Sequence[str] | None = None, *, device: Any = None
    ) -> TensorDict:
        """``Store.kv_get``."""
        return self._run(self.store.kv_get(keys, fields, device=device))

    def kv_keys(self) -> list[str]:
        """``Store.kv_keys``."""
        return self._run(self.store.kv_keys())

    def kv_batch_put(
        self,
        keys: Sequence[str],
        partition_id: str,
        fields: TensorDictBase | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> KVBatchMeta:
        """``Store.kv_batch_put``."""
        return self._run(self.store.kv_batch_put(keys, partition_id, fields, tags))

    def kv_batch_get(
        self,
        keys: Sequence[str] | str,
        partition_id: str,
        select_fields: Sequence[str] | str | None = None,
    ) -> TensorDict:
        """``Store.kv_batch_get``."""
        return self._run(self.store.kv_batch_get(keys, partition_id, select_fields))

    def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, Any]]:
        """``Store.kv_list``."""
        return self._run(self.store.kv_list(partition_id))

    def kv_clear(self, keys: Sequence[str] | str, partition_id: str) -> None:
        """``Store.kv_clear``."""
        self._run(self.store.kv_clear(keys, partition_id))

    def kv_delete(self, keys: Sequence[str]) -> int:
        """``Store.kv_delete``."""
        return self._run(self.store.kv_delete(keys))
