"""The store under failure and bad input, with node affinity, and used from inside actors."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from typing import Any

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.store import (
    BatchMeta,
    FieldSchema,
    ForeignMetaError,
    PartialResultError,
    SchemaError,
    StaleMetaError,
    Store,
    StoreFullError,
    StoreInputError,
    StoreTimeoutError,
    UnitLostError,
    UnknownFieldError,
    UnknownPartitionError,
    WriteTooLargeError,
)
from rayless.store.client.link import StoreLink
from tests.waiting import scaled, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=2, gpus_per_node=2)]


class EnvWriter(actors.Actor):
    """An env worker: connects to the store by name and writes its env's samples."""

    def __init__(self, store_name: str) -> None:
        self.store_name = store_name

    async def write(self, env_id: str, n: int) -> dict[str, Any]:
        st = await Store.connect(self.store_name)
        td = TensorDict({"obs": torch.full((n, 2), float(n))}, [n])
        meta = await st.put(td, partition="rollout", env_ids=[env_id] * n)
        back = await st.get(meta)
        return {
            "node": os.environ.get("RAYLESS_NODE_ID"),
            "shards": list(meta.shards),
            "ok": bool(torch.equal(back["obs"], td["obs"])),
        }

    async def put_plain(self, n: int, timeout: float) -> None:
        st = await Store.connect(self.store_name)
        await st.put(TensorDict({"obs": torch.ones(n, 64)}, [n]), "rollout", timeout=timeout)

    async def fetch(self, batch_size: int) -> list[float]:
        st = await Store.connect(self.store_name)
        meta = await st.get_meta("rollout", ["obs"], batch_size, task="train", timeout=10)
        out: list[float] = (await st.get(meta))["obs"][:, 0].tolist()
        return out


async def test_episode_table_sharding_with_node_affinity_from_inside_actors(
    local_cluster: Cluster,
) -> None:
    env_nodes = {"env-0": "node-0", "env-1": "node-1"}
    st = await Store.create(local_cluster, num_units=2, name="aff-store", env_nodes=env_nodes)
    await st.ready()  # st.units below: its units must be up
    for env_id, node in env_nodes.items():
        writer = await local_cluster.spawn(EnvWriter, "aff-store", node=node, cpus=0)
        res = await writer.write(env_id, 3)
        assert res["node"] == node and res["ok"]
        unit = st.units[res["shards"][0]]
        assert set(res["shards"]) == {st.unit_for_node(node)} and unit["node_id"] == node
    reader = await local_cluster.spawn(EnvWriter, "aff-store", cpus=0)
    assert sorted(await reader.fetch(6)) == [3.0] * 6
    with pytest.raises(StoreInputError, match="env-9"):
        await st.put(TensorDict({"obs": torch.ones(1, 2)}, [1]), "rollout", env_ids=["env-9"])


async def test_unit_death_fails_its_reads_only(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    meta = await st.put(TensorDict({"x": torch.arange(8)}, [8]), partition="p")
    dead = st.units[1]
    await local_cluster.kill(dead["handle"])
    with pytest.raises(UnitLostError) as info:
        await st.get(meta)
    assert info.value.unit == dead["unit_id"] and dead["unit_id"] in str(info.value)
    alive_pos = [i for i, s in enumerate(meta.shards) if s == 0]
    survivors = await st.get(meta.select(alive_pos))
    assert survivors["x"].tolist() == [meta.global_indexes[p] for p in alive_pos]
    # The controller marked the lost samples not ready: a fetch sees only the survivors.
    ready = await st.get_meta("p", ["x"], None, task="t")
    assert sorted(ready.global_indexes) == sorted(meta.global_indexes[p] for p in alive_pos)
    # New puts land on the surviving unit.
    new = await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    assert set(new.shards) == {0}
    assert (await st.get(new))["x"].tolist() == [0, 1, 2, 3]


async def test_bad_input_leaves_the_store_unchanged(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="bad-a")
    other = await Store.create(local_cluster, num_units=1, name="bad-b")
    meta = await st.put(TensorDict({"x": torch.arange(4.0), "y": torch.ones(4, 2)}, [4]), "p")

    async def snapshot() -> tuple[Any, ...]:
        stats = await st.stats()
        units = [(u["used_bytes"], u["rows"]) for u in stats["unit_stats"]]
        status = await st.production_status("p")
        kv = sorted(await st.kv_keys())
        return (status, stats["allocated"], stats["free"], units, await st.partitions(), kv)

    before = await snapshot()
    foreign = await other.put(TensorDict({"x": torch.arange(4.0)}, [4]), "p")
    forged = _with_shards(meta, [99] * meta.size)
    swapped = _with_shards(meta, [1 - s for s in meta.shards])
    bad_calls = [
        (SchemaError, lambda: st.put(TensorDict({"x": torch.arange(4)}, [4]), "p")),  # dtype change
        (
            SchemaError,
            lambda: st.put(TensorDict({"y": torch.ones(4, 2, 1)}, [4]), "p"),
        ),  # rank change (another width of one rank is a multi-shape field: issue 41)
        (StoreInputError, lambda: st.put(TensorDict({"z": torch.ones(3)}, [3]), meta=meta)),  # size
        (
            SchemaError,
            lambda: st.put(TensorDict({"x": torch.ones(4, dtype=torch.int64)}, [4]), meta=meta),
        ),
        (StoreInputError, lambda: st.put(TensorDict({"z": torch.ones(4)}, [4]), "q", meta=meta)),
        (ForeignMetaError, lambda: st.get(foreign)),
        (ForeignMetaError, lambda: st.put(TensorDict({"z": torch.ones(4)}, [4]), meta=foreign)),
        (UnknownFieldError, lambda: st.get(meta, fields=["nope"])),
        (UnknownPartitionError, lambda: st.clear_partition("nope")),
        (UnknownPartitionError, lambda: st.production_status("nope")),
        (StoreTimeoutError, lambda: st.get_meta("nope", ["x"], 1, timeout=0)),
        (StoreInputError, lambda: st.get_meta("p", ["x"], 1, mode="bogus", timeout=0)),
        (
            StoreInputError,
            lambda: st.put(TensorDict({"x": torch.ones(2)}, [2]), "p", env_ids=["e"]),
        ),
        (SchemaError, lambda: st.put(TensorDict({"x": torch.ones(2, 2)}, [2, 2]), "p")),
        # issue 12: unstorable dtypes are refused at the client, before any allocation
        (SchemaError, lambda: st.put(TensorDict({"u": torch.ones(4).to(torch.uint16)}, [4]), "n")),
        (SchemaError, lambda: st.put(TensorDict({"u": torch.ones(4).to(torch.uint64)}, [4]), "p")),
        (
            SchemaError,
            lambda: st.put(
                TensorDict({"f8": torch.ones(4).to(torch.float8_e4m3fn)}, [4]), meta=meta
            ),
        ),
        (
            SchemaError,
            lambda: st.kv_put(["k"], TensorDict({"u": torch.ones(1).to(torch.uint32)}, [1])),
        ),
        # a bare str is not a list of keys ("abc" would be keys a, b, c)
        (StoreInputError, lambda: st.kv_put("abc", TensorDict({"x": torch.ones(3)}, [3]))),
        (StoreInputError, lambda: st.kv_get("abc")),
        (StoreInputError, lambda: st.kv_delete("abc")),
        # a forged meta naming a shard the store does not have
        (StoreInputError, lambda: st.get(forged)),
        (StoreInputError, lambda: st.put(TensorDict({"z": torch.ones(4)}, [4]), meta=forged)),
        (StoreInputError, lambda: st.clear(forged)),
        (StoreInputError, lambda: st.get(swapped)),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            await call()
    assert await snapshot() == before
    await st.clear(meta)
    with pytest.raises(StaleMetaError):
        await st.get(meta)


async def test_unwritten_allocations_are_reclaimed(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2)
    await st.ready()  # the raw controller handle below skips the client's wait for the units
    # A client that allocated and then died before writing anything.
    await st.controller.allocate("p", 4, {"x": FieldSchema("dense", "int64", ())})
    assert (await st.stats())["unwritten"] == 4
    with pytest.raises(StoreTimeoutError):
        await st.get_meta("p", ["x"], 1, timeout=0)  # never visible as ready
    assert await st.controller.reclaim(0.0) == 4
    stats = await st.stats()
    assert stats["allocated"] == 0 and stats["free"] == 4


async def test_client_killed_mid_put_leaves_nothing_ready(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="mid-store", capacity_bytes=4096)
    writer = await local_cluster.spawn(EnvWriter, "mid-store", cpus=0)
    # The writer's put waits for room on a full unit; kill the writer while it waits.
    await st.put(TensorDict({"obs": torch.ones(8, 64)}, [8]), partition="rollout")
    call = writer.put_plain.submit(32, 30.0)  # fits the capacity, not the free room

    async def unwritten() -> int:
        return int((await st.stats())["unwritten"])

    await wait_until(unwritten, timeout=30, what="the writer's allocation (stats 'unwritten')")
    await local_cluster.kill(writer)
    with pytest.raises(actors.ActorDiedError):
        await call
    ready = await st.get_meta("rollout", ["obs"], None, task="t")
    assert len(ready) == 8  # only the first put's samples are ready


def _with_shards(meta: BatchMeta, shards: list[int]) -> BatchMeta:
    return dataclasses.replace(meta, shards=tuple(shards))


async def _wait_lost(st: Store, shard: int) -> None:
    async def lost() -> bool:
        return not (await st.controller.units())[shard].alive

    await wait_until(lost, timeout=30, what=f"the controller to mark unit {shard} lost")


async def test_a_get_spanning_a_lost_unit_returns_the_live_part(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="partial")
    await st.put(TensorDict({"x": torch.arange(8)}, [8]), partition="p")
    batch = await st.get_meta("p", ["x"], 8, task="t", timeout=5)
    dead = st.units[1]
    await local_cluster.kill(dead["handle"])
    with pytest.raises(PartialResultError) as info:  # before: a bare UnitLostError, data gone
        await st.get(batch)
    err = info.value
    assert isinstance(err, UnitLostError) and err.unit == dead["unit_id"]
    live = [i for i, s in zip(batch.global_indexes, batch.shards, strict=True) if s == 0]
    assert list(err.meta.global_indexes) == live and err.data["x"].tolist() == live
    assert sorted(err.lost.global_indexes) == sorted(set(batch.global_indexes) - set(live))
    # the live samples stay consumed (their data is in the error) ...
    with pytest.raises(StoreTimeoutError):
        await st.get_meta("p", ["x"], 1, task="t", timeout=0)
    # ... or go back to the queue through the public API, and are fetched again
    await st.reset_consumption("t", meta=err.meta)
    again = await st.get_meta("p", ["x"], len(live), task="t", timeout=5)
    assert sorted(again.global_indexes) == live
    assert (await st.get(again))["x"].tolist() == list(again.global_indexes)
    # the lost samples are listed, and can be cleared
    lost = await st.lost_samples("p")
    assert sorted(lost.global_indexes) == sorted(err.lost.global_indexes)
    await st.clear(lost)
    assert (await st.production_status("p"))["lost"] == 0


async def test_a_failed_column_wise_put_leaves_nothing_behind(local_cluster: Cluster) -> None:
    st = await Store.create(
        local_cluster, num_units=2, name="colfail", capacity_bytes=4096, env_shards={"a": 0, "b": 1}
    )
    meta = await st.put(TensorDict({"x": torch.ones(4)}, [4]), "p", env_ids=["a", "a", "b", "b"])
    await st.put(TensorDict({"fill": torch.ones(15, 64)}, [15]), "q", env_ids=["b"] * 15)

    async def snapshot() -> tuple[Any, ...]:
        stats = await st.stats()
        units = [(u["used_bytes"], u["rows"]) for u in stats["unit_stats"]]
        return (await st.production_status("p"), units, await st.partitions())

    before = await snapshot()
    # unit 0 has room for y, unit 1 does not: before the fix y stayed on unit 0 (ready there)
    with pytest.raises(StoreFullError):
        await st.put(TensorDict({"y": torch.ones(4, 64)}, [4]), meta=meta, timeout=0)
    assert await snapshot() == before
    with pytest.raises(UnknownFieldError):
        await st.get(meta, fields=["x", "y"])


async def test_a_write_that_can_never_fit_fails_at_once_and_leaves_no_partition(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="toolarge", capacity_bytes=4096)
    huge = TensorDict({"x": torch.ones(4, 1024)}, [4])  # 8 KiB per unit, capacity 4 KiB
    # a put timeout far beyond the test's: before the fix the put waited all of it
    with pytest.raises(WriteTooLargeError) as info:
        await asyncio.wait_for(st.put(huge, "fresh", timeout=600), 60)
    assert info.value.capacity == 4096 and info.value.needed > 4096
    assert await st.partitions() == []  # the failed put left no (empty) partition
    stats = await st.stats()
    assert stats["allocated"] == 0 and [u["used_bytes"] for u in stats["unit_stats"]] == [0, 0]
    with pytest.raises(WriteTooLargeError):
        big = TensorDict({"x": torch.ones(1, 2048)}, [1])
        await asyncio.wait_for(st.kv_put(["k"], big, timeout=600), 60)


async def test_a_producer_killed_mid_put_leaves_no_torn_put(local_cluster: Cluster) -> None:
    st = await Store.create(
        local_cluster, num_units=2, name="torn-store", capacity_bytes=4096, env_shards={"b": 1}
    )
    await st.put(TensorDict({"obs": torch.ones(16, 64)}, [16]), "rollout", env_ids=["b"] * 16)
    writer = await local_cluster.spawn(EnvWriter, "torn-store", cpus=0)
    # 8 rows: unit 0 stores its 4 at once, unit 1 (full) waits for room; kill the writer then
    call = writer.put_plain.submit(8, 30.0)

    async def rows_on_unit0() -> int:
        stats = await st.stats()
        return int(stats["unit_stats"][0]["rows"].get("rollout", 0))

    async def unit0_wrote() -> bool:
        if call.done():  # the put ended before unit 0 held its rows: show why
            await call
            raise AssertionError("the writer's put returned although unit 1 has no room")
        return await rows_on_unit0() >= 4

    await wait_until(unit0_wrote, timeout=60, what="unit 0's 4 rows of the writer's put")
    pids = {a["actor_id"]: a["pid"] for n in await local_cluster.nodes() for a in n["actors"]}
    os.kill(int(pids[writer.actor_id]), signal.SIGKILL)  # no chance to undo its put
    with pytest.raises(actors.ActorDiedError):
        await asyncio.wait_for(call, scaled(30))
    # before the fix the 4 rows on unit 0 were ready (and readable) for good
    ready = await st.get_meta("rollout", ["obs"], None, task="t", timeout=scaled(30))
    assert len(ready) == 16 and set(ready.shards) == {1}
    assert (await st.production_status("rollout"))["fields"]["obs"] == 16
    # every step has its deadline: a stalled reclaim fails here, naming itself
    reclaimed = await asyncio.wait_for(st.controller.reclaim(0.0), scaled(30))
    assert reclaimed == 8  # the torn put is reclaimed like an unwritten one
    assert await rows_on_unit0() == 0


async def test_a_get_whose_samples_all_died_with_their_unit_is_a_partial_result_of_none(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="all-lost")
    data = TensorDict(
        {
            "x": torch.arange(1),
            "obs": TensorDict({"y": torch.ones(1, 2, 3, dtype=torch.bfloat16)}, [1]),
            "seq": torch.nested.nested_tensor([torch.ones(4, 2)], layout=torch.jagged),
            "text": NonTensorStack.from_list(["a"]),
        },
        [1],
    )
    meta = await st.put(data, partition="p")
    unit = st.units[meta.shards[0]]
    await local_cluster.kill(unit["handle"])
    with pytest.raises(PartialResultError) as info:  # before: AttributeError on empty data
        await st.get(meta)
    assert info.value.unit == unit["unit_id"]
    assert len(info.value.meta) == 0 and len(info.value.lost) == 1
    empty = info.value.data  # the schema is kept (before: no fields, err.data["x"] KeyError)
    assert empty.batch_size == torch.Size([0])
    assert empty["x"].shape == (0,) and empty["x"].dtype == torch.int64
    assert empty["obs", "y"].shape == (0, 2, 3) and empty["obs", "y"].dtype == torch.bfloat16
    assert empty["seq"].is_nested and empty["seq"].size(0) == 0 and empty["seq"].size(2) == 2
    assert list(empty["text"]) == []


async def test_a_put_whose_reply_is_lost_after_it_committed_is_kept_and_acknowledged(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A unit that commits a put's rows (its data update ACKed: the samples are ready) and
    # dies before its reply reaches the client. Before: the client raised and undid the put,
    # clearing samples a consumer already held: its get failed StaleMetaError, and the other
    # samples of that consumer's batch (acknowledged puts) were consumed and never delivered.
    st = await Store.create(local_cluster, num_units=2, name="lostreply")
    first = await st.put(TensorDict({"x": torch.arange(4)}, [4]), partition="p")
    held: list[BatchMeta] = []
    real = StoreLink.gather

    async def reply_lost(self: StoreLink, shards: list[int], calls: list[Any]) -> list[Any]:
        await real(self, shards, calls)  # every unit committed
        held.append(await st.get_meta("p", ["x"], 8, task="t", timeout=10))  # a consumer
        raise UnitLostError(st.units[1]["unit_id"], "its reply was lost")

    monkeypatch.setattr(StoreLink, "gather", reply_lost)
    second = await st.put(TensorDict({"x": torch.arange(4, 8)}, [4]), partition="p")
    monkeypatch.undo()
    assert sorted(second.global_indexes) == sorted(
        set(held[0].global_indexes) - set(first.global_indexes)
    )
    data = await st.get(held[0])  # before: StaleMetaError, 8 samples consumed and gone
    assert sorted(data["x"].tolist()) == list(range(8))
