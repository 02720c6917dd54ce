"""Shared-memory dense columns: copy-on-write slots, reclaim only without leases, cleanup."""

from __future__ import annotations

import os

import torch
from tensordict import TensorDict

from rayless.store.columns import ShmDense, drain_pool
from rayless.store.segments import Segment
from rayless.store.shard import ShardStorage
from rayless.transport import shm


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
