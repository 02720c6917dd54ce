"""Every public import path of rayless, in one place (tests/unit/test_api_paths.py imports
each one; docs/api-paths.md explains them).

* ``PACKAGES``: the packages users import from; every name in a package's ``__all__`` is
  public there.
* ``PATHS``: further public modules and names (``module`` or ``module:Name``), the ones the
  docs point at.
* ``MOVED``: paths that moved, each to its new path (``module`` or ``module:Name`` on both
  sides); the old one still works, with a DeprecationWarning naming the new one.
"""

from __future__ import annotations

from rayless.store import MODULE_ALIASES, MOVED_MODULES, MOVED_NAMES

__all__ = ["MOVED", "PACKAGES", "PATHS"]

PACKAGES = (
    "rayless.actors",
    "rayless.errors",
    "rayless.placement",
    "rayless.ray",
    "rayless.ray._private.services",
    "rayless.ray._private.state",
    "rayless.ray._private.runtime_env.constants",
    "rayless.ray.exceptions",
    "rayless.ray.runtime_env",
    "rayless.ray.experimental",
    "rayless.ray.experimental.state",
    "rayless.ray.experimental.state.api",
    "rayless.ray.job_submission",
    "rayless.ray.util",
    "rayless.ray.util.collective",
    "rayless.ray.util.placement_group",
    "rayless.ray.util.queue",
    "rayless.ray.util.scheduling_strategies",
    "rayless.ray.util.serialization",
    "rayless.ray.util.state",
    "rayless.ray.util.state.api",
    "rayless.ray.util.state.common",
    "rayless.ray.util.state.exception",
    "rayless.single_controller",
    "rayless.transfer_queue",
    "rayless.transfer_queue.metadata",
    "rayless.store",
    "rayless.transport",
    "rayless.weights",
)

PATHS = (
    "rayless.actors.testing",
    "rayless.ray.actor:ActorHandle",
    "rayless.ray.actor:ActorClass",
    "rayless.ray.object_ref:ObjectRef",
    "rayless.ray.runtime_context:RuntimeContext",
    "rayless.ray.util:ActorPool",
    "rayless.ray.util:as_completed",
    "rayless.ray.util:map_unordered",
    "rayless.actors.api.sync:SyncCluster",
    "rayless.actors.api.blocking",
    "rayless.actors.api.components",
    "rayless.actors.launch.local:LocalProcesses",
    "rayless.actors.ext",
    "rayless.transport.ext",
    "rayless.transport.cuda_ipc",
    "rayless.k8s:K8sJob",
    "rayless.k8s:apply",
    "rayless.slurm:SlurmJob",
    "rayless.store.errors",
    "rayless.store.client.store:KVBatchMeta",
    "rayless.store.client.loader:StreamingDataset",
    "rayless.store.client.loader:StreamingLoader",
    "rayless.store.client.sync:SyncStore",
    "rayless.store.client.checkpoint",
    "rayless.store.controller.samplers",
    "rayless.store.data.meta:BatchMeta",
    "rayless.store.data.schema:FieldSchema",
    "rayless.transport.codec:encode",
    "rayless.transport.codec:decode",
    "rayless.transport.errors:error_to_state",
    "rayless.transport.protocol:Limits",
    "rayless.transport.segments:Segment",
    "rayless.weights.errors",
    "rayless.weights:WeightSync",
    "rayless.weights:SyncWeightSync",
    *MODULE_ALIASES,
)

MOVED: dict[str, str] = {
    **MOVED_MODULES,
    **{f"rayless.store:{name}": f"{module}:{name}" for name, module in MOVED_NAMES.items()},
    "rayless.store.client:Store": "rayless.store:Store",
    "rayless.store.client:DEFAULT_NAME": "rayless.store:DEFAULT_NAME",
    "rayless.store.client:PUT_TIMEOUT": "rayless.store.client.store:PUT_TIMEOUT",
    "rayless.store.client:KVBatchMeta": "rayless.store.client.store:KVBatchMeta",
}
