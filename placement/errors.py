"""The placement layer's error: a request that no node, pool or plan can satisfy."""

from __future__ import annotations

from rayless.transport.errors import RaylessError

__all__ = ["PlacementError"]


class PlacementError(RaylessError, wire="rayless.PlacementError"):
    """A resource request that no node, pool or plan can satisfy."""
