"""Resource pools and the planner that builds them (the reference's ResourcePool and
ResourcePoolPlanner), manual pools from YAML and YAML export.

Strategies: ``disaggregate`` (``train_pool`` = train + buffer, ``rollout_pool`` = eval + env,
on separate GPUs) and ``colocate`` (one ``global_pool``; train shares GPUs with the rollout).
Env strategy ``device-colocate`` lets eval and env share GPUs. A pool-global GPU index space
concatenates the pool's nodes in order (node 0 holds ``0..g0-1``, node 1 ``g0..g0+g1-1``...).

Deliberate differences from the reference:

* Planning never mutates the cluster's NodeResource objects and can be repeated; the
  reference accumulated allocations on every call.
* A node that holds both train and rollout GPUs (disaggregate) is in **both** pools, each view
  holding only its own components' ranges; the reference put it in the train pool only, so the
  env/eval ranges there were reported under ``train_pool``.
* Per-node allocations are rounded down to whole workers (a worker never spans nodes), and the
  colocate planner re-reads a node's free GPUs after each allocation (the reference reused a
  stale count and could raise mid-plan). What cannot be placed raises AllocationError (a
  PlacementError that is still the reference's RuntimeError). Requirements are checked with the
  whole, packing-aware GPU figures (``ComponentScheduling.component_gpus_needed``), which
  ``resource_summary`` holds; ``get_component_requirements`` keeps the reference's raw sums.
* Errors: "Insufficient GPUs/CPUs", "Not enough nodes" raise InsufficientResourcesError (a
  PlacementError and a ValueError); bad input raises ValueError — never ``assert``. An unknown
  ``env_strategy`` is rejected instead of being read as ``default``.
* Manual pools: ranges past the pool's GPUs raise ManualPoolError (a ValueError; the reference
  silently wrote out-of-range indices); unknown node ids raise ManualPoolError (the reference:
  KeyError); component keys must be known
  components (a typo such as ``trian`` is an error, not a new component); a GPU listed twice for
  one component is an error; with ``node_ids`` a pool node is limited to its ``num_gpus`` entry
  (the reference kept the full node, so export offsets did not match import offsets). Without
  ``node_ids`` an int ``num_gpus`` is honoured per node, and on a heterogeneous cluster it names
  the nodes (see ``placement.pool``) where the reference refused every such pool.
* YAML export is the reference's shape; ``node_ids`` appear only for pools loaded with them or
  whose unpinned form would not load back onto the same nodes (``to_yaml_config``), so every
  export re-imports to the same plan.
* ``component_types`` is ordered (first appearance; ``buffer`` after ``train``) and never
  cached stale; ``get_component_node_count("buffer")`` counts train nodes.
* ``cluster_info=None`` describes **this host** via ``discover_node()`` (placement cannot reach
  the cluster registry; the runtime passes ``cluster_info_from_nodes(...)`` of its nodes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rayless.placement.discovery import NodeInfo, discover_node
from rayless.placement.errors import AllocationError, InsufficientResourcesError, PlacementError
from rayless.placement.packing import Packing, pack
from rayless.placement.pool import ResourcePool
from rayless.placement.resources import NodeResource
from rayless.placement.scheduling import ComponentScheduling

__all__ = [
    "ENV_STRATEGIES",
    "STRATEGIES",
    "ResourcePool",
    "ResourcePoolPlanner",
    "cluster_info_from_nodes",
]

log = logging.getLogger(__name__)

STRATEGIES = ("disaggregate", "colocate")
ENV_STRATEGIES = ("default", "device-colocate")


def cluster_info_from_nodes(nodes: Iterable[NodeInfo]) -> dict[str, Any]:
    """The planner's ``cluster_info`` for discovered nodes (keeps their NVML GPU indices)."""
    table: dict[str, Any] = {}
    for n in nodes:
        table[n.node_id] = {
            "ip": n.ip,
            "CPU": n.cpus,
            "GPU": n.num_gpus,
            "gpu_indices": list(n.gpu_indices),
        }
    return {"n_nodes": len(table), "node_id_to_resources": table}


def _granule(scheduling: ComponentScheduling, component: str) -> int:
    """GPUs per worker when every group agrees on a whole number, else 1."""
    sizes = {s.gpus_per_worker for s in scheduling.groups(component) if s.count}
    sizes.discard(0)
    if len(sizes) == 1:
        g = sizes.pop()
        if all(s.num_gpus >= 1 for s in scheduling.groups(component) if s.gpus_per_worker):
            return g
    return 1


class ResourcePoolPlanner:
    """Checks requirements against the cluster and splits it into resource pools."""

    def __init__(
        self, scheduling: ComponentScheduling, cluster_info: Mapping[str, Any] | None = None
    ) -> None:
        if not isinstance(scheduling, ComponentScheduling):
            raise ValueError(
                f"scheduling must be a ComponentScheduling, got {type(scheduling).__name__}"
            )
        self.scheduling = scheduling
        self._cluster_info: dict[str, Any] | None = (
            dict(cluster_info) if cluster_info is not None else None
        )
        self._node_resources: dict[str, NodeResource] = {}
        self._resource_pools: dict[str, ResourcePool] = {}
        self.resource_summary: dict[str, Any] = {}
        self.strategy: str | None = None
        self.env_strategy: str = "default"

    # -- cluster ------------------------------------------------------------------------------

    def discover_cluster_resources(self) -> dict[str, NodeResource]:
        """Read ``cluster_info`` (or discover this host) into NodeResource objects.

        Raises ValueError when ``cluster_info`` is malformed.
        """
        if self._cluster_info is None:
            self._cluster_info = cluster_info_from_nodes([discover_node()])
        table = self._cluster_info.get("node_id_to_resources")
        if not isinstance(table, Mapping):
            raise ValueError("cluster_info needs a 'node_id_to_resources' mapping")
        nodes: dict[str, NodeResource] = {}
        for node_id, info in table.items():
            if not isinstance(info, Mapping):
                raise ValueError(f"cluster_info node {node_id!r}: expected a mapping")
            gpus, cpus = info.get("GPU", 0), info.get("CPU", 0)
            if isinstance(gpus, float) and gpus.is_integer():
                gpus = int(gpus)
            if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
                raise ValueError(f"cluster_info node {node_id!r}: GPU must be an int >= 0")
            if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus < 0:
                raise ValueError(f"cluster_info node {node_id!r}: CPU must be a number >= 0")
            ids = info.get("gpu_indices")
            nodes[str(node_id)] = NodeResource(
                node_id=str(node_id),
                ip=str(info.get("ip", "")),
                total_cpus=cpus,
                total_gpus=gpus,
                gpu_ids=tuple(ids) if ids is not None else None,
            )
        self._node_resources = nodes
        log.info(
            "[ResourcePoolPlanner] Discovered %d nodes, total GPUs: %d, total CPUs: %s",
            len(nodes),
            sum(n.total_gpus for n in nodes.values()),
            sum(n.total_cpus for n in nodes.values()),
        )
        return nodes

    def _nodes(self) -> dict[str, NodeResource]:
        if not self._node_resources:
            self.discover_cluster_resources()
        return self._node_resources

    # -- validation and planning ----------------------------------------------------------

    def validate_scheduling(
        self, strategy: str = "disaggregate", env_strategy: str = "default"
    ) -> tuple[bool, str]:
        """``(ok, message)``: whether the cluster's totals can hold the requirements.

        Raises ValueError for an unknown strategy or env strategy.
        """
        _check_strategy(strategy, env_strategy)
        nodes = self._nodes()
        total_gpus = sum(n.total_gpus for n in nodes.values())
        total_cpus = sum(n.total_cpus for n in nodes.values())
        sched = self.scheduling
        # pools are sized in whole GPUs once packed; CPUs are the reference's sums
        train_gpus, train_cpus = sched.train_pool_gpus_needed(), sched.train_pool_requirements()[1]
        env_gpus, env_cpus = (
            sched.component_gpus_needed("env"),
            sched.get_component_requirements("env")[1],
        )
        eval_gpus, eval_cpus = (
            sched.component_gpus_needed("eval"),
            sched.get_component_requirements("eval")[1],
        )
        if env_strategy == "device-colocate":
            rollout_gpus = max(env_gpus, eval_gpus)
        else:
            rollout_gpus = env_gpus + eval_gpus
        if strategy == "disaggregate":
            required_gpus = train_gpus + rollout_gpus
        else:
            required_gpus = max(train_gpus, rollout_gpus)
        if required_gpus > total_gpus:
            return False, f"Insufficient GPUs: required {required_gpus}, available {total_gpus}"
        required_cpus = train_cpus + eval_cpus + env_cpus
        if required_cpus > total_cpus + 1e-9:
            return False, f"Insufficient CPUs: required {required_cpus}, available {total_cpus}"
        self.resource_summary = {
            "train_pool_required_gpus": train_gpus,
            "rollout_pool_required_gpus": rollout_gpus,
            "env_required_gpus": env_gpus,
            "eval_required_gpus": eval_gpus,
        }
        return True, ""

    def plan_resource_pools(
        self, strategy: str = "disaggregate", env_strategy: str = "default"
    ) -> dict[str, ResourcePool]:
        """Plan pools with a strategy. Deterministic for the same inputs; repeatable.

        Raises InsufficientResourcesError ("Resource validation failed: Insufficient ...") when
        the totals do not suffice, PlacementError when whole workers do not fit per node, and
        ValueError for an unknown strategy.
        """
        ok, msg = self.validate_scheduling(strategy, env_strategy)
        if not ok:
            raise InsufficientResourcesError(f"Resource validation failed: {msg}")
        order = sorted(self._nodes().values(), key=lambda n: -n.total_gpus)
        work = [n.view() for n in order]
        s = self.resource_summary
        need = {
            "train": s["train_pool_required_gpus"],
            "eval": s["eval_required_gpus"],
            "env": s["env_required_gpus"],
        }
        gran = {c: _granule(self.scheduling, c) for c in need}
        if self.scheduling.component_gpus_needed("buffer"):
            gran["train"] = 1  # buffer GPUs ride in the train range
        share_eval = env_strategy == "device-colocate"

        def take(node: NodeResource, comp: str, consume: bool) -> None:
            g = gran[comp]
            n = min((node.available_gpus // g) * g, need[comp])
            if n > 0:
                node.allocate(n, [comp], consume=consume)
                need[comp] -= n

        if strategy == "disaggregate":
            for node in work:
                take(node, "train", True)
            for node in work:
                take(node, "eval", not share_eval)
                take(node, "env", True)
            pools = {
                "train_pool": _pool("train_pool", work, ("train",)),
                "rollout_pool": _pool("rollout_pool", work, ("eval", "env")),
            }
        else:
            for node in work:
                take(node, "train", False)
                take(node, "eval", not share_eval)
                take(node, "env", True)
            pools = {"global_pool": _pool("global_pool", work, ("train", "eval", "env"))}
        short = {c: n for c, n in need.items() if n > 0}
        if short:
            raise AllocationError(
                f"cannot place {short} GPUs with {strategy}/{env_strategy}: whole workers "
                f"(GPUs per worker {gran}) do not fit the nodes' free GPUs"
            )
        for pool in pools.values():
            for comp, ca in pool.component_allocations.items():
                ca.worker_count = self.scheduling.worker_count(comp)
            log.info(
                "[ResourcePoolPlanner] Pool '%s': %d nodes, %d GPUs, components: %s",
                pool.name,
                pool.num_nodes,
                pool.total_gpus,
                pool.component_types,
            )
        self._resource_pools = pools
        self.strategy, self.env_strategy = strategy, env_strategy
        return pools

    def load_manual_resource_pools(
        self, resource_pool_cfg: Sequence[Mapping[str, Any]]
    ) -> dict[str, ResourcePool]:
        """Build pools from a manual YAML list (see :meth:`ResourcePool.from_yaml_dict`).

        Raises ValueError for a duplicate pool name or bad input, PlacementError when the
        cluster cannot hold the pools.
        """
        if isinstance(resource_pool_cfg, Mapping) or not isinstance(resource_pool_cfg, Sequence):
            raise ValueError("resource_pool must be a list of pool dicts")
        nodes = self._nodes()
        used: set[str] = set()
        pools: dict[str, ResourcePool] = {}
        for cfg in resource_pool_cfg:
            pool = ResourcePool.from_yaml_dict(cfg, nodes, used_node_ids=used)
            if pool.name in pools:
                raise ValueError(f"two manual pools are named {pool.name!r}")
            used.update(pool.node_ids)
            for comp, ca in pool.component_allocations.items():
                ca.worker_count = self.scheduling.worker_count(comp)
            pools[pool.name] = pool
        self._resource_pools = pools
        self.strategy, self.env_strategy = None, "default"
        return pools

    # -- views --------------------------------------------------------------------------------

    def get_component_node_count(self, component_type: str) -> int:
        """Nodes holding the component over all pools (a node counted once)."""
        comp = "train" if component_type == "buffer" else component_type
        ids = {
            n.node_id
            for pool in self._resource_pools.values()
            if component_type in pool.component_types
            for n in pool.nodes
            if comp in n.allocations
        }
        return len(ids)

    def get_resource_pools(self, pool_name: str | None = None) -> Any:
        """All pools (dict) or the one named (None when absent)."""
        if pool_name is None:
            return self._resource_pools
        return self._resource_pools.get(pool_name)

    def get_pool_for_component(self, component_type: str) -> ResourcePool | None:
        """The first pool listing the component type."""
        for pool in self._resource_pools.values():
            if component_type in pool.component_types:
                return pool
        return None

    def get_cluster_info(self) -> dict[str, Any] | None:
        """The raw cluster info."""
        return self._cluster_info

    def get_node_resources(self) -> dict[str, NodeResource]:
        """node id → NodeResource (capacities; planning never mutates them)."""
        return self._node_resources

    def to_yaml_config(self, *, pin_nodes: bool | None = None) -> list[dict[str, Any]]:
        """The pools as a manual ``resource_pool`` list, in the reference's shape.

        ``pin_nodes=None`` (default): a pool carries ``node_ids`` (and a per-node ``num_gpus``
        list) only when it was loaded with ``node_ids`` or when its unpinned form would not
        load back onto the same nodes (a node shared with another pool, nodes out of node-id
        order, a heterogeneous pool the sizes cannot name) — so the export re-imports to the
        same plan. ``True`` pins every pool (the form the reference loads on heterogeneous
        clusters); ``False`` never pins (the reference's own export).
        """
        if pin_nodes is not None:
            return [p.to_yaml_dict(pin_nodes=pin_nodes) for p in self._resource_pools.values()]
        nodes = self._node_resources
        used: set[str] = set()
        out = []
        for pool in self._resource_pools.values():
            form = pool.to_yaml_dict()
            if "node_ids" not in form and not _reloads_same(pool, form, nodes, used):
                form = pool.to_yaml_dict(pin_nodes=True)
            used.update(pool.node_ids)
            out.append(form)
        return out

    def pack(self) -> Packing:
        """Concrete worker slots for the current pools (``placement.packing.Packing``)."""
        if not self._resource_pools:
            raise PlacementError("no resource pools: call plan_resource_pools() first")
        return pack(
            self.scheduling,
            self._resource_pools,
            self._nodes(),
            strategy=self.strategy,
            env_strategy=self.env_strategy,
        )

    def get_component_distribution(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{node_id: {component: {"count": n, "ids": [...]}}}`` of the packed workers."""
        return dict(self.pack().component_distribution())

    def summary(self) -> dict[str, Any]:
        """Cluster totals, pools and the YAML form."""
        nodes = self._node_resources
        return {
            "cluster": {
                "n_nodes": len(nodes),
                "total_gpus": sum(n.total_gpus for n in nodes.values()),
                "total_cpus": sum(n.total_cpus for n in nodes.values()),
            },
            "pools": {name: p.to_dict() for name, p in self._resource_pools.items()},
            "yaml_config": self.to_yaml_config(),
        }


def _check_strategy(strategy: str, env_strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown placement strategy: {strategy!r} (expected {STRATEGIES})")
    if env_strategy not in ENV_STRATEGIES:
        raise ValueError(f"Unknown env strategy: {env_strategy!r} (expected {ENV_STRATEGIES})")


def _reloads_same(
    pool: ResourcePool, form: Mapping[str, Any], nodes: Mapping[str, NodeResource], used: set[str]
) -> bool:
    """Whether loading ``form`` after the pools using ``used`` rebuilds ``pool`` exactly."""
    try:
        again = ResourcePool.from_yaml_dict(form, nodes, used_node_ids=set(used))
    except (ValueError, PlacementError):
        return False
    return _layout(again) == _layout(pool)


def _layout(pool: ResourcePool) -> list[Any]:
    return [(n.node_id, n.total_gpus, n.gpu_ids, n.allocations) for n in pool.nodes]


def _pool(name: str, work: list[NodeResource], comps: tuple[str, ...]) -> ResourcePool:
    """A pool of views of the nodes holding any of ``comps``, each with only those ranges."""
    views = []
    for node in work:
        allocs = {c: list(r) for c, r in node.allocations.items() if c in comps}
        if allocs:
            view = node.view()
            view.allocations = allocs
            view.gpu_cursor = node.gpu_cursor
            view.max_allocated_gpus = node.max_allocated_gpus
            views.append(view)
    pool = ResourcePool(name=name, nodes=views)
    pool.rebuild_component_allocations()
    return pool
