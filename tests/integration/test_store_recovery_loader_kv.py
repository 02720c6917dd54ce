"""The store on a real local cluster: cancelled fetches consume nothing, restarted units come
back and are watched again, the streaming loader's rank sharding, checkpoints into another
unit count, the partition-keyed KV batch face and metrics."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.store import Store, StoreError, StoreInputError, StoreTimeoutError
from rayless.store.client.loader import StreamingLoader
from rayless.store.data.fields import FieldSchema
from rayless.store.data.requests import FetchRequest
from rayless.store.metrics import prometheus, render_text
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=2)]


def td(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


async def until(cond: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    await wait_until(cond, timeout=timeout, what=what)


async def test_a_fetch_cancelled_by_its_caller_consumes_nothing(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="v2-cancel")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(st.get_meta("p", ["x"], 4, task="t"), 0.5)

    async def dropped() -> bool:
        return (await st.controller.metrics()).waiting == []

    await until(dropped, "the cancelled fetch left the controller")
    await st.put(td(4), partition="p")
    got = await st.get_meta("p", ["x"], 4, task="t", timeout=10)  # before: lost to the dead fetch
    assert sorted((await st.get(got))["x"].tolist()) == [0, 1, 2, 3]
    # a served batch whose caller cancelled goes back; an acknowledged one stays consumed
    fid = "manual"
    await st.put(td(2, 10), partition="q")
    served = await st.controller.get_meta(FetchRequest("q", ("x",), 2, "t", timeout=5), fid)
    assert served.size == 2 and await st.controller.cancel_fetch(fid) == 2
    assert (await st.get_meta("q", ["x"], 2, task="t", timeout=5)).size == 2
    assert (await st.consumption_status("q", "t"))["consumed"] == 2
    with pytest.raises(StoreInputError):
        await st.get_meta("q", ["x"], 1, task="t", timeout=-1)


async def test_a_waiting_fetch_says_what_it_waits_for(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=1, name="v2-wait")
    waiting = asyncio.ensure_future(st.get_meta("nope", ["a", "b"], 3, task="t", timeout=30))

    async def listed() -> bool:
        return bool((await st.controller.metrics()).waiting)

    await until(listed, "the fetch is listed")
    (w,) = (await st.controller.metrics()).waiting
    assert w.partition == "nope" and not w.exists and w.asked == 3 and w.ready == 0
    assert "does not exist yet" in w.text and "['a', 'b']" in w.text
    await st.put(TensorDict({"a": torch.arange(3)}, [3]), partition="nope")
    await until(lambda: _missing(st), "field b is reported missing")
    await st.put(TensorDict({"b": torch.arange(3)}, [3]), meta=await _meta(st))
    assert (await asyncio.wait_for(waiting, 10)).size == 3


async def _missing(st: Store) -> bool:
    ws = (await st.controller.metrics()).waiting
    return bool(ws) and ws[0].missing_fields == ["b"] and ws[0].exists


async def _meta(st: Store):  # type: ignore[no-untyped-def]
    return await st.get_meta("nope", ["a"], 3, task="writer", mode="peek", timeout=5)


async def test_a_restarted_unit_registers_again_and_is_watched_again(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="v2-restart", unit_max_restarts=2)
    await st.put(td(8), partition="p")
    unit = st.units[1]["unit_id"]

    async def pid() -> int:
        records = {a["name"]: a for n in await local_cluster.nodes() for a in n["actors"]}
        return int(records[unit].get("pid") or 0)

    for round_ in range(2):  # the second kill shows the restarted unit is watched again
        old = await pid()
        os.kill(old, signal.SIGKILL)

        async def back(old: int = old) -> bool:
            units = await st.controller.units()
            return units[1].alive and (await pid()) not in (0, old)

        await until(back, f"unit back after kill {round_}")
        lost = await st.lost_samples("p")
        assert lost.size > 0 and set(lost.shards) == {1}
        new = await st.put(td(4, 100 + round_ * 10), partition="p")
        assert 1 in new.shards
        got = await st.get(new)
        assert sorted(got["x"].tolist()) == [100 + round_ * 10 + i for i in range(4)]


async def test_the_loader_shards_by_dp_rank_and_repeats_for_replicas(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="v2-loader")
    lengths = [90, 1, 1, 1, 40, 40, 2, 1]
    await st.put(td(8), partition="p", custom_meta=[{"total_lengths": v} for v in lengths])
    sampler = {"name": "seqlen_balanced", "dp_size": 2}
    loaders = {
        (r, k): StreamingLoader(
            st,
            "p",
            ["x"],
            4,
            task="train",
            dp_rank=r,
            dp_size=2,
            replicas=2,
            sampler=sampler,
            steps=1,
            timeout=10,
        )
        for r in range(2)
        for k in range(2)
    }
    out = {}
    for key, loader in loaders.items():
        batches = [b async for b in loader]
        assert len(batches) == 1
        out[key] = sorted(batches[0][0]["x"].tolist())
    assert out[(0, 0)] == out[(0, 1)] and out[(1, 0)] == out[(1, 1)]  # TP replicas: same batch
    assert sorted(out[(0, 0)] + out[(1, 0)]) == list(range(8))  # DP ranks: disjoint, complete
    totals = [sum(lengths[i] for i in out[(r, 0)]) for r in range(2)]
    assert max(totals) - min(totals) < 90  # balanced (contiguous halves would be 93 vs 84)


async def test_checkpoint_restores_data_and_status_into_another_unit_count(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="v2-ckpt-a")
    await st.put(td(6), partition="p", group_ids=[0, 0, 1, 1, 2, 2], group_size=2)
    await st.kv_batch_put(
        ["k1", "k2"], "kv", TensorDict({"y": torch.ones(2)}, [2]), [{"a": 1}, {"a": 2}]
    )
    done = await st.get_meta("p", ["x"], 2, task="t", sampler={"name": "grouped", "n": 2})
    await st.save_checkpoint(tmp_path / "ck")
    other = await Store.create(local_cluster, num_units=3, name="v2-ckpt-b")
    await other.load_checkpoint(tmp_path / "ck")
    assert (await other.consumption_status("p", "t"))["consumed"] == 2
    rest = await other.get_meta(
        "p", ["x"], 4, task="t", sampler={"name": "grouped", "n": 2}, timeout=5
    )
    got = sorted((await other.get(rest))["x"].tolist())
    assert got == sorted(set(range(6)) - set((await st.get(done))["x"].tolist()))
    assert (await other.kv_list("kv")) == {"kv": {"k1": {"a": 1}, "k2": {"a": 2}}}
    assert (await other.kv_batch_get(["k2"], "kv"))["y"].tolist() == [1.0]
    with pytest.raises(StoreInputError):
        await other.load_checkpoint(tmp_path / "ck")  # its partitions exist now


async def test_kv_batch_face_and_metrics(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="v2-kv")
    m = await st.kv_batch_put(
        ["a", "b", "c"], "p", TensorDict({"x": torch.arange(3)}, [3]), [{"t": i} for i in range(3)]
    )
    assert m.fields == ["x"] and m.tags == [{"t": 0}, {"t": 1}, {"t": 2}]
    m2 = await st.kv_batch_put(["c", "d"], "p", TensorDict({"x": torch.tensor([30, 40])}, [2]))
    assert m2.keys == ["c", "d"]
    got = await st.kv_batch_get(["d", "a", "c"], "p", select_fields="x")
    assert got["x"].tolist() == [40, 0, 30]
    await st.kv_clear(["a", "zz"], "p")
    assert set((await st.kv_list("p"))["p"]) == {"b", "c", "d"}
    fetched = await st.get_meta("p", ["x"], 3, task="t", timeout=5)  # ordinary samples
    assert fetched.size == 3
    metrics = await st.metrics()
    assert metrics["controller"]["partitions"]["p"]["consumers"] == {"t": 3}
    assert sum(u["rows"] for u in metrics["units"]) >= 3 and all(
        u["alive"] for u in metrics["units"]
    )
    assert metrics["units"][0]["puts"]["total"] >= 1
    assert "rayless_store_unit_bytes" in prometheus(metrics) and "v2-kv" in render_text(metrics)


async def test_a_failed_column_wise_put_never_shows_on_the_unit_that_wrote(
    local_cluster: Cluster,
) -> None:
    # Unit 0 holds 1 sample, unit 1 holds 7: a field of 4 KiB rows fits unit 0's 16 KiB but
    # not unit 1's, so the column-wise put fails there after unit 0 wrote its row.
    st = await Store.create(
        local_cluster,
        num_units=2,
        name="v2-colput",
        capacity_bytes=16 << 10,
        env_shards={"a": 0, "b": 1},
    )
    meta = await st.put(td(8), "p", env_ids=["a"] + ["b"] * 7)
    used = [(await u["handle"].stats()).used_bytes for u in st.units]
    waiting = asyncio.ensure_future(st.get_meta("p", ["x", "y"], 1, task="t", timeout=2.0))

    async def one_waits() -> bool:
        return bool((await st.stats())["waiting_fetches"] >= 1)

    await until(one_waits, "the fetch waits")
    with pytest.raises(StoreError):
        await st.put(TensorDict({"y": torch.ones(8, 1024)}, [8]), meta=meta, timeout=0)
    with pytest.raises(StoreTimeoutError):  # it never saw unit 0's row of the failed put
        await waiting
    assert (await st.production_status("p"))["fields"].get("y", 0) == 0

    async def rows_deleted() -> bool:
        return [(await u["handle"].stats()).used_bytes for u in st.units] == used

    await until(rows_deleted, "unit 0 deleted its row of the failed put")
    # a column-wise put that fits shows on all samples at once
    meta = await st.put(TensorDict({"y": torch.ones(8, 4)}, [8]), meta=meta)
    got = await st.get_meta("p", ["x", "y"], 8, task="t2", timeout=5)
    assert sorted(got.global_indexes) == sorted(meta.global_indexes)
    await st.shutdown()


async def test_a_column_wise_put_whose_client_died_is_aborted_by_the_reaper(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="v2-colreap", reclaim_after=0.5)
    meta = await st.put(td(4), "p")
    used = (await st.units[0]["handle"].stats()).used_bytes
    wire = {"y": FieldSchema("dense", "int64", (), "cpu")}
    begun = await st.controller.begin_column_put(meta, wire)
    by_shard = meta.by_shard()
    idx0 = [meta.global_indexes[p] for p in by_shard[0]]
    idx1 = [meta.global_indexes[p] for p in by_shard[1]]
    rows = TensorDict({"y": torch.arange(len(idx0))}, [len(idx0)])
    # what a client does before it is killed: unit 0 writes its part; unit 1 never does
    await st.units[0]["handle"].write("p", idx0, rows, wire, 0.0, begun.put_id)
    assert (await st.production_status("p"))["fields"].get("y", 0) == 0

    async def reaped() -> bool:
        return bool((await st.units[0]["handle"].stats()).used_bytes == used)

    await until(reaped, "the reaper deleted unit 0's row of the dead client's put")
    late = TensorDict({"y": torch.arange(len(idx1))}, [len(idx1)])
    with pytest.raises(StoreInputError, match="aborted"):
        await st.units[1]["handle"].write("p", idx1, late, wire, 0.0, begun.put_id)
    assert (await st.production_status("p"))["fields"].get("y", 0) == 0
    await st.shutdown()
