"""A unit whose shared memory (/dev/shm) is exhausted refuses writes with StoreFullError naming
/dev/shm (socket writes and same-host reservations), leaves nothing half-made, and fences the
slots of dropped reservations until a reclaim under the exclusive lease."""

from __future__ import annotations

import errno

import pytest
import torch
from tensordict import TensorDict

from rayless.store.data.schema import FieldSchema
from rayless.store.errors import StoreFullError, StoreInputError
from rayless.store.samehost.columns import ShmDense, drain_pool
from rayless.store.unit.actor import StorageUnit, reservation_ttl
from rayless.store.unit.shard import ShardStorage
from rayless.transport.errors import error_from_state, error_to_state
from rayless.transport.segments import Segment

WIRE = {"x": FieldSchema("dense", "float32", (4,))}


def _no_room(code: int) -> object:
    def create(payload_bytes: int) -> Segment:
        raise OSError(code, f"injected: {errno.errorcode[code]}")

    return staticmethod(create)


def test_a_socket_write_into_a_full_dev_shm_is_a_store_full_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drain_pool()  # (a pooled segment of this process's earlier tests would take the write)
    shard = ShardStorage("u0", "cpu", None, dense_type=ShmDense)
    monkeypatch.setattr(Segment, "create", _no_room(errno.ENOSPC))
    td = TensorDict({"x": torch.ones(2, 4), "y": torch.ones(2, 3)}, [2])
    with pytest.raises(StoreFullError, match="/dev/shm") as info:
        shard.write("p", [0, 1], td)
    assert shard.partitions() == [] and shard.used_bytes == 0, "nothing half-written"
    back = error_from_state(error_to_state(info.value))  # what a remote caller rebuilds
    assert type(back) is StoreFullError and "/dev/shm" in str(back) and back.unit == "u0"
    monkeypatch.setattr(Segment, "create", _no_room(errno.EMFILE))
    with pytest.raises(OSError) as other:  # not a lack of room: the error itself
        shard.write("p", [0, 1], td)
    assert not isinstance(other.value, StoreFullError)


async def test_a_reservation_in_a_full_dev_shm_is_a_store_full_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drain_pool()  # (a pooled segment of this process's earlier tests would take the write)
    unit = StorageUnit("u1", None)
    try:
        monkeypatch.setattr(Segment, "create", _no_room(errno.ENOSPC))
        with pytest.raises(StoreFullError, match="/dev/shm"):
            await unit.reserve("p", 4, WIRE, 0.0)
        assert unit.shard.partitions() == [] and not unit._reservations
        monkeypatch.undo()
        res = await unit.reserve("p", 4, WIRE, 0.0)  # room again: the same call works
        assert len(res.fields["x"].slots) == 4
    finally:
        await unit.teardown()


def test_dropped_reservation_slots_stay_fenced_while_a_writer_holds_the_lease() -> None:
    col = ShmDense(FieldSchema("dense", "float32", (4,)), torch.device("cpu"))
    try:
        col.grow(8)
        slots = col.take_slots(4)
        fence = col.fence
        assert col.segment is not None and col.segment.fence == fence
        writer = Segment.open(col.segment.name)  # a same-host client's mapping
        try:
            assert writer.lock(False, False)  # it copies under a shared lease
            col.fenced.extend(slots)  # the reservation was dropped meanwhile
            assert not col.reclaim() and col.free == [], "never freed under a writer's lease"
            writer.unlock()
            assert col.reclaim() and sorted(col.free) == sorted(slots)
            assert writer.fence != fence, "a writer that wakes now finds another fence"
        finally:
            writer.close()
    finally:
        col.close()  # pools the segment for reuse, as a unit's dropped column does
        drain_pool()  # the unit's exit: nothing of this process's stays in /dev/shm


def test_a_dropped_column_with_reserved_slots_is_pooled_and_a_late_writer_is_fenced_out() -> None:
    # A same-host put leases its next rows in the partition; verl clears the partition and
    # puts into a new one, so those slots stay reserved when the column is dropped. The
    # segment is pooled all the same (before, a reservation sent it to unlink: every step
    # created, zero-filled and faulted in new segments), and a writer that comes with the old
    # reservation afterwards finds another fence; one copying at the drop keeps it unpooled.
    schema = FieldSchema("dense", "float32", (4,))
    try:
        col = ShmDense(schema, torch.device("cpu"))
        col.grow(16)
        col.write(list(range(8)), torch.ones(8, 4))
        col.take_slots(8)  # the lease's spare rows
        col.pending += 8
        seg, fence = col.segment, col.fence
        assert seg is not None
        late = Segment.open(seg.name)
        col.close()  # clear_partition
        nxt = ShmDense(schema, torch.device("cpu"))
        nxt.grow(16)
        assert nxt.segment is not None and nxt.segment.name == seg.name  # reused
        try:
            assert late.lock(False, False)
            assert late.fence != fence, "the old reservation's writer must copy nothing"
            late.unlock()
        finally:
            late.close()
        busy = Segment.open(nxt.segment.name)
        try:
            assert busy.lock(False, False)  # a writer copying right now
            name = nxt.segment.name
            nxt.close()
            again = ShmDense(schema, torch.device("cpu"))
            again.grow(16)
            assert again.segment is not None and again.segment.name != name  # not pooled
            again.close()
        finally:
            busy.unlock()
            busy.close()
    finally:
        drain_pool()


def test_reservation_ttl_is_checked() -> None:
    assert reservation_ttl(None) > 0 and reservation_ttl(2.5) == 2.5
    for bad in (0, -1, float("nan"), float("inf"), "x", True):
        with pytest.raises(StoreInputError):
            reservation_ttl(bad)  # type: ignore[arg-type]


def test_a_partition_per_step_reuses_its_columns_segments_and_grows_them_in_place() -> None:
    # verl's pattern: each step's partition gets a column of the put's rows, which the
    # client's lease then grows to twice that; the step's clear_partition drops the column.
    # Before, the next step's column (asking for the put's rows again) found no pooled
    # segment of exactly that size: a new one was created and zero-filled, and the lease's
    # growth copied the rows into another.
    schema = FieldSchema("dense", "float32", (4,))
    names = []
    try:
        for step in range(4):
            col = ShmDense(schema, torch.device("cpu"))
            col.grow(8)  # the put's rows
            col.write(list(range(8)), torch.full((8, 4), float(step)))
            first = col.segment
            col.grow(16)  # the lease's spare slots
            assert col.segment is not None
            if step:  # a pooled segment of twice the rows: the growth is in place
                assert col.segment is first
            assert torch.equal(col.read(list(range(8))), torch.full((8, 4), float(step)))
            names.append(col.segment.name)
            col.close()  # clear_partition
        assert len(set(names[1:])) == 1, names  # every step after the first: one segment
    finally:
        drain_pool()
