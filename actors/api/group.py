"""Groups of actors spawned together, optionally wired for torch.distributed.

``await cluster.spawn_group(Worker, 4, torch_distributed=True)`` starts four actors with
ranks 0..3 and returns their handles in rank order. Placement: contiguous blocks of ranks per
node, spread evenly over the live nodes in launch-rank order (``[n0, n0, n1, n1]`` for four
members on two nodes, as torchrun numbers them), or over ``nodes=[...]``, or all on ``node=``,
or exactly on a placement plan's slots (``plan=planner, component="actor"``: node and GPU
indices per worker, see ``rayless.actors.api.components``).

Each member's environment has RAYLESS_GROUP_RANK and RAYLESS_GROUP_SIZE; with
``torch_distributed=True`` also MASTER_ADDR (the address of rank 0's node), MASTER_PORT,
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (members on the same node) and GROUP_RANK
(the node's index in the group), so ``torch.distributed.init_process_group("gloo" or "nccl")``
with the default ``env://`` works. MASTER_PORT is a port that rank 0's node agent found free
on that node just before the spawn (the ``free_port`` agent op), drawn from below the
kernel's ephemeral range, where no other process's connection or ``bind(0)`` takes it
(``actors.control.free_ports``); only an explicit bind of that port before rank 0's
``init_process_group`` could still take it — pass ``master_port=`` to choose one yourself.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rayless.actors.api.components import slots_of, spawn_all
from rayless.actors.api.runtime import get_runtime
from rayless.actors.protocol.messages import FreePortOn, NodeView
from rayless.placement.errors import PlacementError

if TYPE_CHECKING:
    from rayless.actors.api.cluster import Cluster
    from rayless.actors.api.handle import ActorHandle


def block_assignment(n: int, nodes: list[str]) -> list[str]:
    """Node of each of ``n`` ranks: contiguous, even blocks over ``nodes`` (in order)."""
    m = min(len(nodes), n)
    return [nodes[i * m // n] for i in range(n)]


def _node_order(views: list[NodeView], gpus: float) -> list[str]:
    alive = [v for v in views if v.alive]
    if gpus > 0:
        alive = [v for v in alive if v.gpus_total >= math.ceil(gpus)]
    alive.sort(key=lambda v: (v.rank is None, v.rank or 0, v.node_id))
    return [v.node_id for v in alive]


def torch_env(ranks_nodes: list[str], master_addr: str, master_port: int) -> list[dict[str, str]]:
    """The torch.distributed variables of each rank, given each rank's node."""
    world = len(ranks_nodes)
    order = list(dict.fromkeys(ranks_nodes))  # nodes in order of their first rank
    out = []
    for rank, node in enumerate(ranks_nodes):
        local = [r for r, n in enumerate(ranks_nodes) if n == node]
        out.append(
            {
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local.index(rank)),
                "LOCAL_WORLD_SIZE": str(len(local)),
                "GROUP_RANK": str(order.index(node)),
            }
        )
    return out


async def spawn_group(
    cluster: Cluster,
    cls: type,
    n: int,
    *args: Any,
    torch_distributed: bool = False,
    nodes: list[str] | None = None,
    node: str | None = None,
    plan: Any = None,
    component: str | None = None,
    name_prefix: str | None = None,
    env: dict[str, str] | None = None,
    gpus: float = 0,
    cpus: float = 1,
    master_port: int | None = None,
    **kwargs: Any,
) -> list[ActorHandle]:
    """Spawn ``n`` actors ``cls(*args, **kwargs)`` as ranks 0..n-1; handles in rank order.

    Other keyword arguments (``max_restarts``, ``max_concurrency``, ``timeout`` ...) go to
    ``cluster.spawn``; names are ``{name_prefix}-{rank}`` when a prefix is given. If any
    member fails to start, the others are killed and the error is raised.

    Raises:
        ValueError: ``n < 1``, conflicting ``node``/``nodes``/``plan``, a plan whose worker
            count is not ``n``, or ``plan`` without ``component``.
        PlacementError: no live node can hold the members, or a named node is not alive.
        RemoteError: a member's constructor or ``setup`` raised.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}")
    if sum(x is not None for x in (nodes, node, plan)) > 1:
        raise ValueError("give at most one of node=, nodes= and plan=")
    per_rank: list[dict[str, Any]] = []
    if plan is not None:
        if component is None:
            raise ValueError("plan= needs component=")
        slots = slots_of(plan, component)
        if len(slots) != n:
            raise ValueError(f"the plan has {len(slots)} workers of {component!r}, not n={n}")
        for slot in slots:
            share = slot.gpu_fraction if slot.gpu_indices else 0.0
            per_rank.append(
                {
                    "node": slot.node_id,
                    "gpus": share if 0 < share < 1 else float(len(slot.gpu_indices)),
                    "gpu_indices": slot.gpu_indices or None,
                    "cpus": slot.cpus,
                }
            )
    else:
        views = await cluster.node_views()
        if node is not None:
            targets = [node] * n
        else:
            order = list(nodes) if nodes is not None else _node_order(views, gpus)
            if not order:
                raise PlacementError(f"no live node can hold members with gpus={gpus}")
            targets = block_assignment(n, order)
        per_rank = [{"node": t, "gpus": gpus, "cpus": cpus} for t in targets]
    ranks_nodes = [str(p["node"]) for p in per_rank]
    envs: list[dict[str, str]] = [{} for _ in range(n)]
    if torch_distributed:
        views = await cluster.node_views()
        ips = {v.node_id: v.ip or "" for v in views if v.alive}
        if ranks_nodes[0] not in ips:
            raise PlacementError(f"node {ranks_nodes[0]!r} of rank 0 is not alive")
        if master_port is None:
            runtime = await get_runtime()
            master_port = await runtime.head_request(FreePortOn(ranks_nodes[0]))
        envs = torch_env(ranks_nodes, ips[ranks_nodes[0]], master_port)

    async def one(rank: int) -> ActorHandle:
        member_env = {
            **(env or {}),
            **envs[rank],
            "RAYLESS_GROUP_RANK": str(rank),
            "RAYLESS_GROUP_SIZE": str(n),
        }
        return await cluster.spawn(
            cls,
            *args,
            name=f"{name_prefix}-{rank}" if name_prefix else None,
            env=member_env,
            **per_rank[rank],
            **kwargs,
        )

    return await spawn_all(cluster, [one(r) for r in range(n)])
