"""Same-host puts against late and dead writers: a writer stalled past its reservation never
writes into slots handed to someone else, a dead client's reservations and waiting reserves
are given back when its connection goes, concurrent gets racing clears and kills, and the
typed errors of a full /dev/shm and of a get racing a clear."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.store import (
    PartialResultError,
    StaleMetaError,
    Store,
    StoreError,
    UnitLostError,
)
from rayless.store.data.status import UnitStats
from rayless.store.samehost import plane as local_maps
from tests.integration.fence_classes import Writer
from tests.waiting import wait_until as _wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1 << 20


async def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> None:
    """``tests.waiting.wait_until``, polling every 50 ms."""
    await _wait_until(pred, timeout, what, interval=0.05)


async def _stats(st: Store, shard: int = 0) -> dict[str, Any]:
    stats: UnitStats = await st.units[shard]["handle"].stats()
    return stats.as_dict()


def _full(rows: int, value: float) -> TensorDict:
    return TensorDict({"x": torch.full((rows, 16), value)}, [rows])


async def test_a_writer_stalled_past_its_reservation_never_writes_into_reused_slots(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_maps, "INLINE_COPY_BYTES", -1)  # copies in a thread, as big ones
    st = await Store.create(local_cluster, num_units=1, name="fence-stall", reservation_ttl=1.0)
    gate, entered = threading.Event(), threading.Event()
    original = st._plane._copy_in

    def stalled(*args: Any) -> bool:  # writer A pauses between its reserve and its copy
        entered.set()
        gate.wait(60)
        return original(*args)

    st._plane._copy_in = stalled  # type: ignore[method-assign]
    a = asyncio.ensure_future(st.put(_full(64, 111.0), "p"))
    try:
        await wait_until(entered.is_set, 30, "writer A to reserve and pause")
        start = time.monotonic()
        await wait_until(lambda: time.monotonic() > start + 1.5, 10, "A's reservation to expire")
        st._plane._copy_in = original  # type: ignore[method-assign]
        b = await st.put(_full(64, 222.0), "p")  # takes the slots A's expiry gave back
        assert torch.equal((await st.get(b))["x"], torch.full((64, 16), 222.0))
    finally:
        gate.set()
    with pytest.raises(StoreError, match="expired"):
        await a
    back = (await st.get(b))["x"]
    assert torch.equal(back, torch.full((64, 16), 222.0)), f"B's rows hold {back.unique()}"
    assert (await _stats(st))["reservations"] == 0
    c = await st.put(_full(64, 333.0), "p")  # the fenced slots are reusable afterwards
    assert torch.equal((await st.get(c))["x"], torch.full((64, 16), 333.0))
    assert torch.equal((await st.get(b))["x"], torch.full((64, 16), 222.0))
    await st.shutdown()


async def test_a_dead_clients_reservations_and_waiting_reserves_are_given_back(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=1, name="fence-dead", capacity_bytes=48 * MIB)
    await st.ready()  # st.units below: its units must be up
    writers = [await local_cluster.spawn(Writer, "fence-dead") for _ in range(3)]
    pids = [await w.pid() for w in writers]
    hanging = [asyncio.ensure_future(w.hang_in_put(2048)) for w in writers]  # 8 MiB each
    try:

        async def reserved() -> bool:
            return int((await _stats(st))["reservations"]) == 3

        await wait_until(reserved, 30, "three writers to reserve 8 MiB each")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for fut in hanging:
            with pytest.raises(Exception):
                await fut

        async def released() -> bool:
            s = await _stats(st)
            return int(s["reservations"]) == 0 and int(s["used_bytes"]) == 0

        await wait_until(released, 30, "the dead writers' reservations to be given back")
        # a waiting reserve of a client killed while it waits for room never completes
        filler = await st.put(TensorDict({"x": torch.ones(11264, 1024)}, [11264]), "p")  # 44 MiB
        waiter = await local_cluster.spawn(Writer, "fence-dead")
        waiting = asyncio.ensure_future(waiter.put(2048, 5.0, 120.0))

        async def reserving() -> bool:
            return int((await _stats(st))["reserving"]) == 1

        await wait_until(reserving, 30, "the waiter's reserve to wait for room")
        os.kill(await waiter.pid(), signal.SIGKILL)
        with pytest.raises(Exception):
            await waiting

        async def dropped() -> bool:
            return int((await _stats(st))["reserving"]) == 0

        await wait_until(dropped, 30, "the dead waiter's reserve to be dropped")
        await st.clear(filler)
        live = await st.put(
            TensorDict({"x": torch.full((2048, 1024), 7.0)}, [2048]), "p", timeout=0
        )
        assert torch.equal((await st.get(live))["x"], torch.full((2048, 1024), 7.0))
        assert int((await _stats(st))["reservations"]) == 0
    finally:
        for fut in hanging:
            fut.cancel()
    await st.shutdown()


async def test_many_concurrent_gets_race_clears_and_a_unit_kill(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_maps, "_MAX_OPEN", 2)  # mappings evicted while others open
    st = await Store.create(local_cluster, num_units=2, name="fence-gets")
    metas = {}
    for k in range(12):  # a column (a segment per unit) per partition
        metas[k] = await st.put(_full(16, float(k)), f"p{k}")
    for round_ in range(3):
        cleared = list(range(round_, 12, 4))
        gets = [st.get(metas[k % 12]) for k in range(48)]
        clears = [st.clear(metas[k]) for k in cleared]
        results = await asyncio.gather(*gets, *clears, return_exceptions=True)
        for k, res in zip(range(48), results, strict=False):
            if isinstance(res, StaleMetaError) and k % 12 in cleared:
                continue
            assert not isinstance(res, BaseException), repr(res)
            assert torch.equal(res["x"], torch.full((16, 16), float(k % 12)))
        for k in cleared:
            metas[k] = await st.put(_full(16, float(k)), f"p{k}")
    pids = {a["name"]: int(a["pid"]) for n in await local_cluster.nodes() for a in n["actors"]}
    gets = [st.get(metas[k % 12]) for k in range(48)]
    os.kill(pids[st.units[1]["unit_id"]], signal.SIGKILL)
    for res in await asyncio.gather(*gets, return_exceptions=True):
        if isinstance(res, (PartialResultError, UnitLostError)):
            continue
        assert not isinstance(res, BaseException), repr(res)
    await st.shutdown()


@pytest.mark.parametrize("reput", [8, 4])
async def test_a_get_racing_a_clear_raises_stale_meta(
    local_cluster: Cluster, reput: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_maps, "INLINE_COPY_BYTES", -1)  # copies in a thread, as big ones
    # the clear's indexes are reused: 8 rows put again hold all of them (the get used to
    # return the new samples' data), 4 rows only some (it used to raise UnknownFieldError)
    # the put must reuse the cleared slots: no slots leased ahead of it (they would be others)
    monkeypatch.setenv("RAYLESS_STORE_LEASE", "0")
    st = await Store.create(local_cluster, num_units=1, name=f"fence-stale-{reput}")
    await st.put(_full(8, 0.0), "p")  # keeps the column
    meta = await st.put(_full(8, 1.0), "p")
    gate, entered = threading.Event(), threading.Event()
    original = st._plane._copy_out

    def paused(*args: Any) -> bool:  # the get located its rows; the copy waits
        entered.set()
        gate.wait(30)
        return original(*args)

    st._plane._copy_out = paused  # type: ignore[method-assign]
    getting = asyncio.ensure_future(st.get(meta))
    try:
        await wait_until(entered.is_set, 30, "the get to locate its rows")
        st._plane._copy_out = original  # type: ignore[method-assign]
        await st.clear(meta)
        await st.put(_full(reput, 2.0), "p")  # reclaims the cleared slots: a new generation
    finally:
        gate.set()
    with pytest.raises(StaleMetaError):
        await getting
    await st.shutdown()
