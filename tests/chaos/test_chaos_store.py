"""Chaos on the store: a consumer waiting on data that died with its unit fails fast."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.store import Store, StoreTimeoutError, UnitLostError
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


async def test_fetch_waiting_on_a_lost_units_partition_fails_with_its_name(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="chaos-fetch")
    meta = await st.put(TensorDict({"x": torch.arange(8)}, [8]), partition="p")
    victim = st.units[1]
    records = {a["name"]: a for n in await local_cluster.nodes() for a in n["actors"]}
    # A consumer asks for more than is there: it waits for producers.
    waiting = asyncio.ensure_future(st.get_meta("p", ["x"], 16, task="t", timeout=60))

    async def fetch_waits() -> bool:
        return waiting.done() or (await st.stats())["waiting_fetches"] > 0

    await wait_until(fetch_waits, timeout=30, what="the fetch to wait at the controller")
    assert not waiting.done()
    start = time.monotonic()
    os.kill(int(records[victim["unit_id"]]["pid"]), signal.SIGKILL)
    with pytest.raises(UnitLostError) as info:
        await asyncio.wait_for(waiting, 30)  # before the fix: StoreTimeoutError after 60 s
    assert info.value.unit == victim["unit_id"] and "'p'" in str(info.value)
    assert time.monotonic() - start < 20
    # A fetch the survivors can satisfy still works, and an unaffected partition still waits.
    alive = [meta.global_indexes[i] for i, s in enumerate(meta.shards) if s == 0]
    ready = await st.get_meta("p", ["x"], len(alive), task="t2", timeout=5)
    assert sorted(ready.global_indexes) == sorted(alive)
    await st.put(TensorDict({"x": torch.arange(2)}, [2]), partition="q")
    with pytest.raises(StoreTimeoutError):
        await st.get_meta("q", ["x"], 5, task="t", timeout=0.5)


async def test_a_put_after_every_unit_died_names_the_lost_unit(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=1, name="chaos-all-lost")
    await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    unit_id = st.units[0]["unit_id"]
    records = {a["name"]: a for n in await local_cluster.nodes() for a in n["actors"]}
    os.kill(int(records[unit_id]["pid"]), signal.SIGKILL)

    async def lost() -> bool:
        return not (await st.controller.units())[0].alive

    await wait_until(lost, timeout=20, what="the controller to mark the unit lost")
    with pytest.raises(UnitLostError) as info:  # before the fix: a bare StoreError
        await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    assert info.value.unit == unit_id and unit_id in str(info.value)


async def test_a_partition_serves_new_data_after_a_unit_loss(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="chaos-after-loss")
    meta = await st.put(TensorDict({"x": torch.arange(8)}, [8]), partition="p")
    victim = st.units[1]
    records = {a["name"]: a for n in await local_cluster.nodes() for a in n["actors"]}
    os.kill(int(records[victim["unit_id"]]["pid"]), signal.SIGKILL)

    async def lost() -> bool:
        return not (await st.controller.units())[1].alive

    await wait_until(lost, timeout=30, what="the controller to mark unit 1 lost")
    alive = sorted(meta.global_indexes[i] for i, s in enumerate(meta.shards) if s == 0)
    first = await st.get_meta("p", ["x"], len(alive), task="t", timeout=5)
    assert sorted(first.global_indexes) == alive
    # A fetch that starts after the loss waits for new data (before: UnitLostError at once,
    # on every fetch, forever) and is served by the next put.
    waiting = asyncio.ensure_future(st.get_meta("p", ["x"], 4, task="t", timeout=60))

    async def fetch_waits() -> bool:
        return waiting.done() or (await st.stats())["waiting_fetches"] > 0

    await wait_until(fetch_waits, timeout=30, what="the fetch to wait at the controller")
    new = await st.put(TensorDict({"x": torch.arange(100, 104)}, [4]), partition="p")
    got = await asyncio.wait_for(waiting, 30)
    assert sorted(got.global_indexes) == sorted(new.global_indexes)
    assert sorted((await st.get(got))["x"].tolist()) == [100, 101, 102, 103]
    assert (await st.production_status("p"))["lost"] == 8 - len(alive)
