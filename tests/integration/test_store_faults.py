"""The store under failure and bad input, with node affinity, and used from inside actors."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
import torch
from tensordict import TensorDict

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.store import (
    ForeignMetaError,
    SchemaError,
    StaleMetaError,
    Store,
    StoreInputError,
    StoreTimeoutError,
    UnitLostError,
    UnknownFieldError,
    UnknownPartitionError,
)

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
        return (await st.production_status("p"), stats["allocated"], stats["free"], units)

    before = await snapshot()
    foreign = await other.put(TensorDict({"x": torch.arange(4.0)}, [4]), "p")
    bad_calls = [
        (SchemaError, lambda: st.put(TensorDict({"x": torch.arange(4)}, [4]), "p")),  # dtype change
        (
            SchemaError,
            lambda: st.put(TensorDict({"y": torch.ones(4, 3)}, [4]), "p"),
        ),  # shape change
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
    # A client that allocated and then died before writing anything.
    await st.controller.allocate("p", 4, {"x": {"kind": "dense", "dtype": "int64", "shape": []}})
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
    call = writer.put_plain.submit(64, 30.0)
    while (await st.stats())["unwritten"] == 0:
        await asyncio.sleep(0.01)
    await local_cluster.kill(writer)
    with pytest.raises(actors.ActorDiedError):
        await call
    ready = await st.get_meta("rollout", ["obs"], None, task="t")
    assert len(ready) == 8  # only the first put's samples are ready
