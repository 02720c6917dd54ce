"""Allocation: global indexes, their placement on shards, and their reuse.

Indexes are unique across partitions. Freed indexes are reused, smallest first, so shard
columns stay compact over long runs; a cleared index waits for release (the units deleted its
row, :meth:`Allocation.release`) before it is reused, so it is never reused while a unit still
holds its old row.

Shard rule: a sample's row lives on exactly one unit, chosen when its index is allocated and
recorded with the sample. By default it is ``alive[index % len(alive)]`` (``alive`` = the shard
numbers of live units, ascending): with every unit alive that is ``index % n_units``, which
spreads any allocation pattern evenly and needs no capacity plan. When the caller gives env
ids, the env-shard table (a ``Mapping[str, int]`` or a callable, e.g. the placement episode
table) decides instead, so one env's samples stay on the unit near its workers.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rayless.store.controller.catalog import Catalog
from rayless.store.controller.kv import check_custom, check_new_keys
from rayless.store.controller.records import STAGED, EnvShards, FreeIndexes, _check_name, _Partition
from rayless.store.controller.staging import StagedPuts
from rayless.store.controller.units import Units
from rayless.store.data.fields import FieldSchema
from rayless.store.data.meta import BatchMeta
from rayless.store.errors import StoreError, StoreInputError, UnitLostError

__all__ = ["Allocation", "check_group_size"]


def check_group_size(
    part: _Partition | None,
    n: int,
    group_ids: Sequence[Hashable] | None,
    group_size: int | None,
) -> int | None:
    """Raise StoreInputError unless a put of ``n`` samples with ``group_ids`` fits the
    partition's group size (or the ``group_size`` it names); returns the size to fix (None:
    nothing to fix). Without group ids a put with ``group_size`` must be whole groups."""
    if group_size is not None and (
        not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0
    ):
        raise StoreInputError(f"group_size must be a positive int, got {group_size!r}")
    fixed = part.group_size if part is not None else None
    if group_size is not None and fixed is not None and group_size != fixed:
        raise StoreInputError(
            f"the put's group_size is {group_size}, but the partition's groups hold {fixed} "
            "samples (fixed by an earlier put or grouped fetch)"
        )
    size = fixed if fixed is not None else group_size
    if size is None:
        return None
    if group_ids is None:
        if group_size is not None and n % size:
            raise StoreInputError(
                f"a put of {n} samples without group_ids is not whole groups of {size}"
            )
        return size
    counts: dict[Hashable, int] = {}
    for g in group_ids:
        counts[g] = counts.get(g, 0) + 1
    for g, k in counts.items():
        have = part.group_count.get(g, 0) if part is not None else 0
        if have + k > size:
            raise StoreInputError(
                f"group {g!r} would hold {have + k} samples, but the partition's group size "
                f"is {size}: the put is refused"
            )
    return size


class Allocation:
    """Allocates samples into a :class:`Catalog`'s partitions (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        units: Units,
        staging: StagedPuts,
        env_shards: EnvShards | None = None,
    ) -> None:
        self._catalog = catalog
        self._units = units
        self._staging = staging
        self._env_shards = env_shards
        self._allocated = 0
        self._free = FreeIndexes()  # reusable indexes, smallest first
        self._pending: set[int] = set()  # cleared, waiting for release
        self._next_index = 0
        self._serial = 0

    def stats(self) -> dict[str, int]:
        """Counts for monitoring: allocated, free, pending release, high water."""
        return {
            "allocated": self._allocated,
            "free": len(self._free),
            "pending_release": len(self._pending),
            "high_water": self._next_index,
        }

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
        """Allocate ``n`` new samples in ``partition`` (created if new) and return their meta;
        see :meth:`store.controller.state.ControllerState.allocate`.
        Raises StoreInputError/SchemaError/UnitLostError/StoreError.
        """
        _check_name(partition, "partition")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise StoreInputError(f"n must be an int >= 0, got {n!r}")
        for name, seq in (("env_ids", env_ids), ("group_ids", group_ids)):
            if seq is not None and len(seq) != n:
                raise StoreInputError(f"{name} has {len(seq)} entries for {n} samples")
        custom = check_custom(custom_meta, n)
        schemas = dict(schemas or {})
        catalog = self._catalog
        catalog.check_schemas(partition, schemas)
        alive = self._units.alive_shards()
        if not alive and n:
            if len(self._units):  # name what was lost, as every other put to a dead unit does
                lost = ", ".join(u.unit_id for u in self._units.all())
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
        existing = catalog.partitions.get(partition)
        fixed = check_group_size(existing, n, group_ids, group_size)
        check_new_keys(existing, keys, n)
        # Validated: from here on nothing raises.
        self._serial += 1
        serial = self._serial
        part = catalog.partitions.get(partition)
        if part is None:
            part = catalog.create(partition, serial)
        staged = atomic and n > 0 and bool(schemas)
        reused = self._free.take(n)
        start = self._next_index
        self._next_index += n - len(reused)
        idx = np.concatenate([reused, np.arange(start, self._next_index)])
        if shards_by_env is not None:
            shards = np.asarray(shards_by_env, dtype=np.int32)
        else:
            shards = np.asarray(alive, dtype=np.int32)[idx % len(alive)]
        where = catalog.where
        part.reserve(n)
        where.reserve(self._next_index)
        first = part.n
        pos = np.arange(first, first + n)
        part.index[pos] = idx
        part.shard[pos] = shards
        part.gen[pos] = serial
        part.flags[pos] = STAGED if staged else 0
        if group_ids is not None:
            part.group[pos] = [part.code_group(g) for g in group_ids]
        else:
            part.group[pos] = -1 - np.arange(n)
        part.n += n
        part.live += n
        self._allocated += n
        if custom is not None:
            for p, extra in zip(pos.tolist(), custom, strict=True):
                if extra:
                    part.custom[p] = extra
        indexes = idx.tolist()
        if keys is not None:
            part.keys.update(zip(keys, indexes, strict=True))
            part.key_at.update(zip(pos.tolist(), keys, strict=True))
        where.part[idx] = part.code
        where.pos[idx] = pos
        if fixed is not None:
            part.group_size = fixed
        if staged:
            self._staging.stage(serial, partition, indexes)
        return BatchMeta(
            catalog.store_id,
            tuple(indexes),
            (partition,) * n,
            tuple(shards.tolist()),
            (serial,) * n,
            schemas,
            tuple(dict(c) for c in custom) if custom is not None else (),  # () : all empty
        )

    def retire(self, indexes: list[int]) -> None:
        """Note cleared ``indexes``: no longer allocated, waiting for :meth:`release`."""
        self._pending.update(indexes)
        self._allocated -= len(indexes)

    def release(self, indexes: Iterable[int]) -> None:
        """Make cleared indexes reusable (after the units deleted their rows).
        Raises StoreInputError for indexes not waiting for release."""
        idx = set(indexes)
        unknown = idx - self._pending
        if unknown:
            raise StoreInputError(f"indexes {sorted(unknown)[:8]} are not waiting for release")
        self._pending -= idx
        self._free.add(np.fromiter(idx, dtype=np.int64, count=len(idx)))
