"""Episode table: env id → storage shard, storage shard → train workers, with node affinity.

Without node affinity, a new env goes to the least-loaded shard, ties broken round-robin from
where the last choice stopped; train workers are split into equal contiguous blocks
(``num_train_workers`` must be a multiple of ``num_storages``). With node affinity, the
component distribution (``{node: {"buffer"|"train"|"env": {"ids": [...]}}}``) binds each env
worker and train worker to the storage shard (buffer worker) of its node.

**Env id rule**: the env worker index is the run of ASCII digits after the last ``-``
(``"env-3"`` → 3; see ``placement.policies.env_worker_index``). Without node affinity the index
is not needed. With env node affinity an id without an index suffix, or whose index is not an
env worker of the distribution, raises NodeAffinityError naming it (the reference silently used
the id's position in the list, which could collide with a real index). Envs registered later
(``get_storage_idx_for_env``) follow the same affinity rule when it is on.

Errors keep the reference's built-in types: a shard index out of range in the getters raises
EpisodeIndexError (a PlacementError and an IndexError); a distribution that cannot support
affinity (several storages on one node, a node with storage but no env/train workers, unequal
worker counts per node, a storage index out of range) raises NodeAffinityError (a
PlacementError, a RuntimeError as the reference's count checks, and a ValueError where the
reference used ``assert``); bad arguments raise ValueError.

Deliberate differences from the reference: no ``assert`` for input checks (above); with train
affinity, ``num_train_workers`` must equal the workers in the distribution;
``get_train_workers`` returns ``[]`` (not None) for a shard without workers; the getters return
copies.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rayless.placement.errors import EpisodeIndexError, NodeAffinityError
from rayless.placement.policies import env_worker_index

__all__ = ["EpisodeTable"]

log = logging.getLogger(__name__)


class EpisodeTable:
    """Tracks env → storage shard and storage shard → train workers."""

    def __init__(
        self,
        num_storages: int,
        env_ids: Sequence[str] | None = None,
        num_train_workers: int | None = None,
        component_distribution: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
        node_affinity_env: bool = False,
        node_affinity_train: bool = False,
    ) -> None:
        if isinstance(num_storages, bool) or not isinstance(num_storages, int) or num_storages < 1:
            raise ValueError(f"num_storages must be a positive int, got {num_storages!r}")
        self.num_storages = num_storages
        self._component_distribution = dict(component_distribution or {})
        self._node_affinity_env = node_affinity_env
        self._node_affinity_train = node_affinity_train
        self._env_to_storage: dict[str, int] = {}
        self._storage_env_count = [0] * num_storages
        self._rr_cursor = 0
        self._storage_to_train_workers: dict[int, list[int]] = {}
        self._env_worker_to_storage: dict[int, int] = {}
        if (node_affinity_env or node_affinity_train) and not self._component_distribution:
            raise ValueError("component_distribution must be provided when node affinity is on")
        storages, trains, envs = self._extract_node_component_ids()
        if node_affinity_env:
            self._validate_node_worker_counts(storages, envs, "env")
            for node, ids in envs.items():
                if node in storages:
                    for wid in ids:
                        self._env_worker_to_storage[wid] = storages[node]
        if env_ids:
            self.register_envs(env_ids)
        if num_train_workers is not None:
            if node_affinity_train:
                self._validate_node_worker_counts(storages, trains, "train")
                self._assign_train_workers_with_node_affinity(num_train_workers, storages, trains)
            else:
                self._assign_train_workers(num_train_workers)

    # -- envs ---------------------------------------------------------------------------------

    def register_envs(self, env_ids: Iterable[str]) -> None:
        """Register env ids (already known ones keep their shard)."""
        for env_id in env_ids:
            self._register_env(env_id)

    def _register_env(self, env_id: str) -> int:
        if env_id in self._env_to_storage:
            return self._env_to_storage[env_id]
        if self._node_affinity_env:
            idx = env_worker_index(env_id)
            if idx is None:
                raise NodeAffinityError(
                    f"env id {env_id!r} has no worker index suffix ('<name>-<index>'), "
                    "which env node affinity needs"
                )
            storage = self._env_worker_to_storage.get(idx)
            if storage is None:
                raise NodeAffinityError(
                    f"env worker {idx} (env id {env_id!r}) is on no node with a storage"
                )
        else:
            storage = self._select_storage_for_new_env()
        self._env_to_storage[env_id] = storage
        self._storage_env_count[storage] += 1
        return storage

    def _select_storage_for_new_env(self) -> int:
        """The least-loaded shard, ties broken round-robin."""
        min_load = min(self._storage_env_count)
        for _ in range(self.num_storages):
            idx = self._rr_cursor
            self._rr_cursor = (self._rr_cursor + 1) % self.num_storages
            if self._storage_env_count[idx] == min_load:
                return idx
        raise AssertionError("unreachable: some shard has the minimum load")

    def get_envs_for_storage(self, storage_idx: int) -> list[str]:
        """Env ids mapped to a shard; EpisodeIndexError (an IndexError) if out of range."""
        self._validate_storage_idx(storage_idx)
        return [e for e, s in self._env_to_storage.items() if s == storage_idx]

    def get_storage_idx_for_env(self, env_id: str) -> int:
        """The env's shard, assigning one if the env is new."""
        return self._register_env(env_id)

    def get_env_to_storage(self) -> dict[str, int]:
        """env id → shard (a copy)."""
        return dict(self._env_to_storage)

    # -- train workers ------------------------------------------------------------------------

    def _assign_train_workers(self, num_train_workers: int) -> None:
        if (
            isinstance(num_train_workers, bool)
            or not isinstance(num_train_workers, int)
            or num_train_workers < 1
        ):
            raise ValueError(f"num_train_workers must be a positive int, got {num_train_workers!r}")
        if num_train_workers % self.num_storages:
            raise ValueError(
                f"num_train_workers ({num_train_workers}) must be divisible by num_storages "
                f"({self.num_storages})"
            )
        per = num_train_workers // self.num_storages
        self._storage_to_train_workers = {
            s: list(range(s * per, (s + 1) * per)) for s in range(self.num_storages)
        }

    def _assign_train_workers_with_node_affinity(
        self, num_train_workers: int, storages: dict[str, int], trains: dict[str, list[int]]
    ) -> None:
        total = sum(len(trains.get(n, [])) for n in storages)
        if total != num_train_workers:
            raise NodeAffinityError(
                f"num_train_workers={num_train_workers} but the nodes with storage hold "
                f"{total} train workers"
            )
        self._storage_to_train_workers = {s: [] for s in range(self.num_storages)}
        for node, storage in storages.items():
            self._storage_to_train_workers[storage] = list(trains[node])

    def get_train_workers(self, storage_idx: int) -> list[int]:
        """Train workers reading a shard; EpisodeIndexError (an IndexError) if out of range."""
        self._validate_storage_idx(storage_idx)
        return list(self._storage_to_train_workers.get(storage_idx, []))

    def get_storage_to_train_workers(self) -> dict[int, list[int]]:
        """shard → train workers (a copy)."""
        return {s: list(w) for s, w in self._storage_to_train_workers.items()}

    # -- validation ---------------------------------------------------------------------------

    def _validate_storage_idx(self, storage_idx: int) -> None:
        if not 0 <= storage_idx < self.num_storages:
            raise EpisodeIndexError(
                f"Storage idx {storage_idx} out of range for {self.num_storages} storages"
            )

    def _extract_node_component_ids(
        self,
    ) -> tuple[dict[str, int], dict[str, list[int]], dict[str, list[int]]]:
        storages: dict[str, int] = {}
        trains: dict[str, list[int]] = {}
        envs: dict[str, list[int]] = {}
        for node, comps in self._component_distribution.items():
            buffers = [int(i) for i in comps.get("buffer", {}).get("ids", [])]
            if len(buffers) > 1:
                raise NodeAffinityError(
                    f"Node {node} has multiple buffer storages {buffers}, expected at most one"
                )
            if buffers:
                if not 0 <= buffers[0] < self.num_storages:
                    raise NodeAffinityError(
                        f"Storage index {buffers[0]} out of range for {self.num_storages} storages"
                    )
                storages[node] = buffers[0]
            train = [int(i) for i in comps.get("train", {}).get("ids", [])]
            env = [int(i) for i in comps.get("env", {}).get("ids", [])]
            if train:
                trains[node] = train
            if env:
                envs[node] = env
        return storages, trains, envs

    @staticmethod
    def _validate_node_worker_counts(
        storages: dict[str, int], workers: dict[str, list[int]], component_type: str
    ) -> None:
        if not storages:
            raise NodeAffinityError(
                "node affinity needs buffer (storage) workers in the distribution"
            )
        expected: int | None = None
        for node in storages:
            count = len(workers.get(node, []))
            if count == 0:
                raise NodeAffinityError(
                    f"Node {node} has storage but no {component_type} workers (node affinity is on)"
                )
            if expected is None:
                expected = count
            elif count != expected:
                raise NodeAffinityError(
                    f"Node {node} has {count} {component_type} workers; expected {expected} "
                    "for node affinity"
                )
