"""ControllerState's columnar state: bytes per sample (tracemalloc counts), positions a fetch
examines (a counter, whatever the partition's size), and state that does not grow with a
partition's history."""

from __future__ import annotations

import tracemalloc

from rayless.store.controller.state import ControllerState
from rayless.store.data.schema import DataUpdate
from tests.unit.controller_state_helpers import I64, state_with_units

BATCH = 1024


def put(c: ControllerState, n: int, fields: tuple[str, ...] = ("x",)) -> list[int]:
    """Allocate ``n`` samples in "p" and report ``fields`` written, as the units do."""
    schemas = {f: I64 for f in fields}
    meta = c.allocate("p", n, schemas=schemas)
    for shard, positions in meta.by_shard().items():
        idx = [meta.global_indexes[p] for p in positions]
        c.on_data_update(f"u{shard}", DataUpdate("p", idx, schemas))
    return list(meta.global_indexes)


def fill(c: ControllerState, n: int, fields: tuple[str, ...] = ("x",)) -> list[int]:
    out: list[int] = []
    for start in range(0, n, BATCH):
        out += put(c, min(BATCH, n - start), fields)
    return out


def examined_by_fetch(c: ControllerState, task: str = "t") -> tuple[list[int], int]:
    before = c.positions_examined
    meta = c.try_fetch("p", ["x"], BATCH, task=task)
    assert meta is not None, "a full batch was ready"
    return list(meta.global_indexes), c.positions_examined - before


def test_memory_per_sample_at_100k_samples() -> None:
    fields = ("x", "y")
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        c = state_with_units(2)
        fill(c, 100_000, fields)
        got = c.try_fetch("p", list(fields), BATCH, task="t")  # a consumed bitmap, a set
        assert got is not None
        per_sample = (tracemalloc.get_traced_memory()[0] - base) / 100_000
    finally:
        tracemalloc.stop()
    assert per_sample <= 64 + len(fields), f"{per_sample:.1f} bytes per sample"


def test_a_fetch_examines_positions_by_batch_not_partition() -> None:
    counts = {}
    for size in (BATCH, 64 * BATCH):
        c = state_with_units(2)
        fill(c, size)
        order = c.ready_indexes("p", ["x"])
        got, examined = examined_by_fetch(c)
        assert got == order[:BATCH], "the oldest candidates first"
        counts[size] = examined
    assert counts[64 * BATCH] == counts[BATCH]
    assert counts[BATCH] <= 2 * BATCH


def test_fetch_stays_cheap_after_a_long_consumed_history_and_a_stuck_sample() -> None:
    c = state_with_units(2)
    first = c.allocate("p", 1, schemas={"x": I64})  # never written: never a candidate
    fill(c, 48 * BATCH)
    worst = 0
    seen: set[int] = set()
    for _ in range(47):
        got, examined = examined_by_fetch(c)
        assert not seen & set(got), "a sample fetched twice by one task"
        seen |= set(got)
        worst = max(worst, examined)
    assert first.global_indexes[0] not in seen
    assert worst <= 3 * BATCH, worst  # the 47th fetch costs what the first did


def test_out_of_order_readiness_and_handbacks_keep_allocation_order() -> None:
    c = state_with_units(1)
    metas = [c.allocate("p", 512, schemas={"x": I64}) for _ in range(4)]
    for meta in reversed(metas):  # written newest first
        c.on_data_update("u0", DataUpdate("p", list(meta.global_indexes), {"x": I64}))
    order = [i for m in metas for i in m.global_indexes]
    got = c.try_fetch("p", ["x"], 1000, task="t")
    assert got is not None and list(got.global_indexes) == order[:1000]
    back = c.unconsume("t", "p", order[10:20])
    assert back == order[10:20]
    again = c.try_fetch("p", ["x"], 20, task="t")
    assert again is not None and list(again.global_indexes) == order[10:20] + order[1000:1010]


def test_a_rolling_partition_does_not_grow_with_its_history() -> None:
    c = state_with_units(2)
    fill(c, 4 * BATCH)
    sizes = []
    for _ in range(300):  # 300k samples pass through a partition that holds 4k
        meta = c.try_fetch("p", ["x"], BATCH, task="t")
        assert meta is not None
        c.release(c.clear(meta).indexes)
        put(c, BATCH)
        sizes.append(c.state_bytes())
    assert max(sizes[100:]) <= max(sizes[:100])
    assert c.stats().high_water <= 5 * BATCH


def test_committed_follows_an_atomic_put_through_its_writes_and_a_clear() -> None:
    c = state_with_units(2)
    meta = c.allocate("p", 4, schemas={"x": I64}, atomic=True)
    parts = list(meta.by_shard().items())
    assert len(parts) == 2 and not c.committed(meta)
    for k, (shard, positions) in enumerate(parts):
        idx = [meta.global_indexes[p] for p in positions]
        c.on_data_update(f"u{shard}", DataUpdate("p", idx, {"x": I64}))
        assert c.committed(meta) == (k == 1), "committed only once every unit wrote"
    c.release(c.clear(meta).indexes)
    again = c.allocate("p", 4, schemas={"x": I64})  # the same indexes, a new generation
    assert sorted(again.global_indexes) == sorted(meta.global_indexes)
    assert not c.committed(meta)
