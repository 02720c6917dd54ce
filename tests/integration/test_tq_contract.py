"""TransferQueue's contract, re-expressed against rayless.store: the scenarios of TQ's own
tests (controller, samplers, streaming dataset, KV and checkpoint end-to-end) that a TQ user
brings with them, on a real local cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from torch.utils.data import DataLoader

import rayless.actors as actors
from rayless.actors import Cluster
from rayless.store import Store, StoreInputError, StoreTimeoutError, SyncStore
from rayless.store.client.loader import StreamingDataset, StreamingLoader
from tests.waiting import wait_until as _wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=1)]


async def wait_until(
    pred: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = "a condition"
) -> None:
    """``tests.waiting.wait_until`` with this module's defaults."""
    await _wait_until(pred, timeout, what, interval=0.05)


def td(n: int, start: int = 0) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


async def test_a_rank_asking_for_its_step_twice_gets_its_part_and_loses_nothing(
    local_cluster: Cluster,
) -> None:
    # TQ's SeqlenBalancedSampler caches (partition, task, batch_index): each dp_rank asks any
    # number of times and gets its own part of the same step.
    st = await Store.create(local_cluster, num_units=2, name="tq-again", lease_after=60.0)
    lengths = [90, 1, 1, 1, 40, 40, 2, 1]
    await st.put(td(8), "p", custom_meta=[{"total_lengths": v} for v in lengths])

    def rank(r: int) -> StreamingLoader:
        return StreamingLoader(
            st, "p", ["x"], 2, task="train", dp_rank=r, dp_size=2,
            sampler={"name": "seqlen_balanced", "dp_size": 2}, timeout=10,
        )  # fmt: skip

    first, _ = await rank(0).__anext__()
    again, _ = await rank(0).__anext__()  # rank 0 restarts and asks for step 0 again
    assert again["x"].tolist() == first["x"].tolist()
    other, _ = await rank(1).__anext__()
    step0 = sorted(first["x"].tolist() + other["x"].tolist())
    assert step0 == [0, 1, 2, 3]  # before: rank 1 got part of the next batch, 2 samples lost
    assert (await st.consumption_status("p", "train"))["consumed"] == 4
    later = [rank(r) for r in range(2)]
    for r in range(2):
        later[r].step = 1
    rest = [x for r in range(2) for x in (await later[r].__anext__())[0]["x"].tolist()]
    assert sorted(step0 + rest) == list(range(8))  # every sample delivered to a rank, once


class Reconnects(actors.Actor):
    """An actor that opens, closes and opens again clients of a store."""

    async def twice(self, name: str) -> list[int]:
        sizes = []
        for _ in range(2):
            st = await Store.connect(name)
            sizes.append(len(st.units))
            await st.aclose()
        return sizes

    def twice_sync(self, name: str) -> list[int]:
        sizes = []
        for _ in range(2):
            with SyncStore.connect(name) as st:
                sizes.append(len(st.units))
        return sizes


async def test_connect_after_a_closed_client_inside_an_actor(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="tq-reconnect")
    actor = await local_cluster.spawn(Reconnects)
    assert await actor.twice("tq-reconnect") == [2, 2]  # before: ConnectError the 2nd time
    assert await actor.twice_sync("tq-reconnect") == [2, 2]
    await st.aclose()


def _read(
    name: str, workers: int, epochs: int, timeout: float = 20, context: str | None = None
) -> list[list[int]]:
    """Read ``epochs`` epochs of 4 steps through a real DataLoader (blocking: in a thread)."""
    with SyncStore.connect(name) as ss:
        ds = StreamingDataset(ss, "p", ["x"], 2, task="train", steps=4, timeout=timeout)
        loader = DataLoader(
            ds, batch_size=None, num_workers=workers, multiprocessing_context=context
        )
        out = []
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            seen = []
            for td, meta in loader:
                assert isinstance(td, TensorDict) and meta.size == td.batch_size[0] == 2
                seen += td["x"].tolist()
            out.append(seen)
        return out


@pytest.mark.parametrize("workers", [0, 2])
async def test_the_dataset_inside_a_real_dataloader(local_cluster: Cluster, workers: int) -> None:
    # before: default collate failed on (TensorDict, BatchMeta); with workers it hung
    st = await Store.create(local_cluster, num_units=2, name=f"tq-dl{workers}")
    await st.put(td(16), "p")
    epochs = await asyncio.to_thread(_read, f"tq-dl{workers}", workers, 2)
    # epoch 2 is the next 4 steps (workers fetch their steps concurrently: any order inside)
    assert [sorted(e) for e in epochs] == [list(range(8)), list(range(8, 16))]
    assert (await st.consumption_status("p", "train"))["consumed"] == 16
    await st.aclose()


async def test_the_dataset_in_a_spawned_dataloader_worker(local_cluster: Cluster) -> None:
    # a trainer holding CUDA tensors spawns its worker: the dataset is pickled (before: its
    # store client's locks could not be) and the worker joins the parent's cluster (this one
    # is neither published nor in the environment: the token goes down spawn's pipe)
    st = await Store.create(local_cluster, num_units=1, name="tq-dls")
    await st.put(td(8), "p")
    epochs = await asyncio.to_thread(_read, "tq-dls", 1, 1, 60, "spawn")
    assert [sorted(e) for e in epochs] == [list(range(8))]
    assert (await st.consumption_status("p", "train"))["consumed"] == 8
    await st.aclose()


def _times_out(name: str, workers: int) -> None:
    with SyncStore.connect(name) as ss:
        ds = StreamingDataset(ss, "p", ["x"], 2, task="train", steps=2, timeout=1)
        with pytest.raises(StoreTimeoutError):  # before, with workers: hung
            list(DataLoader(ds, batch_size=None, num_workers=workers))


@pytest.mark.parametrize("workers", [0, 2])
async def test_the_datasets_timeout_fires_inside_a_dataloader(
    local_cluster: Cluster, workers: int
) -> None:
    st = await Store.create(local_cluster, num_units=1, name=f"tq-dlt{workers}")
    await st.put(td(1), "p")  # a step needs 2
    await asyncio.to_thread(_times_out, f"tq-dlt{workers}", workers)
    assert (await st.consumption_status("p", "train"))["consumed"] == 0
    await st.aclose()


async def test_tq_status_kv_and_checkpoint_behaviours(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="tq-habits")
    meta = await st.put(td(4), "p")
    for task in ("a", "b"):
        assert (await st.get_meta("p", ["x"], 4, task=task, timeout=5)).size == 4
    await st.reset_consumption(None, "p")  # TQ: task None resets every task
    for task in ("a", "b"):
        assert (await st.consumption_status("p", task))["consumed"] == 0
    await st.clear(meta.select([0, 1]))
    await st.clear(meta.select([0, 1]))  # TQ: clearing cleared samples is a no-op
    await st.clear(meta)  # the live rest goes, the cleared part is skipped
    assert "p" not in await st.partitions() or not (await st.get_meta("p", ["x"], None)).size
    assert await st.kv_list("never-made") == {}  # TQ: an unknown partition lists as {}
    await st.kv_batch_put(["k0", "k1"], "kv", td(2))
    await st.kv_clear(["k0", "nobody"], "kv")
    await st.kv_clear(["k0"], "kv")  # cleared already: idempotent
    await st.kv_clear(["k0"], "no-such-partition")
    assert set((await st.kv_list("kv"))["kv"]) == {"k1"}
    await st.kv_clear(["k1"], "kv")
    assert await st.kv_list("kv") == {}  # a partition without keys lists as {}
    await st.kv_batch_put(["k2"], "kv", td(1, 5))
    await st.save_checkpoint(tmp_path / "ck", metadata={"step": 1000})
    with pytest.raises(StoreInputError):
        await st.save_checkpoint(tmp_path / "bad", metadata={"when": object()})
    assert not (tmp_path / "bad").exists()
    await st.aclose()
    fresh = await Store.create(local_cluster, num_units=1, name="tq-habits2")
    restored = await fresh.load_checkpoint(tmp_path / "ck")
    assert restored.metadata == {"step": 1000} and len(restored["kv"]) == 1
    for missing in (tmp_path / "nothing", tmp_path / "bad"):
        with pytest.raises(FileNotFoundError) as err:
            await fresh.load_checkpoint(missing)
        assert isinstance(err.value, StoreInputError)
    await fresh.aclose()


async def test_per_sample_lists_numpy_arrays_and_bytes_round_trip(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="tq-values")
    batch = td(3)
    batch.set_non_tensor("info", [{"i": i} for i in range(3)])  # one dict per sample (TQ)
    batch["raw"] = NonTensorStack(*[NonTensorData(bytes([i]) * 3) for i in range(3)])
    arrays = [np.arange(i + 1, dtype=np.float32) for i in range(3)]  # differing shapes
    batch["arr"] = NonTensorStack(*[NonTensorData(a) for a in arrays])
    batch["dense_np"] = np.arange(6).reshape(3, 2)  # tensordict makes it a tensor
    meta = await st.put(batch, "p")
    got = await st.get(meta)
    assert got["info"] == [{"i": 0}, {"i": 1}, {"i": 2}]  # before: the whole list per sample
    assert got["raw"] == [b"\x00" * 3, b"\x01" * 3, b"\x02" * 3]
    for back, sent in zip(got["arr"], arrays, strict=True):
        assert isinstance(back, np.ndarray) and back.dtype == np.float32
        assert back.tolist() == sent.tolist()
    assert got["dense_np"].tolist() == [[0, 1], [2, 3], [4, 5]]
    one = await st.get(meta.select([1]))
    assert one["info"] == [{"i": 1}]
    with pytest.raises(StoreInputError):  # object arrays would need pickle
        bad = td(1)
        bad["o"] = NonTensorStack(NonTensorData(np.array([object()], dtype=object)))
        await st.put(bad, "p")
    await st.aclose()


async def test_a_kv_batch_put_sets_its_missing_keys_once(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kv_batch_put built a set of the missing keys once per key (quadratic: 4,096 keys took
    # 200 ms of the client's CPU); now once per put, whatever the number of keys
    import rayless.store.client.store as store_module

    made = 0

    def counting_set(*args: Any) -> set[Any]:
        nonlocal made
        made += 1
        return set(*args)

    st = await Store.create(local_cluster, num_units=1, name="kv-counts")
    monkeypatch.setattr(store_module, "set", counting_set, raising=False)
    keys = [f"k{i}" for i in range(300)]
    await st.kv_batch_put(keys, "kv", td(300))
    await st.kv_batch_put(keys, "kv", td(300, 7))  # every key present: the update path
    assert made <= 4
    assert set((await st.kv_list("kv"))["kv"]) == set(keys)
    await st.aclose()
