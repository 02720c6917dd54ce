"""Resources, plans and routing decisions: NVML/psutil discovery, pools, packing, routers.

Pure logic plus discovery. Imports nothing of ours but the error types in ``transport``.
Modules (each lists its deliberate differences from the reference it reproduces):
``discovery`` (NodeInfo of this host), ``resources`` (NodeResource, ComponentAllocation),
``scheduling`` (Scheduling, ComponentScheduling), ``pools`` (ResourcePool,
ResourcePoolPlanner, YAML), ``packing`` (WorkerSlot, pack), ``routing`` (routers,
create_router; the code in ``policies``, ``async_routers``, ``sync_routers``), ``episodes``
(EpisodeTable).
"""

from rayless.placement.discovery import GpuInfo, NodeInfo, discover_node, discover_node_async
from rayless.placement.episodes import EpisodeTable
from rayless.placement.errors import (
    AllocationError,
    EpisodeIndexError,
    InsufficientResourcesError,
    ManualPoolError,
    NodeAffinityError,
    NodeCapacityError,
    PlacementError,
    ResourcesBusyError,
)
from rayless.placement.packing import Packing, WorkerSlot, check_overcommit, pack, sharing_pairs
from rayless.placement.pools import ResourcePool, ResourcePoolPlanner, cluster_info_from_nodes
from rayless.placement.resources import (
    ComponentAllocation,
    NodeResource,
    parse_index_str,
)
from rayless.placement.routing import (
    AsyncRouter,
    NodeAffinityRouter,
    Policy,
    SimpleRouter,
    SyncNodeAffinityRouter,
    SyncRouter,
    SyncSimpleRouter,
    create_router,
    env_worker_index,
    probe_idle,
    probe_loads,
)
from rayless.placement.scheduling import ComponentScheduling, Scheduling

__all__ = [
    "AllocationError",
    "AsyncRouter",
    "ComponentAllocation",
    "ComponentScheduling",
    "EpisodeIndexError",
    "EpisodeTable",
    "GpuInfo",
    "InsufficientResourcesError",
    "ManualPoolError",
    "NodeAffinityError",
    "NodeAffinityRouter",
    "NodeCapacityError",
    "NodeInfo",
    "NodeResource",
    "Packing",
    "PlacementError",
    "ResourcesBusyError",
    "Policy",
    "ResourcePool",
    "ResourcePoolPlanner",
    "Scheduling",
    "SimpleRouter",
    "SyncNodeAffinityRouter",
    "SyncRouter",
    "SyncSimpleRouter",
    "WorkerSlot",
    "check_overcommit",
    "cluster_info_from_nodes",
    "create_router",
    "discover_node",
    "discover_node_async",
    "env_worker_index",
    "pack",
    "parse_index_str",
    "probe_idle",
    "probe_loads",
    "sharing_pairs",
]
