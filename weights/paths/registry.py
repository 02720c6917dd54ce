"""The registry of transfer paths: every :class:`~rayless.weights.messages.PathKind` → its
:class:`~rayless.weights.paths.base.WeightPath`, and a client's instances of them.

A publish takes the first path, in :data:`PATHS`' order, that ``publishes`` it; a pull reads
each entry with the path its kind names, or, when a path ``receives`` the pull itself (a
collective), lets that path deliver.
"""

from __future__ import annotations

from rayless.weights.errors import WeightSyncError
from rayless.weights.messages import PathKind
from rayless.weights.paths.base import PublishRequest, PullRequest, Slots, WeightPath
from rayless.weights.paths.cuda import CudaPath
from rayless.weights.paths.dist import DistPath
from rayless.weights.paths.relay import RelayPath
from rayless.weights.paths.shm import ShmPath

__all__ = ["PATHS", "Paths"]

# In the order a publish tries them: the most specific first, the same-host CPU path last.
PATHS: dict[PathKind, type[WeightPath]] = {
    PathKind.DIST: DistPath,
    PathKind.CUDA: CudaPath,
    PathKind.SHM: ShmPath,
    PathKind.RELAY: RelayPath,
}


class Paths:
    """A client's instance of every registered path (``paths``: by default :data:`PATHS`)."""

    def __init__(
        self, sync: str, slots: Slots, paths: dict[PathKind, type[WeightPath]] | None = None
    ) -> None:
        self._paths = {kind: cls(sync, slots) for kind, cls in (paths or PATHS).items()}
        self.sync = sync

    def __getitem__(self, kind: PathKind) -> WeightPath:
        """The path of ``kind``. Raises WeightSyncError when none is registered."""
        path = self._paths.get(kind)
        if path is None:
            raise WeightSyncError(f"weight sync {self.sync!r}: no {kind.value} path here")
        return path

    def publisher(self, request: PublishRequest) -> WeightPath:
        """The path that carries ``request``. Raises WeightSyncError when none does."""
        for path in self._paths.values():
            if path.publishes(request):
                return path
        raise WeightSyncError(f"weight sync {self.sync!r}: no path publishes this")

    def receiver(self, request: PullRequest) -> WeightPath | None:
        """The path that delivers ``request`` itself (a collective), or None (the registry)."""
        for path in self._paths.values():
            if path.receives(request):
                return path
        return None

    def close(self) -> None:
        """Close every path."""
        for path in self._paths.values():
            path.close()
