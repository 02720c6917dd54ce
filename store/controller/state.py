"""ControllerState: the controller's bookkeeping, synchronous and free of I/O.

The controller actor wraps one ControllerState. It owns:

- **Units**: registered storage units (handshake data), numbered by shard in registration
  order. A unit that registers again under its id (a restart) keeps its shard.
- **Indexes**: global indexes, unique across partitions. Freed indexes are reused, smallest
  first, so shard columns stay compact over long runs.
- **Partitions**: per partition, columns indexed by position in allocation order (global
  index, shard, generation, group, flags), a ready bitmap per field (production status), a
  consumed bitmap per task (consumption status), field schemas, and sparse per-sample shapes
  of nested fields, custom metadata and KV keys. Each fetch's (task, field set) keeps a
  candidate set (ready and unconsumed positions) that every update and consume keeps current,
  so a sequential fetch costs O(batch), whatever the partition's size; a partition whose
  removed positions are the majority is compacted.

Shard rule: a sample's row lives on exactly one unit, chosen when its index is allocated and
recorded with the sample. By default it is ``alive[index % len(alive)]`` (``alive`` = the shard
numbers of live units, ascending): with every unit alive that is ``index % n_units``, which
spreads any allocation pattern evenly and needs no capacity plan. When the caller gives env
ids, the env-shard table (a ``Mapping[str, int]`` or a callable, e.g. the placement episode
table) decides instead, so one env's samples stay on the unit near its workers.

Because a sample's fields from one put are written to one unit and announced in one
notification, a sample never becomes partly visible; a sample is *ready* for fields F when all
of F are in their ready sets. An atomic allocation (a new put) goes further: none of its
samples is ready until all of them were written (a torn put never shows). A unit loss marks
its samples lost (not ready); only fetches waiting through the loss are told
(:meth:`ControllerState.lost_since`), later ones wait for new data. Every method validates
first and raises a typed :mod:`store.errors` error with the state unchanged.

Clearing is two-phase so that an index is never reused while a unit still holds its old row:
:meth:`ControllerState.clear` hides the samples at once and returns a :class:`ClearPlan`; once
the units deleted the rows, :meth:`ControllerState.release` makes the indexes reusable.

The records (units, partitions, candidate sets, staged puts, clear plans) live in
:mod:`store.controller.records`.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from rayless.store.controller.column_puts import ColumnPuts
from rayless.store.controller.records import (
    LOST,
    STAGED,
    ClearPlan,
    EnvShards,
    FreeIndexes,
    UnitInfo,
    _Candidates,
    _check_fields,
    _check_name,
    _IndexTable,
    _Partition,
    _positions_by_partition,
    _Staging,
    as_indexes,
)
from rayless.store.controller.records import (
    MODES as MODES,
)
from rayless.store.controller.samplers import Sampler, capabilities_of, make_sampler
from rayless.store.data.fields import FieldSchema
from rayless.store.data.messages import FetchMode
from rayless.store.data.meta import NO_CUSTOM, BatchMeta
from rayless.store.data.plain import check_plain
from rayless.store.data.updates import DataUpdate
from rayless.store.errors import (
    ForeignMetaError,
    SchemaError,
    StaleMetaError,
    StoreError,
    StoreInputError,
    UnitLostError,
    UnknownFieldError,
    UnknownKeyError,
    UnknownPartitionError,
)

__all__ = ["ClearPlan", "ControllerState", "EnvShards", "UnitInfo"]


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


def _meta_arrays(
    meta: BatchMeta, positions: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The global indexes, shards and generations of ``meta``'s samples at ``positions``, as
    int64 arrays (``meta.arrays()`` when ``positions`` are all of them). Raises
    StoreInputError for values that are not ints."""
    if len(positions) == meta.size:
        return meta.arrays()
    gidx, shards, gens = meta.global_indexes, meta.shards, meta.generations
    return (
        as_indexes([gidx[p] for p in positions]),
        as_indexes([shards[p] for p in positions]),
        as_indexes([gens[p] for p in positions]),
    )


class ControllerState:
    """The store controller's state. See the module docstring for the rules it keeps."""

    def __init__(self, store_id: str | None = None, *, env_shards: EnvShards | None = None):
        self.store_id = store_id or uuid.uuid4().hex
        self._env_shards = env_shards
        self._units: list[UnitInfo] = []
        self._unit_by_id: dict[str, UnitInfo] = {}
        self._partitions: dict[str, _Partition] = {}
        self._by_code: dict[int, str] = {}  # partition code -> name
        self._codes = 0
        self._where = _IndexTable()  # global index -> (partition code, position)
        self._allocated = 0
        self._free = FreeIndexes()  # reusable indexes, smallest first
        self._pending: set[int] = set()  # cleared, waiting for release
        self._next_index = 0
        self._serial = 0
        self._samplers: dict[tuple[str, str, str], Sampler] = {}
        self._staging: dict[int, _Staging] = {}  # allocation serial -> uncommitted put
        self.column_puts = ColumnPuts()  # column-wise puts whose units have not all written
        self.positions_examined = 0  # by fetches' candidate sets, for tests and monitoring

    # -- status --------------------------------------------------------------------------

    def partitions(self) -> list[str]:
        """Names of existing partitions."""
        return list(self._partitions)

    def shard_of(self, index: int) -> int:
        """The shard that holds allocated sample ``index``. Raises StoreInputError."""
        idx = as_indexes([index])
        inside = 0 <= index < len(self._where.part)
        code = int(self._where.part[idx[0]]) if inside else -1
        if code < 0:
            raise StoreInputError(f"index {index} is not allocated")
        part = self._partitions[self._by_code[code]]
        return int(part.shard[self._where.pos[index]])

    def production_status(self, partition: str) -> dict[str, Any]:
        """``{"samples": n, "lost": lost with their unit, "fields": {field: ready count},
        "schemas": {...}}`` of a partition; ``n`` counts the samples of committed puts (not
        those a put in flight or a client's lease allocated)."""
        part = self._part(partition)
        staged, staged_lost = self._staged_in(partition)
        return {
            "samples": part.live - staged,
            "lost": part.lost - staged_lost,
            "fields": dict(part.ready_count),
            "schemas": {f: s.to_dict() for f, s in part.schemas.items()},
        }

    def consumption_status(self, partition: str, task: str) -> dict[str, int]:
        """``{"samples": n, "consumed": c}`` for ``task`` in ``partition``."""
        part = self._part(partition)
        samples = part.live - self._staged_in(partition)[0]
        return {"samples": samples, "consumed": part.consumed_count.get(task, 0)}

    def staged_count(self, serial: int) -> int:
        """Samples of allocation ``serial`` that exist and are not committed yet."""
        staging = self._staging.get(serial)
        return 0 if staging is None else len(staging.members)

    def _staged_in(self, partition: str) -> tuple[int, int]:
        """Samples of ``partition`` allocated by puts that have not committed yet (in flight,
        or leased ahead by a client), and how many of them are lost with their unit: not
        counted as the partition's samples (nor lost ones). Costs the uncommitted puts'
        samples, not the partition's size."""
        part = self._partitions.get(partition)
        staged = lost = 0
        for st in self._staging.values():
            if st.partition != partition or not st.members:
                continue
            staged += len(st.members)
            if part is not None and part.lost:
                members = np.fromiter(st.members, dtype=np.int64, count=len(st.members))
                lost += int(np.count_nonzero(part.flags[self._where.pos[members]] & LOST))
        return staged, lost

    def stats(self) -> dict[str, Any]:
        """Counts for monitoring: partitions, allocated, free, pending release, units."""
        return {
            "partitions": len(self._partitions),
            "allocated": self._allocated,
            "free": len(self._free),
            "pending_release": len(self._pending),
            "staged": sum(len(st.members) for st in self._staging.values()),
            "column_puts": len(self.column_puts),  # column-wise puts not finished yet
            "high_water": self._next_index,
            "units": [u.to_dict() for u in self._units],
        }

    def state_bytes(self) -> int:
        """Bytes held by the partitions' columns and bitmaps (the per-sample state)."""
        total = self._where.part.nbytes + self._where.pos.nbytes
        for part in self._partitions.values():
            cols = (part.index, part.shard, part.gen, part.group, part.flags)
            total += sum(c.nbytes for c in cols)
            total += sum(b.nbytes for b in (*part.ready.values(), *part.consumed.values()))
            total += sum(t.bits.nbytes + t.in_heap.nbytes for t in part.trackers.values())
        return total

    # -- lookups, meta checks, metas -------------------------------------------------------

    def _part(self, partition: str) -> _Partition:
        part = self._partitions.get(partition)
        if part is None:
            raise UnknownPartitionError(f"partition {partition!r} does not exist")
        return part

    def _unit(self, unit_id: str) -> UnitInfo:
        info = self._unit_by_id.get(unit_id)
        if info is None:
            raise StoreInputError(f"unknown storage unit {unit_id!r}")
        return info

    def _positions(self, part: _Partition, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, pos)`` of global indexes ``idx`` in ``part``."""
        return self._where.lookup(part.code, idx)

    def _existing(self, part: _Partition, indexes: Sequence[int], what: str) -> np.ndarray:
        """Positions of ``indexes`` (all in ``part``). Raises StoreInputError naming ``what``."""
        idx = as_indexes(indexes)
        found, pos = self._positions(part, idx)
        if not found.all():
            raise StoreInputError(f"samples {idx[~found][:8].tolist()} {what}")
        return pos

    def check_meta(self, meta: BatchMeta) -> None:
        """Raise ForeignMetaError/StaleMetaError unless every sample of ``meta`` still exists."""
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions.get(part_id)
            idx, shards, gens = _meta_arrays(meta, positions)
            if part is None:
                raise StaleMetaError(
                    f"sample {int(idx[0])} of partition {part_id!r} was cleared since the meta "
                    "was made"
                )
            found, pos = self._positions(part, idx)
            found &= part.gen[np.where(found, pos, 0)] == gens
            if not found.all():
                index = int(idx[~found][0])
                raise StaleMetaError(
                    f"sample {index} of partition {part_id!r} was cleared since the meta was made"
                )
            have = part.shard[pos]
            if not np.array_equal(have, shards):
                k = int(np.flatnonzero(have != shards)[0])
                raise StoreInputError(
                    f"the meta puts sample {int(idx[k])} of {part_id!r} on shard "
                    f"{int(shards[k])!r}; it lives on shard {int(have[k])} (a forged or "
                    "corrupted meta)"
                )

    def check_schemas(self, partition: str, schemas: Mapping[str, FieldSchema]) -> None:
        """Raise SchemaError if ``schemas`` cannot be written into ``partition``'s fields."""
        part = self._partitions.get(partition)
        for name, schema in schemas.items():
            if not isinstance(schema, FieldSchema):
                raise SchemaError(f"schema of field {name!r} is not a FieldSchema")
            if part is not None and name in part.schemas:
                part.schemas[name].merged(schema, name)

    @staticmethod
    def _ready_for_all(part: _Partition, pos: np.ndarray) -> list[str]:
        """The fields every one of ``pos`` holds."""
        return [f for f, bits in part.ready.items() if bits[pos].all()]

    def meta_of(
        self, partition: str, indexes: Sequence[int], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """A meta for existing samples with the given fields (default: all their ready fields)."""
        part = self._part(partition)
        pos = self._existing(part, list(indexes), f"are not in partition {partition!r}")
        if len(np.unique(pos)) != len(pos):
            raise StoreInputError("indexes must be distinct")
        if fields is None:
            names = self._ready_for_all(part, pos)
        else:
            names = _check_fields(fields)
            unknown = [f for f in names if f not in part.schemas]
            if unknown:
                raise UnknownFieldError(f"fields {unknown} are not in partition {partition!r}")
        return self._meta(partition, part, pos, names)

    def _meta(
        self, partition: str, part: _Partition, pos: np.ndarray, names: list[str]
    ) -> BatchMeta:
        idx = part.index[pos].tolist()
        shapes = {
            f: tuple(part.shapes.get(f, {}).get(i) for i in idx)
            for f in names
            if f in part.schemas and part.schemas[f].is_nested
        }
        if part.custom:
            got = [part.custom.get(p) for p in pos.tolist()]
            custom = tuple(dict(c) if c else NO_CUSTOM for c in got)
        else:
            custom = (NO_CUSTOM,) * len(idx)
        return BatchMeta(
            self.store_id,
            tuple(idx),
            (partition,) * len(idx),
            tuple(part.shard[pos].tolist()),
            tuple(part.gen[pos].tolist()),
            {f: part.schemas[f] for f in names if f in part.schemas},
            custom,
            shapes,
        )

    @staticmethod
    def _check_custom(
        custom: Sequence[Mapping[str, Any]] | None, n: int
    ) -> list[Mapping[str, Any]] | None:
        if custom is None:
            return None
        if len(custom) != n:
            raise StoreInputError(f"custom_meta has {len(custom)} entries for {n} samples")
        out: list[Mapping[str, Any]] = []
        for i, item in enumerate(custom):
            if not isinstance(item, Mapping):
                raise StoreInputError(f"custom_meta[{i}] is not a dict")
            check_plain(dict(item), f"custom_meta[{i}]")
            out.append(dict(item))
        return out

    def set_custom_meta(self, meta: BatchMeta, custom_meta: Sequence[Mapping[str, Any]]) -> None:
        """Replace the custom metadata of ``meta``'s samples (one plain dict per sample)."""
        self.check_meta(meta)
        custom = self._check_custom(custom_meta, meta.size) or []
        for part_id, index, item in zip(
            meta.partition_ids, meta.global_indexes, custom, strict=True
        ):
            part = self._partitions[part_id]
            pos = int(self._where.pos[index])
            if item:
                part.custom[pos] = item
            else:
                part.custom.pop(pos, None)

    def _apply_update(
        self,
        part: _Partition,
        update: DataUpdate,
        merged: Mapping[str, FieldSchema],
        pos: np.ndarray | None = None,
    ) -> None:
        """Make ``update``'s fields ready at its samples (``pos``: their positions, if known)."""
        idx = update.indexes
        if pos is None:
            pos = self._where.pos[as_indexes(list(idx))]
        part.schemas.update(merged)
        for name, shapes in update.sample_shapes.items():
            part.shapes.setdefault(name, {}).update(zip(idx, shapes, strict=True))
        part.set_lost(pos, False)
        for name in merged:
            part.set_ready(name, pos)

    def _drop_empty_schemas(self, part: _Partition) -> None:
        # A field no sample holds any more forgets its schema (it may come back as anything).
        for name in [f for f, k in part.ready_count.items() if not k]:
            del part.ready[name], part.ready_count[name]
            part.schemas.pop(name, None)
            part.shapes.pop(name, None)

    # -- units and their loss --------------------------------------------------------------

    def register_unit(
        self,
        unit_id: str,
        *,
        node_id: str | None = None,
        device: str = "cpu",
        capacity_bytes: int | None = None,
    ) -> UnitInfo:
        """Register a storage unit (its handshake) and return its info with its shard number.

        A known id registers again (after a restart): it keeps its shard and comes back alive;
        samples lost with it stay not ready until rewritten.
        """
        _check_name(unit_id, "unit_id")
        _check_name(device, "device")
        if capacity_bytes is not None and (
            not isinstance(capacity_bytes, int) or capacity_bytes < 0
        ):
            raise StoreInputError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        info = self._unit_by_id.get(unit_id)
        if info is None:
            info = UnitInfo(unit_id, len(self._units), node_id, device, capacity_bytes)
            self._units.append(info)
            self._unit_by_id[unit_id] = info
        else:
            info.node_id, info.device, info.capacity_bytes = node_id, device, capacity_bytes
            info.alive = True
        return info

    def units(self) -> list[UnitInfo]:
        """Registered units in shard order."""
        return list(self._units)

    def mark_unit_lost(self, unit_id: str, reason: str = "") -> dict[str, list[int]]:
        """Mark a unit dead; its samples become not ready. Returns them, per partition."""
        info = self._unit(unit_id)
        info.alive = False
        affected: dict[str, list[int]] = {}
        for name, part in self._partitions.items():
            n = part.n
            pos = np.flatnonzero((part.index[:n] >= 0) & (part.shard[:n] == info.shard))
            if not len(pos):
                continue
            lost = part.index[pos].tolist()
            affected[name] = lost
            part.losses += 1
            part.lost_unit = unit_id
            part.set_lost(pos, True)
            for field_name in list(part.ready):
                part.unset_ready(field_name, pos)
            for shapes in part.shapes.values():
                for i in lost:
                    shapes.pop(i, None)
            self._drop_empty_schemas(part)
        return affected

    def loss_count(self, partition: str) -> int:
        """How many unit losses took samples of ``partition`` so far (0 if it does not exist).

        A fetch notes it when it starts waiting; see :meth:`lost_since`.
        """
        part = self._partitions.get(partition)
        return 0 if part is None else part.losses

    def lost_since(self, partition: str, count: int) -> str | None:
        """The unit of the latest loss of ``partition``'s samples if there were more than
        ``count`` losses (a fetch waiting since then may wait for data that never comes), else
        None. Losses before ``count`` do not matter: later fetches wait for new data."""
        part = self._partitions.get(partition)
        if part is None or part.losses <= count:
            return None
        return part.lost_unit

    def lost_meta(self, partition: str) -> BatchMeta:
        """A meta (no fields) of ``partition``'s samples lost with their unit and not rewritten:
        clear them, or rewrite them once the unit registered again. Raises UnknownPartitionError.
        """
        part = self._part(partition)
        flags = part.flags[: part.n]
        pos = np.flatnonzero(
            (part.index[: part.n] >= 0) & (flags & LOST > 0) & (flags & STAGED == 0)
        )
        return self._meta(partition, part, pos, [])

    def check_readable(self, meta: BatchMeta) -> None:
        """Raise unless every field of ``meta`` can be read for every sample.

        UnitLostError (naming the unit) for samples whose unit died, UnknownFieldError for
        fields not written for some sample, plus :meth:`check_meta`'s errors.
        """
        lost = self.lost_positions(meta)
        if lost:
            pos, unit = next(iter(lost.items()))
            i, part_id = meta.global_indexes[pos], meta.partition_ids[pos]
            raise UnitLostError(unit, f"it held sample {i} of {part_id!r}")

    def lost_positions(self, meta: BatchMeta) -> dict[int, str]:
        """The positions of ``meta`` whose samples died with their unit, with its id.

        Raises :meth:`check_meta`'s errors, and UnknownFieldError for fields not written for
        some sample that is not lost.
        """
        self.check_meta(meta)
        lost: dict[int, str] = {}
        all_alive = all(u.alive for u in self._units)
        dead = np.asarray([not u.alive for u in self._units], dtype=bool)
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions[part_id]
            at = self._where.pos[_meta_arrays(meta, positions)[0]]
            if all_alive and not part.losses:  # nothing of it was ever lost
                live = at
            else:
                gone = (part.flags[at] & LOST > 0) | dead[part.shard[at]]
                for k in np.flatnonzero(gone).tolist():
                    lost[positions[k]] = self._units[int(part.shard[at[k]])].unit_id
                live = at[~gone]
            for name in meta.field_schemas:
                bits = part.ready.get(name)
                ok = bits[live] if bits is not None else np.zeros(len(live), dtype=bool)
                if not ok.all():
                    missing = part.index[live[~ok]][:8].tolist()
                    raise UnknownFieldError(
                        f"field {name!r} is not written for samples {missing} of {part_id!r}"
                    )
        return dict(sorted(lost.items()))

    # -- allocation and placement ----------------------------------------------------------

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
        (a group put must fit it: see :func:`check_group_size`).
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
            self._codes += 1
            part = self._partitions[partition] = _Partition(self._codes, created=serial)
            self._by_code[part.code] = partition
        staged = atomic and n > 0 and bool(schemas)
        reused = self._free.take(n)
        start = self._next_index
        self._next_index += n - len(reused)
        idx = np.concatenate([reused, np.arange(start, self._next_index)])
        if shards_by_env is not None:
            shards = np.asarray(shards_by_env, dtype=np.int32)
        else:
            shards = np.asarray(alive, dtype=np.int32)[idx % len(alive)]
        part.reserve(n)
        self._where.reserve(self._next_index)
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
        self._where.part[idx] = part.code
        self._where.pos[idx] = pos
        if fixed is not None:
            part.group_size = fixed
        if staged:
            self._staging[serial] = _Staging(partition, set(indexes), set(indexes), indexes)
        return BatchMeta(
            self.store_id,
            tuple(indexes),
            (partition,) * n,
            tuple(shards.tolist()),
            (serial,) * n,
            schemas,
            tuple(dict(c) for c in custom) if custom is not None else (),  # () : all empty
        )

    # -- data updates, put checks, column-wise puts ----------------------------------------

    def check_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> dict[str, dict[str, list[int]]]:
        """Raise unless fields ``schemas`` may be written onto ``meta``'s samples.

        ForeignMetaError/StaleMetaError (see :meth:`check_meta`), SchemaError (a field's
        schema would change), UnitLostError (a sample's unit is lost). Returns the rows the
        put adds (``{partition: {field: [indexes not holding it yet]}}``): what
        :meth:`drop_fields` removes again if the put fails.
        """
        self.check_meta(meta)
        for part_id in dict.fromkeys(meta.partition_ids):
            self.check_schemas(part_id, schemas)
        for shard in dict.fromkeys(meta.shards):
            if not self._units[shard].alive:
                raise UnitLostError(self._units[shard].unit_id)
        fresh: dict[str, dict[str, list[int]]] = {}
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions[part_id]
            idx = _meta_arrays(meta, positions)[0]
            at = self._where.pos[idx]
            for name in schemas:
                bits = part.ready.get(name)
                new = idx if bits is None else idx[~bits[at]]
                if len(new):
                    fresh.setdefault(part_id, {})[name] = new.tolist()
        return fresh

    def drop_fields(
        self, meta: BatchMeta, fresh: Mapping[str, Mapping[str, Sequence[int]]]
    ) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Undo a failed column-wise put: ``fresh`` (from :meth:`check_put`) is no longer
        ready, and a field no sample holds any more forgets its schema. Returns the rows the
        units delete: ``{shard: {partition: {field: [indexes]}}}``. Raises check_meta's errors.
        """
        self.check_meta(meta)
        in_meta = set(zip(meta.partition_ids, meta.global_indexes, strict=True))
        for part_id, fields in fresh.items():
            for name, indexes in fields.items():
                _check_name(name, "a field name")
                if any((part_id, i) not in in_meta for i in indexes):
                    raise StoreInputError("fresh rows must be samples of the meta")
        rows: dict[int, dict[str, dict[str, list[int]]]] = {}
        for part_id, fields in fresh.items():
            part = self._partitions[part_id]
            for name, indexes in fields.items():
                idx = list(indexes)
                at = self._where.pos[as_indexes(idx)]
                part.unset_ready(name, at)
                for i, shard in zip(idx, part.shard[at].tolist(), strict=True):
                    part.shapes.get(name, {}).pop(i, None)
                    rows.setdefault(shard, {}).setdefault(part_id, {}).setdefault(name, [])
                    rows[shard][part_id][name].append(i)
            self._drop_empty_schemas(part)
        return rows

    def on_data_update(
        self, unit_id: str, update: DataUpdate, settled: list[int] | None = None
    ) -> list[int]:
        """Record a unit's notification that it stored ``update``'s fields for its indexes;
        return the indexes that became ready (for an atomic put: none until its last write,
        then all of its samples but those lost with their unit meanwhile, which stay lost).
        ``settled``: extended with every sample of an atomic put this update completed (the
        ready ones and the lost ones: none of them is unwritten any more).

        Raises UnitLostError (unit marked lost), StoreInputError (unknown unit, samples not in
        the partition or not on this unit's shard), UnknownPartitionError, SchemaError.
        """
        info = self._unit(unit_id)
        if not info.alive:
            raise UnitLostError(unit_id, "it was marked lost; register it again first")
        if not isinstance(update, DataUpdate):
            raise StoreInputError(f"expected a DataUpdate, got {type(update).__name__}")
        part = self._part(update.partition)
        idx = list(update.indexes)
        idx_set = set(idx)
        if len(idx_set) != len(idx):
            raise StoreInputError("a data update names an index twice")
        arr = as_indexes(idx)
        found, at = self._positions(part, arr)
        found &= part.shard[np.where(found, at, 0)] == info.shard
        if not found.all():
            raise StoreInputError(
                f"samples {arr[~found][:8].tolist()} of {update.partition!r} are not allocated "
                f"on unit {unit_id!r}"
            )
        self._check_generation(part, at, update)
        merged: dict[str, FieldSchema] = {}
        for name, schema in update.schemas.items():
            if not isinstance(schema, FieldSchema):
                raise SchemaError(f"schema of field {name!r} is not a FieldSchema")
            old = part.schemas.get(name)
            merged[name] = schema if old is None else old.merged(schema, name)
        for name, shapes in update.sample_shapes.items():
            if name not in merged or len(shapes) != len(idx):
                raise StoreInputError(f"sample_shapes of field {name!r} do not fit the update")
        if not idx:
            return []
        if update.put_id is not None:  # a column-wise put: ready once all its units wrote
            return self.column_puts.on_update(update, self._apply_column_update)
        staged = part.flags[at] & STAGED > 0
        if not staged.any():
            self._apply_update(part, update, merged, at)
            return idx
        gens = part.gen[at]
        serial = int(gens[0])
        staging = self._staging.get(serial)
        if (
            not staged.all()
            or bool((gens != serial).any())
            or staging is None
            or staging.partition != update.partition
            or not idx_set <= staging.members
        ):
            raise StoreInputError("a data update mixes samples of different puts")
        waiting = staging.waiting - idx_set
        if waiting:  # more writes of this put are to come
            staging.waiting = waiting
            staging.updates.append(update)
            return []
        # The put's last write: check all its writes together, then make them ready at once.
        # (Nothing above changed the state: a SchemaError here leaves the put waiting.)
        updates = [*staging.updates, update]
        schemas = dict(part.schemas)
        for upd in updates:
            for name, schema in upd.schemas.items():
                old = schemas.get(name)
                schemas[name] = schema if old is None else old.merged(schema, name)
        del self._staging[serial]
        members = np.fromiter(staging.members, dtype=np.int64, count=len(staging.members))
        part.flags[self._where.pos[members]] &= ~np.uint8(STAGED)
        whole = len(staging.members) == len(staging.order)  # none of it was cleared
        applied = 0
        for k, upd in enumerate(updates):
            upd_idx = as_indexes(upd.indexes)
            pos = self._where.pos[upd_idx]
            keep = np.ones(len(pos), dtype=bool)
            if not whole:
                keep &= np.isin(upd_idx, members)
            if k < len(updates) - 1:  # written earlier: its unit may have died since
                keep &= part.flags[pos] & LOST == 0
            fields = {n: schemas[n] for n in upd.schemas}
            if keep.all():
                self._apply_update(part, upd, fields, pos)
                applied += len(pos)
                continue
            chosen = np.flatnonzero(keep).tolist()
            sub = DataUpdate(
                upd.partition,
                [upd.indexes[j] for j in chosen],
                dict(upd.schemas),
                {f: [shapes[j] for j in chosen] for f, shapes in upd.sample_shapes.items()},
            )
            self._apply_update(part, sub, fields, pos[keep])
            applied += len(chosen)
        if settled is not None:
            settled.extend(staging.members)
        if whole and applied == len(staging.order):
            return list(staging.order)
        order = as_indexes(staging.order)
        pos = self._where.pos[order]
        ok = part.flags[pos] & LOST == 0
        if not whole:
            ok &= np.isin(order, members)
        return order[ok].tolist()

    @staticmethod
    def _check_generation(part: _Partition, at: np.ndarray, update: DataUpdate) -> None:
        """Raise StaleMetaError unless the samples at positions ``at`` still belong to the
        allocation ``update.generation`` names (None: no check): a write of samples cleared
        meanwhile must never land on the samples their reused indexes hold now."""
        if update.generation is not None and len(at) and (part.gen[at] != update.generation).any():
            raise StaleMetaError(
                f"samples of {update.partition!r} were cleared during the put (allocation "
                f"{update.generation}); their indexes belong to another put now"
            )

    def _apply_column_update(
        self, update: DataUpdate, generations: Mapping[tuple[str, int], int]
    ) -> list[int]:
        """Apply one held update of a finished column-wise put to the samples that still
        exist with the generation they had when it began; returns their indexes."""
        part = self._partitions.get(update.partition)
        if part is None:
            return []
        arr = as_indexes(list(update.indexes))
        found, at = self._positions(part, arr)
        gens = part.gen[np.where(found, at, 0)].tolist()
        keep = [
            k
            for k, i in enumerate(update.indexes)
            if found[k] and gens[k] == generations.get((update.partition, i))
        ]
        sub = DataUpdate(
            update.partition,
            [update.indexes[k] for k in keep],
            dict(update.schemas),
            {f: [shapes[k] for k in keep] for f, shapes in update.sample_shapes.items()},
        )
        merged: dict[str, FieldSchema] = {}
        for name, schema in sub.schemas.items():
            old = part.schemas.get(name)
            try:
                merged[name] = schema if old is None else old.merged(schema, name)
            except SchemaError:  # another put changed the field meanwhile: not ready
                sub.sample_shapes.pop(name, None)
        sub.schemas = {k: v for k, v in sub.schemas.items() if k in merged}
        self._apply_update(part, sub, merged)
        return list(sub.indexes)

    def abort_column_put(self, put_id: int) -> dict[int, dict[str, dict[str, list[int]]]]:
        """Drop a column-wise put that will not finish (its client gave up or died): the rows
        it added that still exist, ``{shard: {partition: {field: [indexes]}}}``, for the units
        to delete. Unknown ids: nothing."""
        put = self.column_puts.end(put_id)
        rows: dict[int, dict[str, dict[str, list[int]]]] = {}
        if put is None:
            return rows
        for part_id, fields in put.fresh.items():
            part = self._partitions.get(part_id)
            if part is None:
                continue
            for name, indexes in fields.items():
                bits = part.ready.get(name)
                arr = as_indexes(list(indexes))
                found, at = self._positions(part, arr)
                safe = np.where(found, at, 0)
                if bits is not None:
                    found &= ~bits[safe]  # gone, or written by a later put
                gens, shards = part.gen[safe].tolist(), part.shard[safe].tolist()
                for k, i in enumerate(indexes):
                    if not found[k] or gens[k] != put.generations.get((part_id, i)):
                        continue
                    rows.setdefault(shards[k], {}).setdefault(part_id, {}).setdefault(name, [])
                    rows[shards[k]][part_id][name].append(i)
        return rows

    def begin_column_put(
        self, meta: BatchMeta, schemas: Mapping[str, FieldSchema]
    ) -> tuple[int, dict[str, dict[str, list[int]]]]:
        """:meth:`check_put`, then stage the put (see :mod:`store.controller.column_puts`): its id
        (for the units' data updates) and the rows it adds. Raises check_put's errors."""
        fresh = self.check_put(meta, schemas)
        samples = {
            (p, i): g
            for p, i, g in zip(
                meta.partition_ids, meta.global_indexes, meta.generations, strict=True
            )
        }
        return self.column_puts.begin(samples, fresh), fresh

    # -- fetches, samplers, consumption ----------------------------------------------------

    def ready_indexes(
        self, partition: str, fields: Sequence[str], task: str | None = None
    ) -> list[int]:
        """Samples (allocation order) holding all ``fields``; unconsumed by ``task`` if given."""
        names = _check_fields(fields)
        part = self._partitions.get(partition)
        if part is None:
            return []
        mask = part.mask(names, task)
        if mask is None:
            return []
        return part.index[np.flatnonzero(mask)].tolist()

    def _sampler(self, partition: str, task: str, spec: Any) -> Sampler:
        if spec is None or isinstance(spec, (str, Mapping)):
            key = (partition, task, repr(sorted(dict(make_sampler(spec).spec()).items())))
            if key not in self._samplers:
                self._samplers[key] = make_sampler(spec)
            return self._samplers[key]
        return make_sampler(spec)

    def try_fetch(
        self,
        partition: str,
        fields: Sequence[str],
        batch_size: int | None,
        *,
        task: str = "default",
        sampler: Any = None,
        mode: FetchMode | str = FetchMode.FETCH,
    ) -> BatchMeta | None:
        """A batch of ready samples unconsumed by ``task``, or None if not enough yet.

        ``mode`` FETCH (or ``"fetch"``) marks them consumed by ``task``; PEEK does not.
        ``batch_size`` None takes every candidate now (possibly none; never returns None). An
        unknown partition or field only means "not ready yet". ``sampler`` is a Sampler or a
        spec; a spec's sampler is kept per (partition, task) so seeded random draws advance. A
        sampler declaring itself sequential (its capabilities) gets the oldest candidates from
        the (task, fields) candidate set (O(batch)); other samplers get every candidate.
        Raises StoreInputError for bad arguments, StoreError for a sampler that picks
        samples that are not candidates.
        """
        _check_name(partition, "partition")
        _check_name(task, "task")
        names = _check_fields(fields)
        mode = FetchMode.of(mode)
        if batch_size is not None and (
            not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0
        ):
            raise StoreInputError(f"batch_size must be a positive int or None, got {batch_size!r}")
        chooser = self._sampler(partition, task, sampler)
        part = self._partitions.get(partition)
        if part is None:
            return None if batch_size is not None else BatchMeta(self.store_id, (), (), (), (), {})
        cand = part.tracker(task, names)
        before = cand.examined
        if batch_size is None:
            pos = cand.all()
        else:
            picked = self._pick(partition, part, cand, chooser, batch_size)
            if picked is None:
                return None
            pos = picked
        self.positions_examined += cand.examined - before
        if mode is FetchMode.FETCH:
            part.consume(task, pos)
        return self._meta(partition, part, pos, names)

    def _pick(
        self,
        partition: str,
        part: _Partition,
        cand: _Candidates,
        chooser: Sampler,
        batch_size: int,
    ) -> np.ndarray | None:
        """The positions ``chooser`` picks out of ``cand``, or None if too few."""
        caps = capabilities_of(chooser)
        group_size = caps.group_size or 1
        if caps.group_size is not None:
            self.check_group_n(part, partition, group_size)
            if part.group_size is None and batch_size % group_size == 0:
                part.group_size = group_size  # later group puts must fit it
        if cand.count < batch_size:
            return None
        if caps.sequential:
            return cand.take(batch_size)
        at = cand.all()
        candidates = part.index[at].tolist()
        where = self._where

        def group_of(index: int) -> Hashable:
            return part.group_of_pos(int(where.pos[index]), group_size)

        picked = chooser.select(candidates, batch_size, group_of)
        if picked is None:
            return None
        if len(set(picked)) != len(picked) or not set(picked) <= set(candidates):
            raise StoreError(f"sampler {chooser!r} picked samples that are not candidates")
        return where.pos[as_indexes(list(picked))]

    def reset_consumption(
        self, task: str | None, partition: str | None = None, meta: BatchMeta | None = None
    ) -> None:
        """Forget what ``task`` (None: every task, as TransferQueue) consumed, in
        ``partition`` or in every partition; with ``meta`` only its samples (e.g. the live
        part of a get that lost a unit) become unconsumed."""
        if task is not None:
            _check_name(task, "task")
        if meta is not None:
            self.check_meta(meta)
            if partition is not None and set(meta.partition_ids) - {partition}:
                raise StoreInputError(f"the meta's samples are not all in {partition!r}")
            for part_id, positions in _positions_by_partition(meta).items():
                part = self._partitions[part_id]
                at = self._where.pos[_meta_arrays(meta, positions)[0]]
                for t in list(part.consumed) if task is None else [task]:
                    part.unconsume(t, at)
            return
        parts = [self._part(partition)] if partition is not None else self._partitions.values()
        for part in parts:
            part.forget_task(task)

    # -- clears, aborts, release -----------------------------------------------------------

    def clear(self, meta: BatchMeta) -> ClearPlan:
        """Remove ``meta``'s samples (hidden at once); the plan names the rows units delete.
        Samples cleared already are skipped (clearing twice is a no-op, as in
        TransferQueue). The indexes become reusable only through :meth:`release`.

        Raises StoreInputError (not a BatchMeta, a forged shard), ForeignMetaError; nothing
        is removed then.
        """
        if not isinstance(meta, BatchMeta):
            raise StoreInputError(f"expected a BatchMeta, got {type(meta).__name__}")
        if meta.store_id != self.store_id:
            raise ForeignMetaError(f"the meta comes from store {meta.store_id!r}")
        live: dict[str, list[int]] = {}
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions.get(part_id)
            if part is None:
                continue
            idx, want_shard, want_gen = _meta_arrays(meta, positions)
            found, at = self._positions(part, idx)
            safe = np.where(found, at, 0)
            found &= part.gen[safe] == want_gen  # else cleared already (maybe reused)
            forged = found & (part.shard[safe] != want_shard)
            if forged.any():
                k = int(np.flatnonzero(forged)[0])
                raise StoreInputError(
                    f"the meta puts sample {int(idx[k])} of {part_id!r} on shard "
                    f"{int(want_shard[k])!r}; it lives on shard {int(part.shard[safe][k])} (a "
                    "forged or corrupted meta)"
                )
            live.setdefault(part_id, []).extend(at[found].tolist())
        plan = ClearPlan()
        for part_id, at_list in live.items():
            self._remove(part_id, np.unique(np.asarray(at_list, dtype=np.int64)), plan)
        return plan

    def clear_partition(self, partition: str) -> ClearPlan:
        """Remove a whole partition; see :meth:`clear`. Raises UnknownPartitionError."""
        part = self._part(partition)
        plan = ClearPlan()
        self._remove(partition, np.flatnonzero(part.index[: part.n] >= 0), plan)
        self._drop_partition(partition)
        return plan

    def _drop_partition(self, partition: str) -> None:
        part = self._partitions.pop(partition)
        del self._by_code[part.code]
        for key in [k for k in self._samplers if k[0] == partition]:
            del self._samplers[key]

    def committed(self, meta: BatchMeta) -> bool:
        """Whether the new put of ``meta`` committed: every one of its samples exists with
        its generation and none is staged any more (its last write arrived, so its samples
        became ready together; some may have been lost with a unit since)."""
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions.get(part_id)
            if part is None:
                return False
            idx, _, gens = _meta_arrays(meta, positions)
            found, at = self._positions(part, idx)
            safe = np.where(found, at, 0)
            found &= (part.gen[safe] == gens) & (part.flags[safe] & STAGED == 0)
            if not found.all():
                return False
        return bool(meta.global_indexes)

    def abort(self, meta: BatchMeta) -> ClearPlan:
        """Undo a failed put of new samples: :meth:`clear` them, and drop a partition that
        this put created and that is empty now (a failed put leaves no partition behind)."""
        plan = self.clear(meta)
        serials = set(meta.generations)
        for part_id in dict.fromkeys(meta.partition_ids):
            part = self._partitions.get(part_id)
            if part is not None and not part.live and part.created in serials:
                self._drop_partition(part_id)
        return plan

    def _remove(self, partition: str, at: np.ndarray, plan: ClearPlan) -> None:
        """Remove the samples at positions ``at`` (distinct, in allocation order)."""
        part = self._partitions[partition]
        idx_arr = part.index[at]
        indexes = idx_arr.tolist()
        staged = np.flatnonzero(part.flags[at] & STAGED > 0)
        if len(staged):
            gens = part.gen[at[staged]].tolist()
            for i, gen in zip(idx_arr[staged].tolist(), gens, strict=True):
                staging = self._staging.get(gen)
                if staging is not None:
                    staging.members.discard(i)
                    staging.waiting.discard(i)
                    if not staging.members:
                        del self._staging[gen]
        if part.key_at:
            for p in at.tolist():
                key = part.key_at.pop(p, None)
                if key is not None:
                    part.keys.pop(key, None)
        grouped = at[part.group[at] >= 0]
        for p in grouped.tolist():
            part.uncount_group(p)
        shards = part.shard[at]
        by_shard = plan.shards
        for shard in np.unique(shards).tolist():
            rows = idx_arr[shards == shard].tolist()
            by_shard.setdefault(shard, {}).setdefault(partition, []).extend(rows)
        self._pending.update(indexes)
        plan.indexes.extend(indexes)
        self._where.part[part.index[at]] = -1
        self._allocated -= len(indexes)
        for shapes in part.shapes.values():
            for i in indexes:
                shapes.pop(i, None)
        part.drop(at)
        self._drop_empty_schemas(part)
        if part.n >= 4096 and 4 * part.live < part.n:
            part.compact(self._where)

    def release(self, indexes: Iterable[int]) -> None:
        """Make cleared indexes reusable (after the units deleted their rows)."""
        idx = set(indexes)
        unknown = idx - self._pending
        if unknown:
            raise StoreInputError(f"indexes {sorted(unknown)[:8]} are not waiting for release")
        self._pending -= idx
        self._free.add(np.fromiter(idx, dtype=np.int64, count=len(idx)))

    # -- KV keys, group sizes, checkpoint export -------------------------------------------

    @staticmethod
    def check_new_keys(part: _Partition | None, keys: Sequence[str] | None, n: int) -> None:
        """Raise StoreInputError unless ``keys`` are ``n`` distinct non-empty str new to
        the partition."""
        if keys is None:
            return
        if len(keys) != n:
            raise StoreInputError(f"keys has {len(keys)} entries for {n} samples")
        if any(not isinstance(k, str) or not k for k in keys) or len(set(keys)) != n:
            raise StoreInputError("keys must be distinct non-empty str")
        taken = [k for k in keys if part is not None and k in part.keys]
        if taken:
            raise StoreInputError(f"keys {taken[:8]} already name samples of the partition")

    @staticmethod
    def check_group_n(part: _Partition, partition: str, n: int) -> None:
        """Raise StoreInputError if a grouped fetch's ``n`` differs from the partition's
        group size."""
        if part.group_size is not None and part.group_size != n:
            raise StoreInputError(
                f"the grouped fetch asks for groups of {n}, but partition {partition!r} holds "
                f"groups of {part.group_size}"
            )

    def group_size(self, partition: str) -> int | None:
        """The partition's fixed group size, if any. Raises UnknownPartitionError."""
        return self._part(partition).group_size

    def kv_lookup(self, partition: str, keys: Sequence[str]) -> tuple[BatchMeta, list[int]]:
        """The meta (with the fields every one of them holds) of the keys that exist, and
        the positions in ``keys`` of those that do not. Raises StoreInputError."""
        if isinstance(keys, str) or any(not isinstance(k, str) or not k for k in keys):
            raise StoreInputError("keys must be a list of non-empty str")
        if len(set(keys)) != len(keys):
            raise StoreInputError("keys must be distinct")
        part = self._partitions.get(partition)
        table = part.keys if part is not None else {}
        found = [table[k] for k in keys if k in table]
        missing = [pos for pos, k in enumerate(keys) if k not in table]
        if part is None:
            return BatchMeta(self.store_id, (), (), (), (), {}), missing
        at = self._where.pos[as_indexes(found)]
        names = self._ready_for_all(part, at) if found else []
        return self._meta(partition, part, at, names), missing

    def kv_meta(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """The meta of existing ``keys`` in order (``fields``: default all they hold).
        Raises UnknownPartitionError, UnknownKeyError, UnknownFieldError."""
        part = self._part(partition)
        meta, missing = self.kv_lookup(partition, keys)
        if missing:
            absent = [keys[p] for p in missing]
            raise UnknownKeyError(f"keys {absent[:8]} are not in partition {partition!r}")
        if fields is None:
            return meta
        at = self._where.pos[as_indexes(list(meta.global_indexes))]
        names = list(dict.fromkeys(fields))
        for f in names:
            bits = part.ready.get(f)
            if bits is None or not bits[at].all():
                raise UnknownFieldError(f"field {f!r} is not written for every key")
        return self._meta(partition, part, at, names)

    def _custom_of(self, part: _Partition, index: int) -> dict[str, Any]:
        return dict(part.custom.get(int(self._where.pos[index]), NO_CUSTOM))

    def kv_list(self, partition: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}`` (one partition, or every one that has keys); an
        unknown partition or one without keys lists as ``{}`` (as in TransferQueue)."""
        if partition is not None:
            part = self._partitions.get(partition)
            if part is None or not part.keys:
                return {}
            return {partition: {k: self._custom_of(part, i) for k, i in part.keys.items()}}
        return {
            name: {k: self._custom_of(p, i) for k, i in p.keys.items()}
            for name, p in self._partitions.items()
            if p.keys
        }

    def unconsume(self, task: str, partition: str, indexes: Iterable[int]) -> list[int]:
        """Hand ``indexes`` back to ``task`` (unconsumed again); cleared ones are skipped.
        Returns those handed back."""
        part = self._partitions.get(partition)
        if part is None or task not in part.consumed:
            return []
        idx = as_indexes(list(indexes))
        found, at = self._positions(part, idx)
        back = part.unconsume(task, at[found])
        return part.index[back].tolist()

    def mark_consumed(self, task: str, meta: BatchMeta) -> None:
        """Mark ``meta``'s samples consumed by ``task`` (restoring a checkpoint).
        Raises check_meta's errors, StoreInputError."""
        if not isinstance(task, str) or not task:
            raise StoreInputError(f"task must be a non-empty str, got {task!r}")
        self.check_meta(meta)
        for part_id, positions in _positions_by_partition(meta).items():
            at = self._where.pos[_meta_arrays(meta, positions)[0]]
            self._partitions[part_id].consume(task, np.unique(at))

    def consumers(self) -> dict[str, dict[str, int]]:
        """``{partition: {task: consumed count}}`` for monitoring."""
        return {name: dict(p.consumed_count) for name, p in self._partitions.items()}

    def export_partition(self, partition: str) -> dict[str, Any]:
        """Everything a checkpoint needs of ``partition`` except the data: samples in order
        (index, key, group, custom, fields ready), consumed per task, group size.
        Raises UnknownPartitionError."""
        part = self._part(partition)
        n = part.n
        keep = np.flatnonzero((part.index[:n] >= 0) & (part.flags[:n] == 0))
        ready = {f: bits[keep].tolist() for f, bits in part.ready.items()}
        samples = []
        for k, (p, i) in enumerate(zip(keep.tolist(), part.index[keep].tolist(), strict=True)):
            group = part.group_value(p)
            samples.append(
                {
                    "index": i,
                    "key": part.key_at.get(p),
                    "group": list(group) if isinstance(group, tuple) else group,
                    "custom": dict(part.custom.get(p, NO_CUSTOM)),
                    "fields": sorted(f for f, r in ready.items() if r[k]),
                }
            )
        consumed = {t: part.index[keep[bits[keep]]].tolist() for t, bits in part.consumed.items()}
        return {
            "samples": samples,
            "consumed": {t: sorted(c) for t, c in consumed.items()},
            "group_size": part.group_size,
        }
