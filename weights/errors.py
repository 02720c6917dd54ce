"""Weight sync's errors: :class:`WeightSyncError` and its refinements.

Every error here crosses processes intact (the error tree registers subclasses for the wire)::

    WeightSyncError                    weight sync cannot serve a publish or a pull
    ├── WeightInputError (ValueError)  a publish or pull it refuses (a bad shard); nothing changed
    │   ├── WeightMismatchError        a tensor's name or shape differs; ``tensor`` names it
    │   └── WeightVersionError         a publish whose version is not the newest
    ├── WeightChecksumError            a tensor's bytes do not match its published checksum
    ├── WeightTimeoutError (TimeoutError) no version >= min_version in time
    └── PublisherLostError             the publisher died (kill -9, crash)
"""

from __future__ import annotations

from rayless.transport.errors import BrokenError, RaylessError

__all__ = [
    "PublisherLostError",
    "WeightChecksumError",
    "WeightInputError",
    "WeightMismatchError",
    "WeightSyncError",
    "WeightTimeoutError",
    "WeightVersionError",
]


class WeightSyncError(RaylessError, wire="rayless.WeightSyncError"):
    """Weight sync cannot serve a publish or a pull; the classes below say why."""


class WeightInputError(WeightSyncError, ValueError, wire="rayless.WeightInputError"):
    """A publish or pull that weight sync refuses (a bad shard, say); nothing changed."""


class WeightMismatchError(WeightInputError, wire="rayless.WeightMismatchError"):
    """A tensor whose name or shape differs between the published weights and the target.

    ``tensor`` names it; nothing was copied.
    """

    def __init__(self, tensor: str, problem: str = "") -> None:
        self.tensor = tensor
        self.problem = problem
        super().__init__(f"tensor {tensor!r} {problem}" if problem else f"tensor {tensor!r}")


class WeightVersionError(WeightInputError, wire="rayless.WeightVersionError"):
    """A publish whose version is not above the newest one published (versions are monotonic)."""


class WeightChecksumError(WeightSyncError, wire="rayless.WeightChecksumError"):
    """A tensor whose bytes, where a pull reads them, do not match the checksum published
    with them (a corrupt or torn copy). ``tensor`` names it, ``version`` is the version;
    nothing was copied."""

    def __init__(self, tensor: str, version: int = -1) -> None:
        self.tensor = tensor
        self.version = version
        super().__init__(
            f"tensor {tensor!r} of version {version} does not match its published checksum "
            "(a corrupt or torn copy); nothing was copied"
        )


class WeightTimeoutError(WeightSyncError, TimeoutError, wire="rayless.WeightTimeoutError"):
    """No version >= ``min_version`` was published within the pull's timeout."""


class PublisherLostError(WeightSyncError, BrokenError, wire="rayless.PublisherLostError"):
    """The publisher died (crash, kill -9); pulls fail until a new publisher publishes.

    A ``BrokenError`` too (the lost-peer family, with ``ActorDiedError``)."""
