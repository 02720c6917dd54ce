"""ControllerState's units and unit loss.

Units register by handshake and get shard numbers in registration order (a unit that
registers again keeps its shard). A unit loss marks its samples lost (not ready); the
partition counts its losses so that only fetches waiting through one are told
(:meth:`StateUnits.lost_since`), and a read names the lost unit
(:meth:`StateUnits.lost_positions`, :meth:`StateUnits.check_readable`).
"""

from __future__ import annotations

from rayless.store.errors import (
    StoreInputError,
    UnitLostError,
    UnknownFieldError,
)
from rayless.store.meta import BatchMeta
from rayless.store.state_metas import StateMetas
from rayless.store.state_records import (
    UnitInfo,
    _check_name,
    _positions_by_partition,
)

__all__ = ["StateUnits"]


class StateUnits(StateMetas):
    """Unit registration and loss of :class:`ControllerState`."""

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
            lost = [i for i, s in part.samples.items() if s.shard == info.shard]
            if not lost:
                continue
            affected[name] = lost
            part.losses += 1
            part.lost_unit = unit_id
            lost_set = set(lost)
            for i in lost:
                part.samples[i].lost_on = unit_id
            for ready in part.ready.values():
                ready -= lost_set
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
        lost = [i for i, s in part.samples.items() if s.lost_on is not None and not s.staged]
        return self._meta(partition, part, lost, [])

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
        for part_id, positions in _positions_by_partition(meta).items():
            part = self._partitions[part_id]
            live: list[int] = []
            if all_alive and not part.losses:  # nothing of it was ever lost
                live = [meta.global_indexes[pos] for pos in positions]
                positions = []
            for pos in positions:
                sample = part.samples[meta.global_indexes[pos]]
                if sample.lost_on is not None:
                    lost[pos] = sample.lost_on
                elif not self._units[sample.shard].alive:
                    lost[pos] = self._units[sample.shard].unit_id
                else:
                    live.append(meta.global_indexes[pos])
            for name in meta.field_schemas:
                ready = part.ready.get(name, set())
                missing = [] if ready.issuperset(live) else [i for i in live if i not in ready]
                if missing:
                    raise UnknownFieldError(
                        f"field {name!r} is not written for samples {missing[:8]} of {part_id!r}"
                    )
        return dict(sorted(lost.items()))
