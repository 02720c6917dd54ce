"""Leases of a client's next put (store.client.leases): the allocation and the same-host slots
made ahead, taken by the next put of the same shape, and every way they go stale (another
client's clear, the reaper, a dead unit, a full unit, the client's close or death), on real
local clusters."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.store import Store, StoreFullError
from rayless.store.client.leases import LeaseState
from tests.integration.lease_classes import LeaseHolder
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _td(rows: int, value: float, width: int = 8) -> TensorDict:
    return TensorDict({"x": torch.full((rows, width), value)}, [rows])


async def _leased(st: Store) -> bool:
    """Whether ``st`` holds a lease whose allocation the controller made."""
    lease = st._leases._lease
    return lease is not None and lease.allocation.done() and lease.allocation.result() is not None


async def _unit_stats(st: Store) -> list[dict[str, Any]]:
    return [(await u["handle"].stats()).as_dict() for u in st.units]


async def test_the_next_put_takes_the_lease_and_users_see_only_committed_samples(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-counts")
    first = await st.put(_td(8, 1.0), "p")
    await wait_until(lambda: _leased(st), 30, "the lease of the next put")
    stats = await st.stats()
    assert stats["leased"] == 8 and stats["allocated"] == 8 and stats["staged"] == 0
    assert (await st.production_status("p"))["samples"] == 8  # the leased 8 are not samples
    assert (await st.consumption_status("p", "t"))["samples"] == 8
    assert sum(s["spare"] for s in await _unit_stats(st)) == 2  # a reservation per unit
    now = await st.get_meta("p", ["x"], None, task="t", timeout=0)
    assert sorted(now.global_indexes) == sorted(first.global_indexes)
    second = await st.put(_td(8, 2.0), "p")
    assert st._leases.taken == 1 and st._leases.retried == 0
    assert not set(second.global_indexes) & set(first.global_indexes)
    assert torch.equal((await st.get(second))["x"], torch.full((8, 8), 2.0))
    other = await st.put(_td(4, 3.0), "p")  # another shape: the usual way, then its lease
    assert st._leases.taken == 1 and st._leases.state is LeaseState.HELD
    assert torch.equal((await st.get(other))["x"], torch.full((4, 8), 3.0))
    assert (await st.production_status("p"))["samples"] == 20

    async def swapped() -> bool:  # the lease of 8 was given back, one of 4 made
        stats = await st.stats()
        return bool(stats["leased"] == 4 and stats["free"] == 8)

    await wait_until(swapped, 30, "the lease to follow the latest shape")
    await st.shutdown()


async def test_put_clear_put_takes_the_freed_indexes_through_the_lease(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-reuse")
    for k in range(4):
        meta = await st.put(_td(8, float(k)), "p")
        if k:
            assert sorted(meta.global_indexes) == list(range(8))  # as without a lease
        assert torch.equal((await st.get(meta))["x"], torch.full((8, 8), float(k)))
        await st.clear(meta)
    assert st._leases.taken == 3 and st._leases.retried == 0
    stats = await st.stats()
    assert stats["allocated"] == 0 and stats["leased"] == 8
    await st.shutdown()


async def test_a_lease_fixes_no_dtype(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-dtype")
    meta = await st.put(TensorDict({"x": torch.arange(8)}, [8]), "p")  # int64; leases int64
    await wait_until(lambda: _leased(st), 30, "the lease of the next put")
    await st.clear(meta)  # no sample holds x: it may come back as anything (as without a lease)
    floats = await st.put(_td(8, 1.5), "p")
    assert torch.equal((await st.get(floats))["x"], torch.full((8, 8), 1.5))
    await st.shutdown()


async def test_clients_sharing_a_connection_keep_their_own_leases(
    local_cluster: Cluster,
) -> None:
    a = await Store.create(local_cluster, num_units=2, name="lease-shared")
    b = await Store.connect("lease-shared", cluster=local_cluster)  # the same connection
    mine = await a.put(_td(8, 1.0), "p")
    await b.put(_td(8, 2.0), "p")
    await wait_until(lambda: _leased(a), 30, "a's lease")
    await wait_until(lambda: _leased(b), 30, "b's lease")
    assert (await a.stats())["leased"] == 16
    await a.clear(mine)  # renews a's lease, not b's
    again = await a.put(_td(8, 3.0), "p")
    theirs = await b.put(_td(8, 4.0), "p")
    assert a._leases.retried == 0 and b._leases.retried == 0
    assert a._leases.taken == 1 and b._leases.taken == 1
    assert torch.equal((await a.get(again))["x"], torch.full((8, 8), 3.0))
    assert torch.equal((await b.get(theirs))["x"], torch.full((8, 8), 4.0))
    await b.aclose()
    await a.shutdown()


async def test_two_concurrent_puts_of_one_client_both_land(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-concurrent")
    await st.put(_td(8, 0.0), "p")
    await wait_until(lambda: _leased(st), 30, "the lease of the next put")
    metas = await asyncio.gather(st.put(_td(8, 1.0), "p"), st.put(_td(8, 2.0), "p"))
    assert st._leases.taken >= 1
    assert not set(metas[0].global_indexes) & set(metas[1].global_indexes)
    for value, meta in zip((1.0, 2.0), metas, strict=True):
        assert torch.equal((await st.get(meta))["x"], torch.full((8, 8), value))
    await st.shutdown()


@pytest.mark.parametrize("reuse", [True, False])
async def test_a_lease_gone_stale_with_another_clients_clear_partition(
    local_cluster: Cluster, reuse: bool
) -> None:
    a = await Store.create(local_cluster, num_units=2, name=f"lease-stale-{reuse}")
    b = await Store.connect(f"lease-stale-{reuse}", cluster=local_cluster)
    await a.put(_td(8, 0.0), "p")  # indexes 0..7; the lease holds 8..15
    await wait_until(lambda: _leased(a), 30, "the lease of the next put")
    await b.clear_partition("p")  # the lease's samples go too; 0..15 are free again
    theirs = None
    if reuse:  # another put takes the leased indexes: a stale commit must not land on it
        theirs = await b.put(_td(16, 2.0), "p")
        assert sorted(theirs.global_indexes) == list(range(16))
    mine = await a.put(_td(8, 1.0), "p")  # takes the stale lease: retried the usual way
    assert a._leases.taken == 1 and a._leases.retried == 1
    assert torch.equal((await a.get(mine))["x"], torch.full((8, 8), 1.0))
    if theirs is not None:
        assert not set(mine.global_indexes) & set(theirs.global_indexes)
        assert torch.equal((await b.get(theirs))["x"], torch.full((16, 8), 2.0))
    total = 8 + (16 if reuse else 0)
    assert (await a.production_status("p"))["samples"] == total
    await b.aclose()
    await a.shutdown()


async def test_a_lease_reclaimed_by_the_reaper_is_put_again(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-reclaim")
    await st.put(_td(8, 0.0), "p")
    await wait_until(lambda: _leased(st), 30, "the lease of the next put")
    assert await st.controller.reclaim(0.0) == 8  # the unwritten leased samples
    meta = await st.put(_td(8, 1.0), "p")
    assert st._leases.retried == 1
    assert torch.equal((await st.get(meta))["x"], torch.full((8, 8), 1.0))
    assert (await st.production_status("p"))["samples"] == 16
    await st.shutdown()


async def test_a_lease_naming_a_killed_unit_is_put_again_on_the_live_one(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-unit-kill")
    await st.put(_td(8, 0.0), "p")
    await wait_until(lambda: _leased(st), 30, "the lease of the next put")
    pids = {a["name"]: int(a["pid"]) for n in await local_cluster.nodes() for a in n["actors"]}
    os.kill(pids[st.units[1]["unit_id"]], signal.SIGKILL)
    meta = await st.put(_td(8, 1.0), "p")
    assert st._leases.retried == 1 and set(meta.shards) == {0}
    assert torch.equal((await st.get(meta))["x"], torch.full((8, 8), 1.0))
    await st.shutdown()


async def _near_capacity(cluster: Cluster, name: str) -> list[str]:
    """What puts into a nearly full unit do: ``["ok" | "full", ...]``."""
    row = 4096  # bytes of one row
    st = await Store.create(cluster, num_units=1, name=name, capacity_bytes=24 * row)
    other = await Store.connect(name, cluster=cluster)
    outcomes = []
    try:
        await st.put(_td(8, 1.0, 1024), "p")
        await asyncio.sleep(0)  # (the lease, if any, is on its way)
        for client, rows, partition in ((other, 8, "q"), (st, 8, "p"), (st, 8, "p")):
            try:
                meta = await client.put(_td(rows, 2.0, 1024), partition, timeout=0)
                got = await client.get(meta)
                assert torch.equal(got["x"], torch.full((rows, 1024), 2.0))
                outcomes.append("ok")
            except StoreFullError:
                outcomes.append("full")
        assert (await st.stats())["staged"] == 0
    finally:
        await other.aclose()
        await st.shutdown()
    return outcomes


async def test_a_store_near_capacity_behaves_as_without_leases(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_leases = await _near_capacity(local_cluster, "lease-full-on")
    monkeypatch.setenv("RAYLESS_STORE_LEASE", "0")
    without = await _near_capacity(local_cluster, "lease-full-off")
    assert with_leases == without and "ok" in without and "full" in without, without


async def test_a_lease_is_given_back_on_close(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-close")
    client = await Store.connect("lease-close", cluster=local_cluster)
    await client.put(_td(8, 1.0), "p")
    await wait_until(lambda: _leased(client), 30, "the lease of the next put")
    assert (await st.stats())["leased"] == 8
    await client.aclose()
    stats = await st.stats()  # the give-back was awaited by aclose
    assert stats["leased"] == 0 and stats["staged"] == 0 and stats["allocated"] == 8
    assert [s["spare"] for s in await _unit_stats(st)] == [0, 0]
    assert (await st.production_status("p"))["samples"] == 8
    await st.shutdown()


async def test_a_killed_clients_lease_goes_with_its_connection(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="lease-kill", reclaim_after=3600)
    holder = await local_cluster.spawn(LeaseHolder, "lease-kill")
    pid = await holder.pid()

    async def leased() -> bool:  # the holder's lease and its spare slots are made
        stats, units = await st.stats(), await _unit_stats(st)
        return stats["leased"] == 8 and sum(s["spare"] for s in units) == 2

    await holder.put_once("p", 8)
    await wait_until(leased, 30, "the holder's lease")
    os.kill(pid, signal.SIGKILL)  # no reaper (reclaim_after is an hour): the connection

    async def dropped() -> bool:
        stats, units = await st.stats(), await _unit_stats(st)
        return stats["leased"] == 0 and sum(s["spare"] for s in units) == 0

    await wait_until(dropped, 30, "the dead holder's lease to be dropped")
    stats = await st.stats()
    assert stats["staged"] == 0 and stats["allocated"] == 8 and stats["unwritten"] == 0
    await st.shutdown()


async def test_a_put_racing_a_clear_never_lands_on_the_next_puts_samples(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without leases: the narrow race of every put (before: the stale put's rows replaced
    # the newer put's rows on the unit, and its data update was taken for that put's)
    monkeypatch.setenv("RAYLESS_STORE_LEASE", "0")
    a = await Store.create(local_cluster, num_units=1, name="lease-race")
    b = await Store.connect("lease-race", cluster=local_cluster)
    await a.put(_td(8, 0.0), "p")  # indexes 0..7
    gate, entered = asyncio.Event(), asyncio.Event()
    real = a._puts._put_calls

    async def paused(*args: Any, **kwargs: Any) -> list[Any]:  # allocated, not yet written
        entered.set()
        await gate.wait()
        return await real(*args, **kwargs)

    a._puts._put_calls = paused  # type: ignore[method-assign]
    putting = asyncio.ensure_future(a.put(_td(8, 1.0), "p"))  # allocated 8..15
    try:
        await wait_until(entered.is_set, 30, "the put to allocate")
        a._puts._put_calls = real  # type: ignore[method-assign]
        await b.clear_partition("p")
        theirs = await b.put(_td(16, 2.0), "p")  # takes 0..15
        assert sorted(theirs.global_indexes) == list(range(16))
    finally:
        gate.set()
    mine = await asyncio.wait_for(putting, 60)  # refused as stale, put again the usual way
    assert not set(mine.global_indexes) & set(theirs.global_indexes)
    assert torch.equal((await b.get(theirs))["x"], torch.full((16, 8), 2.0))
    assert torch.equal((await a.get(mine))["x"], torch.full((8, 8), 1.0))
    await b.aclose()
    await a.shutdown()
