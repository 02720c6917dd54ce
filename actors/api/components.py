"""Planned placement → live actors: spawn a component's workers on exactly their slots.

``placement`` plans pools and packs workers into slots (node, NVML GPU indices, GPU share,
CPUs); :func:`spawn_component` starts one actor per slot with ``node=`` and the exact
``gpu_indices``, so the actor of the slot (node B, GPUs "2,3") runs on node B with
CUDA_VISIBLE_DEVICES=2,3. :func:`cluster_info` feeds the planner the live cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

from rayless.placement import WorkerSlot
from rayless.placement.errors import PlacementError

if TYPE_CHECKING:
    from rayless.actors.api.cluster import Cluster
    from rayless.actors.api.handle import ActorHandle


async def spawn_all(
    cluster: Cluster,
    spawns: Iterable[Awaitable[ActorHandle]],
    *,
    kill_on_error: Iterable[ActorHandle] = (),
) -> list[ActorHandle]:
    """Await ``spawns`` (``cluster.spawn(...)`` calls) together; their handles, in order.

    All or none: if any spawn fails, every actor that did start (and ``kill_on_error``) is
    killed, and the first error is raised.
    """
    results = await asyncio.gather(*spawns, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    handles = [r for r in results if not isinstance(r, BaseException)]
    if errors:
        doomed = [*kill_on_error, *handles]
        await asyncio.gather(*(cluster.kill(h) for h in doomed), return_exceptions=True)
        raise errors[0]
    return handles


async def cluster_info(cluster: Cluster) -> dict[str, Any]:
    """The planner's ``cluster_info`` for the live nodes of ``cluster`` (real GPU indices)."""
    table: dict[str, Any] = {}
    for node in await cluster.node_views():
        if not node.alive:
            continue
        indices = [g.index for g in node.gpus]
        table[node.node_id] = {
            "ip": node.ip or "",
            "CPU": node.cpus,
            "GPU": len(indices),
            "gpu_indices": indices,
        }
    return {"n_nodes": len(table), "node_id_to_resources": table}


def slots_of(plan: Any, component: str) -> list[WorkerSlot]:
    """The slots of ``component`` in worker-id order, from a planner, a Packing or slots.

    Raises:
        PlacementError: the plan has no workers for ``component``.
        TypeError: ``plan`` is none of those.
    """
    if hasattr(plan, "pack") and callable(plan.pack):
        plan = plan.pack()
    if hasattr(plan, "slots"):
        plan = plan.slots
    if not isinstance(plan, Iterable):
        raise TypeError(f"expected a planner, a Packing or WorkerSlots, got {type(plan)}")
    every = [s for s in plan if isinstance(s, WorkerSlot)]
    slots = [s for s in every if s.component == component]
    if not slots:
        names = sorted({s.component for s in every})
        hint = ""
        if component.removesuffix("_worker") in names:  # the scheduling key, not the component
            hint = f" (the scheduling key {component!r} packs as {component[:-7]!r})"
        listed = ", ".join(map(repr, names)) or "none"
        raise PlacementError(
            f"the plan has no workers for component {component!r}{hint}; its components: {listed}"
        )
    return sorted(slots, key=lambda s: s.worker_id)


async def spawn_component(
    cluster: Cluster,
    cls: type,
    plan: Any,
    component: str,
    *args: Any,
    name_prefix: str | None = None,
    env: dict[str, str] | None = None,
    **kwargs: Any,
) -> list[ActorHandle]:
    """Spawn one ``cls(*args, **kwargs)`` per slot of ``component``; handles by worker id.

    Each actor gets RAYLESS_COMPONENT and RAYLESS_WORKER_ID in its environment. If any spawn
    fails, the ones that succeeded are killed and the error is raised.

    Raises:
        PlacementError: a slot's node or GPUs are not available.
    """
    slots = slots_of(plan, component)
    prefix = name_prefix or component

    async def one(slot: WorkerSlot) -> ActorHandle:
        share = slot.gpu_fraction if slot.gpu_indices else 0.0
        gpus = share if 0 < share < 1 else float(len(slot.gpu_indices))
        slot_env = {
            **(env or {}),
            "RAYLESS_COMPONENT": component,
            "RAYLESS_WORKER_ID": str(slot.worker_id),
        }
        return await cluster.spawn(
            cls,
            *args,
            name=f"{prefix}-{slot.worker_id}",
            node=slot.node_id,
            gpus=gpus,
            gpu_indices=slot.gpu_indices or None,
            cpus=slot.cpus,
            env=slot_env,
            **kwargs,
        )

    return await spawn_all(cluster, [one(s) for s in slots])
