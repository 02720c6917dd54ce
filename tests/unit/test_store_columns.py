"""Shared-memory dense columns: copy-on-write slots, reclaim only without leases, cleanup."""

from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict

from rayless.store.samehost.columns import ShmDense, drain_pool
from rayless.store.samehost.columns_cuda import LEASE_BYTES, CudaDense
from rayless.store.unit.shard import ShardStorage
from rayless.transport import shm
from rayless.transport.segments import Segment


def _shard() -> ShardStorage:
    return ShardStorage("u", "cpu", None, dense_type=ShmDense)


def _col(st: ShardStorage) -> ShmDense:
    col = st._parts["p"]["x"]
    assert isinstance(col, ShmDense)
    return col


def test_rows_live_in_a_segment_and_overwrites_take_fresh_slots() -> None:
    st = _shard()
    st.write("p", [0, 1, 2, 3], TensorDict({"x": torch.arange(8.0).reshape(4, 2)}, [4]))
    col = _col(st)
    assert col.segment is not None and os.path.exists(os.path.join(shm.SHM_DIR, col.segment.name))
    before = dict(col.slot_of)
    st.write("p", [1], TensorDict({"x": torch.tensor([[9.0, 9.0]])}, [1]))
    assert col.slot_of[1] != before[1] and before[1] in col.quarantine  # copy-on-write
    assert torch.equal(col.data[before[1]], torch.tensor([2.0, 3.0]))  # old bytes untouched
    assert torch.equal(st.read("p", [1])["x"], torch.tensor([[9.0, 9.0]]))
    st.close()
    drain_pool()


def test_freed_slots_are_reused_only_while_no_reader_holds_a_lease() -> None:
    st = _shard()
    st.write("p", list(range(8)), TensorDict({"x": torch.ones(8, 4)}, [8]))
    col = _col(st)
    assert col.segment is not None
    reader = Segment.open(col.segment.name)
    assert reader.lock(False, False)  # a reader's shared lease
    generation = col.generation
    st.delete("p", [0, 1])
    assert not col.reclaim() and col.generation == generation  # leased: no reuse
    reader.unlock()
    assert col.reclaim() and col.generation > generation  # readers must locate again
    assert reader.version == col.generation
    reader.close()
    st.close()
    drain_pool()


def test_dropped_columns_give_their_segments_back() -> None:
    st = _shard()
    st.write("p", [0, 1], TensorDict({"x": torch.ones(2, 4)}, [2]))
    name = _col(st).segment.name  # type: ignore[union-attr]
    st.delete("p", [0, 1])  # the column is dropped: its segment is pooled or unlinked
    assert "p" not in st._parts
    drain_pool()
    assert not os.path.exists(os.path.join(shm.SHM_DIR, name))


def _cuda_style_shard() -> ShardStorage:
    # CudaDense on the CPU: the same column with its tensor in ordinary memory (only export
    # needs CUDA), so its lease segment and slot logic run here too.
    return ShardStorage("u", "cpu", None, dense_type=CudaDense)


def test_a_device_column_keeps_its_leases_and_generation_in_a_small_segment() -> None:
    st = _cuda_style_shard()
    st.write("p", list(range(8)), TensorDict({"x": torch.arange(32.0).reshape(8, 4)}, [8]))
    col = st._parts["p"]["x"]
    assert isinstance(col, CudaDense) and col.segment is not None
    assert col.segment.payload_bytes == LEASE_BYTES  # not the rows: those are col.data
    assert col.data.untyped_storage().data_ptr() != 0
    lease = Segment.open(col.segment.name)
    assert lease.version == col.generation
    assert lease.lock(False, False)  # a client's shared lease
    generation = col.generation
    st.delete("p", [0, 1])
    assert not col.reclaim() and col.generation == generation  # leased: no reuse
    lease.unlock()
    assert col.reclaim() and lease.version == col.generation > generation
    # growing moves to a new tensor and a new lease segment; the old one is unlinked
    old_name = col.segment.name
    st.write("p", list(range(100, 140)), TensorDict({"x": torch.ones(40, 4)}, [40]))
    assert col.segment.name != old_name and col.capacity >= 46
    assert not os.path.exists(os.path.join(shm.SHM_DIR, old_name))
    assert torch.equal(st.read("p", [2, 3])["x"], torch.arange(8.0, 16.0).reshape(2, 4))
    lease.close()
    name = col.segment.name
    st.close()  # a dropped device column unlinks its lease segment (nothing is pooled)
    assert not os.path.exists(os.path.join(shm.SHM_DIR, name))


def test_only_a_column_on_a_cuda_device_can_be_exported() -> None:
    st = _cuda_style_shard()
    st.write("p", [0], TensorDict({"x": torch.ones(1, 2)}, [1]))
    col = st._parts["p"]["x"]
    assert isinstance(col, CudaDense)
    with pytest.raises(RuntimeError, match="CUDA"):
        col.export()
    st.close()
