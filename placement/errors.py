"""The placement layer's errors.

Each one is a :class:`PlacementError` *and* the built-in exception the reference raised (or,
where the reference used ``assert`` for an input check, ValueError), so code ported from
rLightning that catches ``IndexError``/``ValueError``/``RuntimeError`` keeps working:

* :class:`InsufficientResourcesError` (ValueError): too few GPUs, CPUs or nodes for a plan
  or a manual pool ("Resource validation failed: ...", "Not enough nodes ...").
* :class:`AllocationError` (ValueError, RuntimeError): a node or the planner cannot place an
  allocation (the reference's ``NodeResource.allocate`` RuntimeError, its colocate overflow).
  :class:`NodeCapacityError` is both an AllocationError and an InsufficientResourcesError.
* :class:`ManualPoolError` (ValueError): a manual ``resource_pool`` entry that cannot be built
  (unknown node ids, indices past the pool's GPUs, nodes that its ``num_gpus`` cannot name).
* :class:`NodeAffinityError` (ValueError, RuntimeError): a component distribution that cannot
  support node affinity (several storages on one node, a node with storage but no env/train
  workers, unequal per-node counts, env nodes without policies).
* :class:`EpisodeIndexError` (IndexError): a storage shard index out of range.
* :class:`ResourcesBusyError`: a request some node could hold, but not now (its GPUs are
  taken); ``spawn(..., wait_for_resources=s)`` waits for them.
"""

from __future__ import annotations

from rayless.transport.errors import RaylessError

__all__ = [
    "AllocationError",
    "EpisodeIndexError",
    "InsufficientResourcesError",
    "ManualPoolError",
    "NodeAffinityError",
    "NodeCapacityError",
    "PlacementError",
    "ResourcesBusyError",
]


class PlacementError(RaylessError, wire="rayless.PlacementError"):
    """A resource request that no node, pool or plan can satisfy."""


class ResourcesBusyError(PlacementError, wire="rayless.ResourcesBusyError"):
    """A feasible request whose GPUs are held by others right now (``wait_for_resources``
    waits for them instead)."""


class InsufficientResourcesError(
    PlacementError, ValueError, wire="rayless.InsufficientResourcesError"
):
    """The cluster (or a pool) has too few GPUs, CPUs or nodes for the request."""


class AllocationError(PlacementError, ValueError, RuntimeError, wire="rayless.AllocationError"):
    """An allocation that a node (or the planner) cannot place."""


class NodeCapacityError(
    InsufficientResourcesError, AllocationError, wire="rayless.NodeCapacityError"
):
    """A node has fewer GPUs left than an allocation asks for."""


class ManualPoolError(PlacementError, ValueError, wire="rayless.ManualPoolError"):
    """A manual resource-pool entry that cannot be built on this cluster."""


class NodeAffinityError(PlacementError, ValueError, RuntimeError, wire="rayless.NodeAffinityError"):
    """A component distribution that cannot support node affinity."""


class EpisodeIndexError(PlacementError, IndexError, wire="rayless.EpisodeIndexError"):
    """A storage shard index outside ``0..num_storages-1``."""
