"""verl's single-controller model on rayless: workers, ``@register``, pools, worker groups.

Porting verl code is an import change (see docs/moving-from-verl.md)::

    from rayless.single_controller import (
        ClassWithInitArgs, Dispatch, ResourcePool, Worker, WorkerGroup, register,
    )

    class Actor(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def compute(self, batch): ...

    with rayless.actors.Cluster.local_sync(nodes=2, gpus_per_node=4) as cluster:
        pool = ResourcePool([4, 4], use_gpu=True, max_colocate_count=1)
        wg = WorkerGroup(pool, ClassWithInitArgs(Actor), cluster=cluster)
        out = wg.compute(batch)  # split over 8 ranks, results concatenated

verl's Ray-prefixed names (``RayResourcePool``, ``RayClassWithInitArgs``, ``RayWorkerGroup``)
are aliases of the same classes.
"""

from rayless.single_controller.decorator import (
    MAGIC_ATTR,
    Dispatch,
    Execute,
    FunctionRef,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    update_dispatch_mode,
)
from rayless.single_controller.fused import FusedWorker, create_colocated_worker_cls
from rayless.single_controller.resource_pool import Bundle, ResourcePool, split_resource_pool
from rayless.single_controller.worker import Worker
from rayless.single_controller.worker_group import ClassWithInitArgs, GroupMethod, WorkerGroup

RayResourcePool = ResourcePool
RayClassWithInitArgs = ClassWithInitArgs
RayWorkerGroup = WorkerGroup

__all__ = [
    "MAGIC_ATTR",
    "Bundle",
    "ClassWithInitArgs",
    "Dispatch",
    "Execute",
    "FunctionRef",
    "FusedWorker",
    "GroupMethod",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "Worker",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "get_predefined_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "split_resource_pool",
    "update_dispatch_mode",
]
