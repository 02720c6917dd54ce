"""verl's resource pools: GPU slots ("bundles") reserved for worker groups.

``ResourcePool(process_on_nodes=[4, 4], use_gpu=True, max_colocate_count=k)`` is eight
bundles on two nodes, four each (verl's one placement group per node). A bundle is one GPU of
one node; every worker group built on the pool puts its rank ``i`` on bundle ``i`` with a
``1/k`` share of that GPU, so at most ``k`` groups share a GPU and two ranks of one group
never do (NCCL refuses that). Bundles are chosen on first use, from the live nodes of the
cluster in node order, on GPUs that are free and not held by another pool of this process;
``release()`` gives them back. ``use_gpu=False`` bundles are CPU places on a node.

``split_resource_pool(pool, [2, 2])`` makes pools over consecutive slices of one pool's
bundles (verl's split for colocated roles of different sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rayless.actors import NodeView
from rayless.placement import PlacementError, WorkerSlot

# (head address, node id, GPU index) held by a live pool of this process
_HELD: set[tuple[str, str, int]] = set()


@dataclass(frozen=True)
class Bundle:
    """One rank's place: a node, a GPU on it (None: no GPU), its index in the node's set."""

    node_id: str
    gpu_index: int | None
    node_slot: int
    local_rank: int


class ResourcePool:
    """Bundles on nodes for worker groups (verl's ``RayResourcePool``).

    Raises (constructor):
        ValueError: a count that is not a positive int, or ``max_colocate_count < 1``.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str = "",
        max_colocate_count: int = 10,
        detached: bool = False,
        *,
        n_gpus_per_node: int = 8,
        cpus_per_process: float = 1.0,
    ) -> None:
        store = list(process_on_nodes or [])
        for count in store:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"process_on_nodes needs positive ints, got {store!r}")
        if isinstance(max_colocate_count, bool) or not isinstance(max_colocate_count, int):
            raise ValueError(f"max_colocate_count must be an int, got {max_colocate_count!r}")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self._store = store
        self.use_gpu = bool(use_gpu)
        self.name_prefix = name_prefix
        self.max_colocate_count = max_colocate_count
        self.detached = detached
        self.n_gpus_per_node = n_gpus_per_node
        self.cpus_per_process = float(cpus_per_process)
        self._bundles: list[Bundle] | None = None
        self._held: list[tuple[str, str, int]] = []
        self._parent: ResourcePool | None = None
        self._offset = 0

    # verl's accessors
    def add_node(self, process_count: int) -> None:
        """Add a node of ``process_count`` bundles (before the pool is first used).

        Raises:
            RuntimeError: the bundles are already chosen.
        """
        if self._bundles is not None or self._parent is not None:
            raise RuntimeError("add_node after the pool's bundles were chosen")
        self._store.append(process_count)

    @property
    def store(self) -> list[int]:
        """Bundles per node."""
        return list(self._store)

    def __call__(self) -> list[int]:
        return self.store

    @property
    def world_size(self) -> int:
        """The number of bundles (ranks of a group on this pool)."""
        return sum(self._store)

    def local_world_size_list(self) -> list[int]:
        """For each rank, the number of ranks on its node."""
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """For each rank, its index on its node."""
        return [i for n in self._store for i in range(n)]

    @property
    def gpu_share(self) -> float:
        """The GPU share each rank of a group gets (``1 / max_colocate_count``; 0 without GPUs)."""
        return 1.0 / self.max_colocate_count if self.use_gpu else 0.0

    @property
    def resolved(self) -> bool:
        """Whether the bundles are chosen."""
        return self._bundles is not None

    def bundles(self) -> list[Bundle]:
        """The chosen bundles, in rank order.

        Raises:
            RuntimeError: not chosen yet (a worker group on the pool chooses them).
        """
        if self._parent is not None:
            whole = self._parent.bundles()
            return whole[self._offset : self._offset + self.world_size]
        if self._bundles is None:
            raise RuntimeError("the pool's bundles are not chosen yet")
        return list(self._bundles)

    def choose(self, address: str, nodes: list[NodeView]) -> list[Bundle]:
        """Choose (once) and hold the bundles on the live ``nodes`` of the cluster at
        ``address`` (``cluster.node_views()``); they are the pool's from then on.

        Raises:
            PlacementError: the live nodes cannot hold the pool (naming what is missing).
        """
        if self._parent is not None:
            self._parent.choose(address, nodes)
            return self.bundles()
        if self._bundles is not None:
            return list(self._bundles)
        if not self._store:
            raise PlacementError("the resource pool has no processes (process_on_nodes=[])")
        alive = [v for v in nodes if v.alive]
        alive.sort(key=lambda v: (v.rank is None, v.rank or 0, v.node_id))
        bundles: list[Bundle] = []
        held: list[tuple[str, str, int]] = []
        used_nodes: set[str] = set()
        for slot, count in enumerate(self._store):
            picked: tuple[str, list[int | None]] | None = None
            for record in alive:
                node_id = record.node_id
                if node_id in used_nodes:
                    continue
                if not self.use_gpu:
                    picked = (node_id, [None] * count)
                    break
                free = [
                    g.index
                    for g in record.gpus
                    if g.free >= 1.0 - 1e-9 and (address, node_id, g.index) not in _HELD
                ]
                if len(free) >= count:
                    picked = (node_id, list(free[:count]))
                    break
            if picked is None:
                raise PlacementError(
                    f"no free live node for {count} {'GPU ' if self.use_gpu else ''}bundles "
                    f"(node {slot} of process_on_nodes={self._store}); live nodes: "
                    + ", ".join(_describe(r, address) for r in alive)
                )
            node_id, gpus = picked
            used_nodes.add(node_id)
            for local_rank, gpu in enumerate(gpus):
                bundles.append(Bundle(node_id, gpu, slot, local_rank))
                if gpu is not None:
                    held.append((address, node_id, gpu))
        _HELD.update(held)
        self._held = held
        self._bundles = bundles
        return list(bundles)

    def slots(self, component: str, cpus: float | None = None) -> list[WorkerSlot]:
        """One placement slot per bundle for a group called ``component`` (rank = worker id)."""
        share = self.gpu_share
        return [
            WorkerSlot(
                component=component,
                worker_id=rank,
                node_id=b.node_id,
                gpu_indices=() if b.gpu_index is None else (b.gpu_index,),
                gpu_fraction=share if b.gpu_index is not None else 0.0,
                cpus=self.cpus_per_process if cpus is None else cpus,
            )
            for rank, b in enumerate(self.bundles())
        ]

    def split(self, split_size: int | Sequence[int]) -> list[ResourcePool]:
        """:func:`split_resource_pool` of this pool (verl's ``RayResourcePool.split``)."""
        return split_resource_pool(self, split_size)

    def release(self) -> None:
        """Give the bundles back (other pools may choose them). Idempotent."""
        if self._parent is not None:
            return
        _HELD.difference_update(self._held)
        self._held = []
        self._bundles = None

    def __repr__(self) -> str:
        return (
            f"ResourcePool({self._store}, use_gpu={self.use_gpu}, "
            f"max_colocate_count={self.max_colocate_count})"
        )


def _describe(record: NodeView, address: str) -> str:
    node_id, gpus = record.node_id, record.gpus
    free = sum(1 for g in gpus if g.free >= 1.0 - 1e-9 and (address, node_id, g.index) not in _HELD)
    return f"{node_id} ({free} of {len(gpus)} GPUs free)"


def split_resource_pool(
    resource_pool: ResourcePool, split_size: int | Sequence[int]
) -> list[ResourcePool]:
    """Pools over consecutive slices of ``resource_pool``'s bundles (verl's split).

    ``split_size`` is one size (equal parts) or a list of sizes that sum to the pool's size.
    The parts share the parent's bundles and its ``max_colocate_count``.

    Raises:
        ValueError: sizes that are not positive or do not add up to the pool's world size.
    """
    total = resource_pool.world_size
    if isinstance(split_size, int) and not isinstance(split_size, bool):
        if split_size < 1 or total % split_size:
            raise ValueError(f"a pool of {total} cannot be split into parts of {split_size}")
        sizes = [split_size] * (total // split_size)
    else:
        sizes = list(split_size) if not isinstance(split_size, bool) else [split_size]
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"split sizes must be positive ints, got {sizes!r}")
        if sum(sizes) != total:
            raise ValueError(f"split sizes {sizes} add up to {sum(sizes)}, not the pool's {total}")
    root = resource_pool._parent or resource_pool
    node_of_rank = [i for i, n in enumerate(root._store) for _ in range(n)]
    parts = []
    offset = 0
    for size in sizes:
        start = resource_pool._offset + offset
        ranks_nodes = node_of_rank[start : start + size]
        store = [ranks_nodes.count(n) for n in dict.fromkeys(ranks_nodes)]
        part = ResourcePool(
            store,
            use_gpu=resource_pool.use_gpu,
            name_prefix=resource_pool.name_prefix,
            max_colocate_count=resource_pool.max_colocate_count,
            detached=resource_pool.detached,
            n_gpus_per_node=resource_pool.n_gpus_per_node,
            cpus_per_process=resource_pool.cpus_per_process,
        )
        part._parent = root
        part._offset = start
        parts.append(part)
        offset += size
    return parts
