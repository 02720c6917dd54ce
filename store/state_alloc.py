"""ControllerState's allocation of new samples: global indexes (freed ones reused, smallest
first), the shard of each sample (round robin over live units, the env-shard table, or an
explicit placement), groups, KV keys and custom metadata; an atomic allocation is staged
until every one of its samples was written (see :mod:`store.state_production`).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rayless.store.errors import (
    StoreError,
    StoreInputError,
    UnitLostError,
)
from rayless.store.meta import BatchMeta
from rayless.store.schema import FieldSchema
from rayless.store.state_extra import check_group_size
from rayless.store.state_metas import StateMetas
from rayless.store.state_records import (
    EnvShards,
    _check_name,
    _Partition,
    _Sample,
    _Staging,
)

__all__ = ["StateAllocation"]


class StateAllocation(StateMetas):
    """Index allocation and sample placement of :class:`ControllerState`."""

    if TYPE_CHECKING:

        @staticmethod
        def check_new_keys(part: _Partition | None, keys: Sequence[str] | None, n: int) -> None: ...

    def set_env_shards(self, env_shards: EnvShards | None) -> None:
        """Replace the env id → shard table used when ``allocate`` gets env ids."""
        self._env_shards = env_shards

    def _env_shard(self, env_id: Any) -> int:
        table = self._env_shards
        if table is None:
            raise StoreInputError("env ids were given but the store has no env-shard table")
        try:
            shard = table(env_id) if callable(table) else table[env_id]
        except KeyError:
            raise StoreInputError(f"env id {env_id!r} is not in the env-shard table")
        if not isinstance(shard, int) or not 0 <= shard < len(self._units):
            raise StoreInputError(f"env id {env_id!r} maps to shard {shard!r}, which is unknown")
        if not self._units[shard].alive:
            raise UnitLostError(self._units[shard].unit_id, f"env {env_id!r} is placed on it")
        return shard

    def allocate(
        self,
        partition: str,
        n: int,
        *,
        env_ids: Sequence[str] | None = None,
        group_ids: Sequence[Hashable] | None = None,
        custom_meta: Sequence[Mapping[str, Any]] | None = None,
        schemas: Mapping[str, FieldSchema] | None = None,
        placement: Sequence[int] | None = None,
        atomic: bool = False,
        keys: Sequence[str] | None = None,
        group_size: int | None = None,
    ) -> BatchMeta:
        """Allocate ``n`` new samples in ``partition`` (created if new) and return their meta.

        ``atomic`` (with ``schemas``): the samples become ready together, only once every one
        of them was written (:meth:`on_data_update`), so a put torn by a dead producer never
        shows; until then they count as staged and are cleared like any other sample.

        ``env_ids`` place samples by the env-shard table; ``group_ids`` name each sample's group
        for the grouped sampler (default: consecutive runs of the sampler's ``n`` within this
        allocation); ``schemas`` (the fields about to be put) are checked against the partition
        first and returned in the meta; ``placement`` (live shard numbers, one per sample) place
        samples explicitly when no ``env_ids`` are given (the controller actor uses it to give
        each unit one contiguous block of a put); ``keys`` (KV keys new to the partition) name
        the samples for ``kv_batch_get``; ``group_size`` fixes the partition's group size
        (a group put must fit it: see :func:`~store.state_extra.check_group_size`).
        Raises StoreInputError/SchemaError/UnitLostError.
        """
        _check_name(partition, "partition")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise StoreInputError(f"n must be an int >= 0, got {n!r}")
        for name, seq in (("env_ids", env_ids), ("group_ids", group_ids)):
            if seq is not None and len(seq) != n:
                raise StoreInputError(f"{name} has {len(seq)} entries for {n} samples")
        custom = self._check_custom(custom_meta, n)
        schemas = dict(schemas or {})
        self.check_schemas(partition, schemas)
        alive = [u.shard for u in self._units if u.alive]
        if not alive and n:
            if self._units:  # name what was lost, as every other put to a dead unit does
                lost = ", ".join(u.unit_id for u in self._units)
                raise UnitLostError(lost, "every storage unit of the store is lost")
            raise StoreError("no live storage unit is registered")
        shards_by_env = [self._env_shard(e) for e in env_ids] if env_ids is not None else None
        if shards_by_env is None and placement is not None:
            shards_by_env = list(placement)
            if len(shards_by_env) != n or not set(shards_by_env) <= set(alive):
                raise StoreInputError("placement must name one live shard per sample")
        if group_ids is not None:
            for g in group_ids:
                hash(g)
        existing = self._partitions.get(partition)
        fixed = check_group_size(existing, n, group_ids, group_size)
        self.check_new_keys(existing, keys, n)
        # Validated: from here on nothing raises.
        self._serial += 1
        serial = self._serial
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition(created=serial)
        staged = atomic and n > 0 and bool(schemas)
        free = self._free
        if n >= len(free):  # all of them (a put after a clear of as many): sort, don't pop
            reused = sorted(free)
            free.clear()
        else:
            reused = [heapq.heappop(free) for _ in range(n)]
        start = self._next_index
        self._next_index += n - len(reused)
        indexes = reused + list(range(start, self._next_index))
        shards = shards_by_env or [alive[index % len(alive)] for index in indexes]
        if group_ids is not None:
            groups: Sequence[Hashable] = group_ids
            for g in group_ids:
                part.group_count[g] = part.group_count.get(g, 0) + 1
        else:
            groups = [("#alloc", serial, pos) for pos in range(n)]
        samples = part.samples
        for index, shard, group, extra, key in zip(
            indexes, shards, groups, custom, keys if keys is not None else [None] * n, strict=True
        ):
            samples[index] = _Sample(shard, serial, group, extra, None, staged, key)
        if keys is not None:
            part.keys.update(zip(keys, indexes, strict=True))
        self._owner.update(dict.fromkeys(indexes, partition))
        if fixed is not None:
            part.group_size = fixed
        if staged:
            self._staging[serial] = _Staging(partition, set(indexes), set(indexes), indexes)
        return BatchMeta(
            self.store_id,
            tuple(indexes),
            (partition,) * n,
            tuple(shards),
            (serial,) * n,
            schemas,
            tuple(dict(c) for c in custom) if custom_meta is not None else (),  # () : all empty
        )
