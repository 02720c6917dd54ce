"""The same-host data plane: shared-memory columns, one-copy puts and gets, zero-copy views,
their leases, and kill -9 of units and clients in the middle of it."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
from typing import Any

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from rayless.actors import Cluster
from rayless.store import PartialResultError, Store, StoreInputError, UnitLostError
from rayless.store.data.fields import FieldSchema
from rayless.transport import shm
from tests.chaos.scenarios import until
from tests.integration.zerocopy_classes import Holder
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _segments_of(pid: int) -> list[str]:
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"rayless-{pid}-")]


async def _pids(cluster: Cluster) -> dict[str, int]:
    return {a["name"]: int(a["pid"]) for n in await cluster.nodes() for a in n["actors"]}


async def _used(st: Store, shard: int = 0) -> int:
    return int((await st.units[shard]["handle"].stats()).used_bytes)


def _mixed(n: int, base: float = 0.0) -> TensorDict:
    return TensorDict(
        {
            "x": torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + base,
            "ids": torch.arange(n),
            "resp": torch.nested.as_nested_tensor(
                [torch.arange(i % 5 + 1) for i in range(n)], layout=torch.jagged
            ),
            "text": NonTensorStack.from_list([f"s{i}" for i in range(n)]),
        },
        [n],
    )


async def test_same_host_put_and_get_go_through_the_units_segments(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="zc-basic")
    td = _mixed(16)
    meta = await st.put(td, partition="p")
    pids = await _pids(local_cluster)
    for unit in st.units:
        assert _segments_of(pids[unit["unit_id"]]), "dense columns live in /dev/shm"
    back = await st.get(meta)
    assert st._plane._maps, "the client mapped the units' segments"
    assert torch.equal(back["x"], td["x"]) and torch.equal(back["ids"], td["ids"])
    assert back["text"] == td["text"]
    assert all(
        torch.equal(a, b) for a, b in zip(back["resp"].unbind(), td["resp"].unbind(), strict=True)
    )
    # a column-wise put onto the same samples, and a subset read back
    meta = await st.put(TensorDict({"y": torch.ones(16, 2)}, [16]), meta=meta)
    part = await st.get(meta.select([3, 7, 8]), ["x", "y"])
    assert torch.equal(part["x"], td["x"][[3, 7, 8]]) and torch.equal(part["y"], torch.ones(3, 2))
    await st.shutdown()
    for unit in st.units:  # the unit's exit unlinks its segments
        pid = pids[unit["unit_id"]]
        assert await until(lambda pid=pid: not _segments_of(pid), 20), _segments_of(pid)


async def test_a_view_never_sees_its_bytes_change_and_reuse_waits_for_it(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=1, name="zc-view")
    await st.put(TensorDict({"x": torch.zeros(64, 256)}, [64]), "p")  # keeps the column
    first = TensorDict({"x": torch.full((64, 256), 1.0)}, [64])
    meta = await st.put(first, partition="p")
    view = await st.get(meta, zero_copy=True)
    x = view["x"]
    assert torch.equal(x, first["x"])
    used = await _used(st)
    for k in range(2, 6):  # clear + put again while the view lives: never into its slots
        await st.clear(meta)
        meta = await st.put(TensorDict({"x": torch.full((64, 256), float(k))}, [64]), "p")
        assert torch.equal(x, first["x"]), "a view saw bytes change under it"
        assert torch.equal((await st.get(meta))["x"], torch.full((64, 256), float(k)))
    grown = await _used(st)
    assert grown > used, "with the view's lease held the column grows instead of reusing"
    del view, x
    gc.collect()  # the view's storage is freed: its lease is released
    for k in range(6, 10):
        await st.clear(meta)
        meta = await st.put(TensorDict({"x": torch.full((64, 256), float(k))}, [64]), "p")
        assert torch.equal((await st.get(meta))["x"], torch.full((64, 256), float(k)))
    assert await _used(st) == grown, "without leases freed slots are reused"


async def test_a_view_held_by_a_client_killed_with_sigkill_releases_its_lease(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the column's growth is what this test reads: no slots leased ahead of the next put
    monkeypatch.setenv("RAYLESS_STORE_LEASE", "0")
    st = await Store.create(local_cluster, num_units=1, name="zc-kill-reader")
    keep = await st.put(TensorDict({"x": torch.zeros(32, 128)}, [32]), partition="p")
    await st.get_meta("p", ["x"], 32, task="holder", timeout=10)  # not the holder's batch
    meta = await st.put(TensorDict({"x": torch.ones(32, 128)}, [32]), partition="p")
    holder = await local_cluster.spawn(Holder, "zc-kill-reader")
    assert await holder.hold_view("p", 32) == 32 * 128
    used = await _used(st)
    await st.clear(meta)
    meta = await st.put(TensorDict({"x": torch.ones(32, 128)}, [32]), partition="p")
    grown = await _used(st)
    assert grown > used  # the holder's lease keeps the old slots
    pid = await holder.pid()
    os.kill(pid, signal.SIGKILL)  # mid-get: the kernel drops its flock lease
    assert await until(lambda: not _alive(pid), 20)
    for _ in range(3):
        await st.clear(meta)
        meta = await st.put(TensorDict({"x": torch.full((32, 128), 2.0)}, [32]), "p")
    assert await _used(st) == grown  # reused again: no lease left
    assert torch.equal((await st.get(meta))["x"], torch.full((32, 128), 2.0))
    assert not _segments_of(pid), "a client creates no segments"
    assert torch.equal((await st.get(keep))["x"], torch.zeros(32, 128))


def _alive(pid: int) -> bool:
    return shm.pid_alive(pid)


async def test_a_client_killed_mid_put_loses_nothing_acknowledged(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="zc-kill-writer")
    acked = await st.put(TensorDict({"x": torch.arange(16.0)[:, None].expand(16, 4)}, [16]), "p")
    holder = await local_cluster.spawn(Holder, "zc-kill-writer")
    pid = await holder.pid()
    hanging = asyncio.ensure_future(holder.hang_in_put(8))

    async def reserved() -> bool:
        stats = [await u["handle"].stats() for u in st.units]
        return sum(s.reservations for s in stats) == 2

    assert await until(reserved, 20), "the put reserved its slots on both units"
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception):
        await hanging
    back = await st.get(acked)
    assert torch.equal(back["x"], torch.arange(16.0)[:, None].expand(16, 4))
    more = await st.put(TensorDict({"x": torch.ones(8, 4)}, [8]), "p")
    assert torch.equal((await st.get(more))["x"], torch.ones(8, 4))
    assert not _segments_of(pid)


async def test_a_unit_killed_mid_put_and_mid_get_leaves_no_segment(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rayless.store.samehost import plane

    # the copies run in threads (as big ones do), so the stalled copies below leave the
    # event loop free: inline, they would block it and the kills would come too late
    monkeypatch.setattr(plane, "INLINE_COPY_BYTES", -1)
    st = await Store.create(local_cluster, num_units=2, name="zc-kill-unit")
    acked = await st.put(TensorDict({"x": torch.arange(32.0)[:, None].expand(32, 8)}, [32]), "p")
    pids = await _pids(local_cluster)
    victim = pids[st.units[1]["unit_id"]]
    assert _segments_of(victim)
    # mid-get: the copy out of the victim's segment waits until the victim is dead
    gate, entered = threading.Event(), threading.Event()
    original = st._plane._copy_out

    def slow_copy(*args: Any) -> bool:
        entered.set()
        gate.wait(30)
        return original(*args)

    st._plane._copy_out = slow_copy  # type: ignore[method-assign]
    getting = asyncio.ensure_future(st.get(acked))
    assert await until(entered.is_set, 20)
    os.kill(victim, signal.SIGKILL)
    assert await until(lambda: not _segments_of(victim), 20), "the agent reaps its segments"
    gate.set()
    try:  # the mapped bytes outlive the unlinked file: the rows read are right
        back = await getting
        assert torch.equal(back["x"], acked_x(32))
    except (PartialResultError, UnitLostError):
        pass
    st._plane._copy_out = original  # type: ignore[method-assign]
    # the survivor's acknowledged samples are intact; new puts go on
    with pytest.raises(PartialResultError) as info:
        await st.get(acked)
    live = info.value.meta
    assert torch.equal(info.value.data["x"], acked_x(32)[list(live.global_indexes)])
    # mid-put: a put whose copy is under way when its unit dies
    gate2 = threading.Event()
    st2 = await Store.connect("zc-kill-unit", cluster=local_cluster)
    copy_in = st2._plane._copy_in

    def slow_in(*args: Any) -> bool:
        entered.set()
        gate2.wait(30)
        return copy_in(*args)

    st2._plane._copy_in = slow_in  # type: ignore[method-assign]
    entered.clear()
    survivor = pids[st.units[0]["unit_id"]]
    before = set(_segments_of(survivor))
    putting = asyncio.ensure_future(st2.put(TensorDict({"x": torch.ones(8, 8)}, [8]), "q"))
    assert await until(entered.is_set, 20)
    os.kill(survivor, signal.SIGKILL)
    assert await until(lambda: not _segments_of(survivor), 20)
    gate2.set()
    with pytest.raises(UnitLostError):
        await putting
    assert before  # it had segments, all reaped


def acked_x(n: int) -> torch.Tensor:
    return torch.arange(float(n))[:, None].expand(n, 8)


async def _no_reservations(st: Store) -> bool:
    return all([(await u["handle"].stats()).reservations == 0 for u in st.units])


async def test_rows_reserved_ahead_are_given_back_when_the_allocation_fails_or_goes_elsewhere(
    local_cluster: Cluster,
) -> None:
    # A same-host put reserves its dense rows while the controller allocates its samples
    # (guessing the controller's split); every reservation it does not use is released.
    st = await Store.create(local_cluster, num_units=2, name="zc-ahead")
    td = TensorDict({"x": torch.arange(32.0).reshape(8, 4)}, [8])
    meta = await st.put(td, partition="p", keys=[f"k{i}" for i in range(8)])
    assert await _no_reservations(st)
    with pytest.raises(StoreInputError):  # the keys are taken: the allocation fails
        await st.put(td, partition="p", keys=[f"k{i}" for i in range(8)])
    assert await until(lambda: _no_reservations(st), 10)
    # a unit the controller no longer counts: the guess (4 + 4 rows) is wrong for both
    await st.controller.unit_lost(st.units[1]["unit_id"], "test")
    moved = await st.put(td * 2, partition="q")
    assert set(moved.shards) == {0}
    assert await until(lambda: _no_reservations(st), 10)
    assert torch.equal((await st.get(moved))["x"], td["x"] * 2)
    assert torch.equal((await st.get(meta.select(list(range(4)))))["x"], td["x"][:4])
    await st.shutdown()


async def test_a_commit_whose_indexes_do_not_fit_a_reservation_by_count_is_refused(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=1, name="zc-count")
    await st.ready()
    unit = st.units[0]["handle"]
    wire = {"x": FieldSchema("dense", "float32", (4,))}
    for bad in (-1, True, "3"):
        with pytest.raises(StoreInputError):
            await unit.reserve("p", bad, wire)
    res = await unit.reserve("p", 3, wire)
    assert len(res.fields["x"].slots) == 3
    with pytest.raises(StoreInputError, match="2 indexes for a reservation of 3 rows"):
        await unit.commit(res.token, None, wire, 0.0, [0, 1])
    assert await _no_reservations(st)
    assert (await unit.stats()).used_bytes == 0  # nothing was written
    await st.shutdown()


async def test_a_get_that_locates_again_after_a_unit_died_returns_the_live_part(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # unit 0's copy finds its slots moved (it locates again) while unit 1 dies: the get must
    # raise PartialResultError with unit 0's rows, not a bare UnitLostError that drops the
    # live part of a consumed batch (a stress run lost 240 acknowledged samples so)
    from rayless.store.samehost import plane

    monkeypatch.setattr(plane, "INLINE_COPY_BYTES", -1)  # the copies run in threads
    st = await Store.create(local_cluster, num_units=2, name="zc-relocate")
    meta = await st.put(TensorDict({"x": torch.arange(8.0).reshape(8, 1)}, [8]), "p")
    entered, go = threading.Event(), threading.Event()
    original = st._plane._copy_out
    first = [True]

    def moved_once(*args: Any) -> bool:
        if args[2] and args[2][0] == 0 and first[0]:  # unit 0's group, first copy
            first[0] = False
            entered.set()
            go.wait(60)
            return False  # as if a clear had reclaimed the slots: locate again
        return original(*args)

    st._plane._copy_out = moved_once  # type: ignore[method-assign]
    getting = asyncio.ensure_future(st.get(meta))
    try:
        await wait_until(entered.is_set, 30, "the get to reach unit 0's copy")
        await local_cluster.kill(st.units[1]["handle"])

        async def marked_lost() -> bool:
            return (await st.lost_samples("p")).size > 0

        await wait_until(marked_lost, 30, "the controller to mark unit 1 lost")
    finally:
        go.set()
    with pytest.raises(PartialResultError) as info:
        await getting
    by_shard = meta.by_shard()
    assert sorted(info.value.meta.global_indexes) == sorted(
        meta.global_indexes[p] for p in by_shard[0]
    )
    assert torch.equal(info.value.data["x"].flatten(), torch.tensor([0.0, 1.0, 2.0, 3.0]))
    assert sorted(info.value.lost.global_indexes) == sorted(
        meta.global_indexes[p] for p in by_shard[1]
    )
    await st.shutdown()


async def test_a_unit_killed_by_the_cluster_is_marked_lost_without_a_client_touching_it(
    local_cluster: Cluster,
) -> None:
    # cluster.kill stops a unit gracefully: its death watch returned normally, which the
    # controller took for nothing, so its samples stayed "ready" until a client tripped on it
    st = await Store.create(local_cluster, num_units=2, name="zc-watch")
    meta = await st.put(TensorDict({"x": torch.arange(8.0).reshape(8, 1)}, [8]), "p")
    await local_cluster.kill(st.units[1]["handle"])

    async def lost() -> int:
        return int((await st.production_status("p"))["lost"])

    assert await wait_until(lost, 30, "the controller to mark the killed unit lost") == 4
    assert sorted((await st.lost_samples("p")).global_indexes) == sorted(
        meta.global_indexes[p] for p in meta.by_shard()[1]
    )
    await st.shutdown()


async def test_clear_partition_returns_once_the_partitions_lease_is_back_on_the_units(
    local_cluster: Cluster,
) -> None:
    # verl's pattern: put into a new partition, get, clear_partition, every step. A put
    # leases its next rows in its partition (spare slots reserved on the units); the clear
    # cannot renew that lease (the partition is gone), so it is given back, and
    # clear_partition returns only once it is: the units have dropped the partition's
    # columns (pooling their segments) before the next step's put. Before, the give-back ran
    # in the background, after the next put had made (zero-filled, faulted in) new segments
    # on every unit: a fresh partition's 16 MiB put took 16.5 ms against 5.5 ms.
    st = await Store.create(local_cluster, num_units=2, name="zc-steps")
    await st.ready()
    td = TensorDict({"x": torch.randn(256, 1024)}, [256])
    for i in range(4):
        await st.put(td, partition=f"step-{i}")
        meta = await st.get_meta(f"step-{i}", ["x"], 256, task="train", timeout=30)
        assert torch.equal((await st.get(meta))["x"], td["x"])
        await st.clear_partition(f"step-{i}")
        assert not st._leases._tasks, "the give-back is done when clear_partition returns"
        for unit in st.units:
            stats = await unit["handle"].stats()
            assert (stats.spare, stats.used_bytes) == (0, 0), (i, stats)
    await st.shutdown()
