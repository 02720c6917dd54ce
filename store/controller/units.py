"""Units: the controller's registered storage units, and the samples lost with them.

Units are numbered by shard in registration order; a unit that registers again under its id
(a restart) keeps its shard and comes back alive. A unit loss marks its samples lost (not
ready); only fetches waiting through the loss are told (:meth:`Units.lost_since`), later ones
wait for new data.
"""

from __future__ import annotations

import numpy as np

from rayless.store.controller.catalog import Catalog, meta_arrays
from rayless.store.controller.records import (
    LOST,
    STAGED,
    UnitInfo,
    _check_name,
    _positions_by_partition,
)
from rayless.store.data.meta import BatchMeta
from rayless.store.errors import StoreInputError, UnitLostError, UnknownFieldError

__all__ = ["Units"]


class Units:
    """The registered storage units of one store (see the module docstring)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._units: list[UnitInfo] = []
        self._by_id: dict[str, UnitInfo] = {}

    def __len__(self) -> int:
        return len(self._units)

    def __getitem__(self, shard: int) -> UnitInfo:
        """The unit of shard ``shard``."""
        return self._units[shard]

    def all(self) -> list[UnitInfo]:
        """Registered units in shard order."""
        return list(self._units)

    def alive_shards(self) -> list[int]:
        """The shard numbers of live units, ascending."""
        return [u.shard for u in self._units if u.alive]

    def get(self, unit_id: str) -> UnitInfo:
        """The unit ``unit_id``. Raises StoreInputError for an unknown id."""
        info = self._by_id.get(unit_id)
        if info is None:
            raise StoreInputError(f"unknown storage unit {unit_id!r}")
        return info

    def register(
        self,
        unit_id: str,
        *,
        node_id: str | None = None,
        device: str = "cpu",
        capacity_bytes: int | None = None,
    ) -> UnitInfo:
        """Register a storage unit (its handshake) and return its info with its shard number.

        A known id registers again (after a restart): it keeps its shard and comes back alive;
        samples lost with it stay not ready until rewritten. Raises StoreInputError.
        """
        _check_name(unit_id, "unit_id")
        _check_name(device, "device")
        if capacity_bytes is not None and (
            not isinstance(capacity_bytes, int) or capacity_bytes < 0
        ):
            raise StoreInputError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        info = self._by_id.get(unit_id)
        if info is None:
            info = UnitInfo(unit_id, len(self._units), node_id, device, capacity_bytes)
            self._units.append(info)
            self._by_id[unit_id] = info
        else:
            info.node_id, info.device, info.capacity_bytes = node_id, device, capacity_bytes
            info.alive = True
        return info

    def mark_lost(self, unit_id: str) -> dict[str, list[int]]:
        """Mark a unit dead; its samples become not ready. Returns them, per partition.
        Raises StoreInputError for an unknown unit."""
        info = self.get(unit_id)
        info.alive = False
        affected: dict[str, list[int]] = {}
        for name, part in self._catalog.partitions.items():
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
            self._catalog.drop_empty_schemas(part)
        return affected

    def loss_count(self, partition: str) -> int:
        """How many unit losses took samples of ``partition`` so far (0 if it does not exist)."""
        part = self._catalog.partitions.get(partition)
        return 0 if part is None else part.losses

    def lost_since(self, partition: str, count: int) -> str | None:
        """The unit of the latest loss of ``partition``'s samples if there were more than
        ``count`` losses, else None."""
        part = self._catalog.partitions.get(partition)
        if part is None or part.losses <= count:
            return None
        return part.lost_unit

    def lost_meta(self, partition: str) -> BatchMeta:
        """A meta (no fields) of ``partition``'s samples lost with their unit and not
        rewritten. Raises UnknownPartitionError."""
        part = self._catalog.part(partition)
        flags = part.flags[: part.n]
        pos = np.flatnonzero(
            (part.index[: part.n] >= 0) & (flags & LOST > 0) & (flags & STAGED == 0)
        )
        return self._catalog.meta(partition, part, pos, [])

    def lost_positions(self, meta: BatchMeta) -> dict[int, str]:
        """The positions of ``meta`` whose samples died with their unit, with its id.

        Raises the catalog's meta check errors, and UnknownFieldError for fields not written
        for some sample that is not lost.
        """
        catalog = self._catalog
        catalog.check_meta(meta)
        lost: dict[int, str] = {}
        all_alive = all(u.alive for u in self._units)
        dead = np.asarray([not u.alive for u in self._units], dtype=bool)
        for part_id, positions in _positions_by_partition(meta).items():
            part = catalog.partitions[part_id]
            at = catalog.where.pos[meta_arrays(meta, positions)[0]]
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

    def check_readable(self, meta: BatchMeta) -> None:
        """Raise UnitLostError (naming the unit) for samples of ``meta`` whose unit died, and
        :meth:`lost_positions`'s errors."""
        lost = self.lost_positions(meta)
        if lost:
            pos, unit = next(iter(lost.items()))
            i, part_id = meta.global_indexes[pos], meta.partition_ids[pos]
            raise UnitLostError(unit, f"it held sample {i} of {part_id!r}")
