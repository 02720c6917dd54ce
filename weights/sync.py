"""SyncWeightSync: the blocking face of :class:`~rayless.weights.client.WeightSync`.

Like ``SyncStore``, it runs every call on the actors layer's one sync mechanism (a
``SyncCluster``'s portal, or the process's home loop inside an actor)::

    with actors.Cluster.local_sync(nodes=2) as cluster:
        with SyncWeightSync.create(cluster, name="policy") as ws:
            ws.publish(model.state_dict(), version=1)
            ws.pull(other_model, min_version=1, timeout=60)

Same names, arguments and errors as ``WeightSync``. Calling it from a thread that runs an
event loop raises RuntimeError (use ``WeightSync`` there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from rayless.actors import Cluster
from rayless.actors.api.portal import run_sync
from rayless.actors.api.sync import SyncCluster
from rayless.weights.client import WeightSync

__all__ = ["SyncWeightSync"]

T = TypeVar("T")
DEFAULT_TIMEOUT = 300.0
SLACK = 30.0


def _split(cluster: Cluster | SyncCluster | None) -> tuple[Cluster | None, SyncCluster | None]:
    if isinstance(cluster, SyncCluster):
        return cluster.cluster, cluster
    return cluster, None


def _block(sync: SyncCluster | None, aw: Awaitable[T], timeout: float | None) -> T:
    return sync.run(aw, timeout) if sync is not None else run_sync(aw, timeout)


class SyncWeightSync:
    """Blocking versions of :class:`WeightSync`'s methods; a context manager (``close``).

    ``with SyncWeightSync.connect(...) as ws:`` suits a subscriber; a publisher's versions end
    when its client closes, so a trainer keeps one client for the whole run."""

    def __init__(self, ws: WeightSync, sync: SyncCluster | None = None) -> None:
        self.ws = ws
        self._sync = sync

    @classmethod
    def create(cls, cluster: Cluster | SyncCluster, *args: Any, **kwargs: Any) -> SyncWeightSync:
        """``WeightSync.create`` (same arguments and errors)."""
        inner, sync = _split(cluster)
        if inner is None:
            raise TypeError("create needs a cluster")
        return cls(_block(sync, WeightSync.create(inner, *args, **kwargs), DEFAULT_TIMEOUT), sync)

    @classmethod
    def connect(
        cls, name: str = "weights", cluster: Cluster | SyncCluster | None = None, **options: Any
    ) -> SyncWeightSync:
        """``WeightSync.connect`` (same arguments and errors)."""
        inner, sync = _split(cluster)
        return cls(_block(sync, WeightSync.connect(name, inner, **options), DEFAULT_TIMEOUT), sync)

    def close(self) -> None:
        """``WeightSync.aclose`` (idempotent). A publisher's versions end with it: pulls then
        raise PublisherLostError (keep a publisher's client open for the run)."""
        _block(self._sync, self.ws.aclose(), DEFAULT_TIMEOUT)

    def __enter__(self) -> SyncWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        """The last version this client published or pulled (-1 before)."""
        return self.ws.version

    def latest_version(self) -> int:
        """``WeightSync.latest_version``."""
        return _block(self._sync, self.ws.latest_version(), DEFAULT_TIMEOUT)

    def publish(self, state: Mapping[str, Any], version: int) -> int:
        """``WeightSync.publish``."""
        return _block(self._sync, self.ws.publish(state, version), DEFAULT_TIMEOUT)

    def pull(
        self,
        target: Any,
        min_version: int = 0,
        timeout: float | None = None,
        *,
        strict: bool = True,
    ) -> int:
        """``WeightSync.pull``."""
        limit = None if timeout is None else timeout + SLACK
        return _block(self._sync, self.ws.pull(target, min_version, timeout, strict=strict), limit)
