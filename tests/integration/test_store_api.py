"""The store on a real 2-node local cluster: round trips, column puts, fetch/peek, samplers,
clears, the KV face, capacity and the sync facade."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from rayless.actors import Cluster
from rayless.store import (
    BatchMeta,
    Store,
    StoreFullError,
    StoreInputError,
    StoreTimeoutError,
    SyncStore,
    UnknownKeyError,
)
from rayless.store.controller.samplers import RandomSampler
from rayless.store.data.messages import FetchMode
from rayless.transport.errors import ClosedError
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=2, gpus_per_node=2)]


def mixed_td(n: int, start: int = 0) -> TensorDict:
    """Dense (several dtypes), nested TensorDict, jagged responses, a string field."""
    responses = [torch.arange(start + i % 5 + 1, dtype=torch.int64) for i in range(n)]
    return TensorDict(
        {
            "obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1).repeat(1, 3),
            "mask": torch.arange(n) % 2 == 0,
            "half": torch.full((n, 2), 1.5, dtype=torch.bfloat16),
            "info": {"reward": torch.arange(n, dtype=torch.float64) + start},
            "responses": torch.nested.as_nested_tensor(responses, layout=torch.jagged),
            "text": NonTensorStack.from_list([f"s{start + i}" for i in range(n)]),
        },
        batch_size=[n],
    )


def assert_same(a: TensorDict, b: TensorDict) -> None:
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor) and x.is_nested:
            assert y.is_nested and y.layout == x.layout
            for u, v in zip(x.unbind(0), y.unbind(0), strict=True):
                assert torch.equal(u, v)
        elif isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.device == y.device and torch.equal(x, y), key
        else:
            assert x.tolist() == y.tolist(), key


async def test_round_trip_dense_jagged_nontensor_nested(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    await st.ready()  # create returns before the units serve; reading st.units needs them
    assert {u["node_id"] for u in st.units} == {"node-0", "node-1"}
    td = mixed_td(6)
    meta = await st.put(td, partition="train")
    assert isinstance(meta, BatchMeta) and len(meta) == meta.size == 6
    assert set(meta.shards) == {0, 1} and meta.partition_ids == ("train",) * 6
    assert set(meta.field_names) == {"obs", "mask", "half", "info.reward", "responses", "text"}
    assert meta.field_schemas["responses"].kind == "jagged"
    out = await st.get(meta)
    assert_same(td, out)
    part = await st.get(meta.select([4, 1]), fields=["obs", "text"])
    assert part["obs"][:, 0].tolist() == [4.0, 1.0] and part["text"].tolist() == ["s4", "s1"]
    assert await st.partitions() == ["train"]
    status = await st.production_status("train")
    assert status["samples"] == 6 and status["fields"]["obs"] == 6


async def test_column_wise_put_onto_existing_meta(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    meta = await st.put(TensorDict({"prompt": torch.arange(4)}, [4]), partition="p")
    with pytest.raises(StoreTimeoutError):
        await st.get_meta("p", ["prompt", "resp"], 4, task="t", timeout=0)
    full = await st.put(TensorDict({"resp": torch.arange(4) * 10}, [4]), meta=meta)
    assert set(full.field_names) == {"prompt", "resp"}
    got = await st.get_meta("p", ["prompt", "resp"], 4, task="t", timeout=5)
    out = await st.get(got)
    assert out["resp"].tolist() == [v * 10 for v in out["prompt"].tolist()]


async def test_a_put_of_no_samples_is_a_no_op(local_cluster: Cluster) -> None:
    """Every sample filtered out: the put raised a bare IndexError."""
    st = await Store.create(local_cluster, num_units=2)
    empty = TensorDict({"obs": torch.zeros(0, 3), "n": {"r": torch.zeros(0)}}, batch_size=[0])
    meta = await st.put(empty, partition="p")
    assert isinstance(meta, BatchMeta) and meta.size == 0 and meta.global_indexes == ()
    assert set(meta.field_names) == {"obs", "n.r"}
    assert await st.partitions() == []  # nothing was created
    assert (await st.get(meta)).batch_size == torch.Size([0])
    more = await st.put(TensorDict({"x": torch.zeros(0)}, [0]), meta=meta)
    assert more.size == 0 and set(more.field_names) == {"obs", "n.r", "x"}
    with pytest.raises(StoreInputError, match="partition"):
        await st.put(empty)
    assert (await st.put(TensorDict({"x": torch.arange(2)}, [2]), partition="p")).size == 2


async def test_fetch_and_peek_per_task_and_reset(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    await st.put(TensorDict({"x": torch.arange(6)}, [6]), partition="p")
    peek = await st.get_meta("p", ["x"], 4, task="a", mode="peek", timeout=0)
    assert len(peek) == 4
    first = await st.get_meta("p", ["x"], 4, task="a", timeout=0)
    assert first.global_indexes == peek.global_indexes
    with pytest.raises(StoreTimeoutError):
        await st.get_meta("p", ["x"], 4, task="a", timeout=0)
    rest = await st.get_meta("p", ["x"], None, task="a")
    assert len(rest) == 2
    other = await st.get_meta("p", ["x"], 6, task="b", timeout=0)  # tasks are independent
    assert len(other) == 6
    assert await st.consumption_status("p", "a") == {"samples": 6, "consumed": 6}
    await st.reset_consumption("a", "p")
    assert len(await st.get_meta("p", ["x"], 6, task="a", timeout=0)) == 6
    rand = await st.get_meta("p", ["x"], 3, task="r", sampler={"name": "random", "seed": 1})
    assert len(set(rand.global_indexes)) == 3
    # a sampler class travels by reference and is built in the controller; a FetchMode is
    # taken as its string is
    by_class = await st.get_meta("p", ["x"], 3, task="c", sampler=RandomSampler, timeout=0)
    assert len(set(by_class.global_indexes)) == 3
    peeked = await st.get_meta("p", ["x"], None, task="c", mode=FetchMode.PEEK)
    assert len(peeked) == 3  # the 3 the class-built sampler's fetch left unconsumed


async def test_waiting_fetch_never_blocks_other_clients(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="wait-store")
    other = await Store.connect("wait-store", local_cluster)
    fetch = asyncio.ensure_future(st.get_meta("p", ["x"], 4, task="learner", timeout=60))

    async def fetch_waits() -> bool:
        return bool((await other.stats())["waiting_fetches"] >= 1)

    await wait_until(fetch_waits, timeout=30, what="the fetch to wait at the controller")
    meta = await other.put(TensorDict({"x": torch.arange(2)}, [2]), partition="p")
    assert not fetch.done()  # the put returned while the fetch still waits
    peek = await other.get_meta("p", ["x"], 2, task="other", mode="peek", timeout=0)
    assert peek.global_indexes == meta.global_indexes
    assert (await other.get(peek))["x"].tolist() == [0, 1]
    assert not fetch.done()
    await other.put(TensorDict({"x": torch.arange(2, 4)}, [2]), partition="p")
    got = await asyncio.wait_for(fetch, 30)
    assert sorted((await st.get(got))["x"].tolist()) == [0, 1, 2, 3]


async def test_grouped_sampler(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    td = TensorDict({"x": torch.arange(7)}, [7])
    await st.put(td, partition="p", group_ids=[0, 0, 1, 1, 2, 2, 3])
    grouped = {"name": "grouped", "n": 2}
    meta = await st.get_meta("p", ["x"], 4, task="t", sampler=grouped, timeout=0)
    assert (await st.get(meta))["x"].tolist() == [0, 1, 2, 3]
    with pytest.raises(StoreTimeoutError):  # group 3 is incomplete: never split
        await st.get_meta("p", ["x"], 4, task="t", sampler=grouped, timeout=0.2)
    await st.put(TensorDict({"x": torch.tensor([7])}, [1]), partition="p", group_ids=[3])
    meta = await st.get_meta("p", ["x"], 4, task="t", sampler=grouped, timeout=5)
    assert (await st.get(meta))["x"].tolist() == [4, 5, 6, 7]


async def test_clear_and_reuse(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    meta = await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    await st.clear(meta)
    assert (await st.production_status("p"))["samples"] == 0
    again = await st.put(TensorDict({"x": torch.arange(4) + 10}, [4]), partition="p")
    assert set(again.global_indexes) == set(meta.global_indexes)
    assert (await st.get(again))["x"].tolist() == [10, 11, 12, 13]
    await st.put(TensorDict({"y": torch.ones(2, 2)}, [2]), partition="q")
    await st.clear_partition("p")
    assert await st.partitions() == ["q"]
    stats = await st.stats()
    assert stats["allocated"] == 2 and stats["pending_release"] == 0


async def test_kv_face(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    keys = [f"k{i}" for i in range(6)]
    await st.kv_put(keys, mixed_td(6))
    assert sorted(await st.kv_keys()) == sorted(keys)
    out = await st.kv_get(["k5", "k0"], fields=["obs", "text"])
    assert out["obs"][:, 0].tolist() == [5.0, 0.0] and out["text"].tolist() == ["s5", "s0"]
    await st.kv_put(["k0"], mixed_td(1, start=100))
    assert (await st.kv_get(["k0"]))["info", "reward"].tolist() == [100.0]
    assert await st.kv_delete(["k0", "k1", "nope"]) == 2
    with pytest.raises(UnknownKeyError):
        await st.kv_get(["k0"])
    assert len(await st.kv_keys()) == 4


async def test_kv_put_takes_transferqueue_form(local_cluster: Cluster) -> None:
    """TransferQueue's ``kv_put(key, partition_id, fields=, tag=)`` was refused with
    'keys must be a list of str'."""
    st = await Store.create(local_cluster, num_units=2)
    sample = {"input_ids": torch.tensor([1, 2, 3]), "text": "hi"}
    meta = await st.kv_put("s0", "p", fields=sample, tag={"score": 0.9})
    assert (meta.keys, meta.partition_id, meta.tags) == (["s0"], "p", [{"score": 0.9}])
    assert set(meta.fields) == {"input_ids", "text"}
    await st.kv_put(key="s1", partition_id="p", tag={"status": "running"})  # a tag only
    more = await st.kv_put("s0", partition_id="p", fields=TensorDict({"r": torch.ones(1)}, [1]))
    assert set(more.fields) == {"input_ids", "text", "r"}
    out = await st.kv_batch_get("s0", "p")
    assert out["input_ids"].tolist() == [[1, 2, 3]] and out["text"].tolist() == ["hi"]
    assert out["r"].tolist() == [1.0]
    assert (await st.kv_list("p"))["p"]["s1"] == {"status": "running"}
    with pytest.raises(StoreInputError, match="TransferQueue's form"):
        await st.kv_put("abc", TensorDict({"x": torch.ones(3)}, [3]))
    with pytest.raises(StoreInputError, match="needs a partition_id"):
        await st.kv_put(key="s2", fields=sample)
    with pytest.raises(StoreInputError, match="nested tensor"):
        nested = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
        await st.kv_put("s3", "p", fields={"x": nested})
    await st.kv_put(["raw"], TensorDict({"x": torch.ones(1)}, [1]))  # the units' KV as before
    assert await st.kv_keys() == ["raw"]


async def test_capacity_full_then_success_after_clear(local_cluster: Cluster) -> None:
    row = 1024 * 4  # bytes of one sample
    st = await Store.create(local_cluster, num_units=2, capacity_bytes=10 * row)
    first = await st.put(TensorDict({"x": torch.ones(16, 1024)}, [16]), partition="p")
    before = await st.stats()
    with pytest.raises(StoreFullError) as info:
        await st.put(TensorDict({"x": torch.ones(8, 1024)}, [8]), partition="p", timeout=0.3)
    assert "full" in str(info.value)
    after = await st.stats()
    assert after["allocated"] == before["allocated"] == 16  # the failed put was undone
    assert (await st.production_status("p"))["samples"] == 16
    waiting = asyncio.ensure_future(
        st.put(TensorDict({"x": torch.full((8, 1024), 2.0)}, [8]), partition="p", timeout=30)
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await st.clear(first)
    meta = await asyncio.wait_for(waiting, 30)
    assert bool((await st.get(meta))["x"].eq(2.0).all())


def _sync_round_trip(cluster: Cluster) -> list[int]:
    st = SyncStore.create(cluster, num_units=2, name="sync-store")
    st.put(TensorDict({"x": torch.arange(3)}, [3]), partition="p")
    meta = st.get_meta("p", ["x"], 3, task="t", timeout=5)
    out: list[int] = st.get(meta)["x"].tolist()
    return out


async def test_sync_facade(local_cluster: Cluster) -> None:
    assert await asyncio.to_thread(_sync_round_trip, local_cluster) == [0, 1, 2]


async def test_store_lifecycle_async_with_and_aclose(local_cluster: Cluster) -> None:
    async with Store.create(local_cluster, num_units=1, name="ctx-store") as st:
        await st.put(TensorDict({"x": torch.arange(2)}, [2]), partition="p")
        async with Store.connect("ctx-store", local_cluster) as other:
            assert await other.partitions() == ["p"]
        assert other.closed and await st.partitions() == ["p"]  # detaching kills nothing
        with pytest.raises(ClosedError):
            await other.partitions()
    assert st.closed
    await st.aclose()  # idempotent
    with pytest.raises(ClosedError):
        await st.partitions()
    again = await Store.create(local_cluster, num_units=1, name="ctx-store")  # the name is free
    await again.aclose()


def _sync_surface(cluster: Cluster) -> tuple[int, list[str], int]:
    with SyncStore.create(cluster, num_units=2, name="sync-surface") as st:
        st.ready()
        node = st.units[0]["node_id"]
        shard = st.unit_for_node(node)
        st.kv_put(["a", "b"], TensorDict({"x": torch.arange(2)}, [2]))
        keys = sorted(st.kv_keys())
        deleted = st.kv_delete(["a"])
    assert st.closed
    return shard, keys, deleted


async def test_sync_store_is_a_full_blocking_face(local_cluster: Cluster) -> None:
    assert await asyncio.to_thread(_sync_surface, local_cluster) == (0, ["a", "b"], 1)
