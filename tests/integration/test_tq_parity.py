"""The same TransferQueue programs on ``rayless.transfer_queue`` and, where TransferQueue and
Ray are installed (``pip install -e '.[bench]'``), on TransferQueue 0.1.x itself: our
expectations are TransferQueue's. Without them that half is skipped.

Each scenario takes ``(ray, tq)``: the Ray module its workers use and the TransferQueue
module. Reads return jagged nested tensors on both (TransferQueue's layout); ``dense`` stacks
their samples to compare values.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rayless_tq_parity")]

_HAS_TQ = (
    importlib.util.find_spec("transfer_queue") is not None
    and importlib.util.find_spec("ray") is not None
)


@pytest.fixture(
    scope="module",
    params=[
        "rayless",
        pytest.param("transfer_queue", marks=pytest.mark.skipif(not _HAS_TQ, reason="no TQ")),
    ],
)
def api(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    if request.param == "rayless":
        import rayless.transfer_queue as tq
        from rayless import ray
    else:
        import ray  # type: ignore[import-not-found,no-redef]
        import transfer_queue as tq  # type: ignore[import-not-found,no-redef]
    ray.init(num_cpus=4)
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 2}}})
    yield ray, tq
    tq.close()
    ray.shutdown()


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a dense tensor (a nested one's samples stacked)."""
    return torch.stack(list(t.unbind())) if t.is_nested else t


def batch(n: int, start: int = 0) -> TensorDict:
    ids = torch.arange(start, start + 3 * n).reshape(n, 3)
    return TensorDict({"input_ids": ids, "score": ids.sum(1).float()}, batch_size=n)


def test_kv_batch_put_get_list_clear(api: tuple[Any, Any]) -> None:
    # TransferQueue's kv_batch_put / kv_batch_get / kv_list / kv_clear docstring examples
    _, tq = api
    keys = [f"a{i}" for i in range(5)]
    td = batch(5)
    meta = tq.kv_batch_put(
        keys=keys, partition_id="kv", fields=td, tags=[{"i": i} for i in range(5)]
    )
    assert isinstance(meta, tq.KVBatchMeta)
    assert meta.keys == keys and meta.size == 5 and len(meta) == 5
    assert sorted(meta.fields) == ["input_ids", "score"]
    assert meta.partition_id == "kv" and meta.tags[3] == {"i": 3}

    got = tq.kv_batch_get(keys=["a1", "a4"], partition_id="kv")
    assert torch.equal(dense(got["input_ids"]), td["input_ids"][[1, 4]])
    assert torch.equal(dense(got["score"]), td["score"][[1, 4]])
    one = tq.kv_batch_get(keys="a2", partition_id="kv", select_fields="score")
    assert list(one.keys()) == ["score"]
    assert torch.equal(dense(one["score"]), td["score"][[2]])

    listing = tq.kv_list(partition_id="kv")
    assert list(listing) == ["kv"] and listing["kv"]["a0"] == {"i": 0}
    assert set(listing["kv"]) == set(keys)
    assert "kv" in tq.kv_list()

    tq.kv_clear(keys=["a0", "a1"], partition_id="kv")
    tq.kv_clear(keys="a2", partition_id="kv")
    assert set(tq.kv_list(partition_id="kv")["kv"]) == {"a3", "a4"}
    with pytest.raises(ValueError):
        tq.kv_batch_get(keys=["a0"], partition_id="kv")
    tq.kv_clear(keys=["a3", "a4"], partition_id="kv")


def test_kv_put_one_key_and_tag_updates(api: tuple[Any, Any]) -> None:
    # kv_put: a dict of one sample's tensors gets its batch dimension; a tag alone updates
    _, tq = api
    meta = tq.kv_put(
        key="s1", partition_id="one", fields={"input_ids": torch.tensor([1, 2, 3])}, tag={"x": 1}
    )
    assert meta.keys == ["s1"] and meta.fields == ["input_ids"] and meta.tags == [{"x": 1}]
    tq.kv_put(key="s1", partition_id="one", tag={"x": 2})
    assert tq.kv_list(partition_id="one")["one"]["s1"] == {"x": 2}
    got = tq.kv_batch_get(keys="s1", partition_id="one")
    assert torch.equal(dense(got["input_ids"]), torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError):
        tq.kv_put(key="s2", partition_id="one")
    tq.kv_clear(keys="s1", partition_id="one")


def test_kv_batch_meta_split_join_and_get_by_meta(api: tuple[Any, Any]) -> None:
    _, tq = api
    keys = [f"m{i}" for i in range(5)]
    td = batch(5, start=100)
    meta = tq.kv_batch_put(
        keys=keys, partition_id="bym", fields=td, tags=[{"i": i} for i in range(5)]
    )
    parts = meta.chunk(2)
    assert [p.keys for p in parts] == [keys[:3], keys[3:]]
    assert tq.KVBatchMeta.concat(parts).keys == keys
    picked = meta.select_keys(["m4", "m0"])
    assert picked.tags == [{"i": 4}, {"i": 0}]
    got = tq.kv_batch_get_by_meta(picked)
    assert torch.equal(dense(got["input_ids"]), td["input_ids"][[4, 0]])
    only = tq.kv_batch_get_by_meta(parts[1], select_fields=["score"])
    assert list(only.keys()) == ["score"]
    picked.reorder([1, 0])
    assert picked.keys == ["m0", "m4"]
    with pytest.raises(ValueError):
        picked.reorder([0, 0])
    with pytest.raises(RuntimeError):
        meta.select_keys(["nope"])
    with pytest.raises(ValueError):
        tq.KVBatchMeta(keys=["a", "a"], tags=[{}, {}])
    tq.kv_clear(keys=keys, partition_id="bym")


def test_a_worker_attaches_and_reads_by_meta(api: tuple[Any, Any]) -> None:
    # a trainer hands KVBatchMeta chunks to its workers; each attaches with tq.init()
    ray, tq = api

    @ray.remote
    class Worker:
        def __init__(self) -> None:
            tq.init()

        def total(self, meta: Any) -> int:
            return int(dense(tq.kv_batch_get_by_meta(meta)["input_ids"]).sum())

        def write(self, keys: list[str]) -> list[str]:
            return tq.kv_batch_put(keys=keys, partition_id="w", fields=batch(len(keys))).keys

    keys = [f"w{i}" for i in range(6)]
    td = batch(6)
    meta = tq.kv_batch_put(keys=keys, partition_id="w", fields=td)
    workers = [Worker.remote() for _ in range(2)]
    sums = ray.get([w.total.remote(p) for w, p in zip(workers, meta.chunk(2), strict=True)])
    assert sums == [int(td["input_ids"][:3].sum()), int(td["input_ids"][3:].sum())]
    assert ray.get(workers[0].write.remote(["x0", "x1"])) == ["x0", "x1"]
    assert {"x0", "x1"} <= set(tq.kv_list(partition_id="w")["w"])
    tq.kv_clear(keys=[*keys, "x0", "x1"], partition_id="w")


def test_low_level_client(api: tuple[Any, Any]) -> None:
    # TransferQueueClient: put, get_meta (fetch consumes), get_data, statuses, clear
    _, tq = api
    client = tq.get_client()
    td = batch(4)
    meta = client.put(data=td, partition_id="ll")
    assert meta.size == 4
    assert client.check_production_status(data_fields=["input_ids"], partition_id="ll")
    assert not client.check_production_status(data_fields=["nope"], partition_id="ll")
    assert not client.check_consumption_status(task_name="train", partition_id="ll")
    got = client.get_meta(
        data_fields=["input_ids"], batch_size=4, partition_id="ll", task_name="train"
    )
    data = client.get_data(got)
    assert torch.equal(dense(data["input_ids"]), td["input_ids"])
    assert client.check_consumption_status(task_name="train", partition_id="ll")
    with pytest.raises(RuntimeError):  # nothing left for "train" (TQ: after 1 s)
        client.get_meta(
            data_fields=["input_ids"], batch_size=1, partition_id="ll", task_name="train"
        )
    assert client.reset_consumption(partition_id="ll", task_name="train")
    again = client.get_meta(
        data_fields=["score"], batch_size=2, partition_id="ll", task_name="train"
    )
    assert again.size == 2
    assert "ll" in client.get_partition_list()
    client.clear_partition(partition_id="ll")
    assert "ll" not in client.get_partition_list()


def test_async_kv_functions(api: tuple[Any, Any]) -> None:
    # the async_ forms, awaited on the caller's own event loop
    _, tq = api
    keys = ["y0", "y1", "y2"]
    td = batch(3, start=7)

    async def main() -> tuple[Any, Any, Any]:
        meta = await tq.async_kv_batch_put(keys=keys, partition_id="as", fields=td)
        got = await tq.async_kv_batch_get(keys=keys, partition_id="as")
        by_meta = await tq.async_kv_batch_get_by_meta(meta, select_fields="score")
        listing = await tq.async_kv_list(partition_id="as")
        await tq.async_kv_clear(keys=keys, partition_id="as")
        return got, by_meta, listing

    got, by_meta, listing = asyncio.run(main())
    assert torch.equal(dense(got["input_ids"]), td["input_ids"])
    assert torch.equal(dense(by_meta["score"]), td["score"])
    assert set(listing["as"]) == set(keys)
    assert "as" not in tq.kv_list() or not tq.kv_list()["as"]


def test_checkpoint_round_trip(api: tuple[Any, Any], tmp_path: Path) -> None:
    _, tq = api
    keys = ["c0", "c1"]
    td = batch(2, start=50)
    tq.kv_batch_put(keys=keys, partition_id="ck", fields=td, tags=[{"t": 0}, {"t": 1}])
    target = tmp_path / "ckpt"
    tq.save_checkpoint(target, metadata={"step": 10})
    tq.save_checkpoint(target, metadata={"step": 11})  # replaces the first
    tq.kv_clear(keys=keys, partition_id="ck")
    tq.load_checkpoint(target)
    got = tq.kv_batch_get(keys=keys, partition_id="ck")
    assert torch.equal(dense(got["input_ids"]), td["input_ids"])
    assert tq.kv_list(partition_id="ck")["ck"]["c1"] == {"t": 1}
    with pytest.raises(FileNotFoundError):
        tq.load_checkpoint(tmp_path / "absent")
    tq.kv_clear(keys=keys, partition_id="ck")


def test_an_async_actor_attaches_on_its_first_async_call(api: tuple[Any, Any]) -> None:
    # an agent-loop style worker: async methods only, no tq.init(); the async_ forms attach
    ray, tq = api

    @ray.remote
    class AgentLoop:
        async def rewards(self, keys: list[str]) -> float:
            got = await tq.async_kv_batch_get(keys=keys, partition_id="agent")
            return float(dense(got["score"]).sum())

        async def blocking(self, keys: list[str]) -> str:
            try:
                tq.kv_batch_get(keys=keys, partition_id="agent")
            except RuntimeError as exc:  # rayless: the call would block the actor's loop
                return str(exc)
            return "served"

    keys = ["g0", "g1", "g2"]
    td = batch(3)
    tq.kv_batch_put(keys=keys, partition_id="agent", fields=td)
    loops = [AgentLoop.remote() for _ in range(2)]
    totals = ray.get([a.rewards.remote(keys) for a in loops])
    assert totals == [float(td["score"].sum())] * 2
    answer = ray.get(loops[0].blocking.remote(keys))
    if tq.__name__.startswith("rayless"):
        assert "async_" in answer
    else:  # TransferQueue's blocking call runs on its own thread's loop
        assert answer == "served"
    tq.kv_clear(keys=keys, partition_id="agent")


def test_reads_come_back_in_transfer_queues_layout(api: tuple[Any, Any]) -> None:
    # TransferQueue 0.1.x returns every field with per-sample dimensions as a jagged nested
    # tensor (verl calls .to_padded_tensor() on what it reads), one value per sample dense
    _, tq = api
    rows = [torch.arange(2), torch.arange(3), torch.arange(1)]
    td = TensorDict(
        {
            "ids": torch.arange(6).reshape(3, 2),
            "r": torch.tensor([0.5, 1.5, 2.5]),
            "img": torch.arange(12.0).reshape(3, 2, 2),
            "same": torch.nested.as_nested_tensor([torch.arange(2)] * 3, layout=torch.jagged),
            "ragged": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
        },
        batch_size=3,
    )
    keys = ["l0", "l1", "l2"]
    tq.kv_batch_put(keys=keys, partition_id="layout", fields=td)
    for got in (
        tq.kv_batch_get(keys=keys, partition_id="layout"),
        tq.get_client().get_data(
            tq.get_client().put(data=td.exclude("ragged"), partition_id="ll2")
        ),
    ):
        for name in ("ids", "img", "same"):
            assert got[name].is_nested and got[name].layout == torch.jagged, name
        assert not got["r"].is_nested and torch.equal(got["r"], td["r"])
        assert torch.equal(got["ids"].to_padded_tensor(-1), td["ids"])
        assert torch.equal(got["img"].to_padded_tensor(-1.0), td["img"])
        assert [len(s) for s in got["same"].unbind()] == [2, 2, 2]
    ragged = tq.kv_batch_get(keys=keys, partition_id="layout", select_fields="ragged")["ragged"]
    assert [s.tolist() for s in ragged.unbind()] == [r.tolist() for r in rows]
    assert ragged.to_padded_tensor(-1).shape == (3, 3)
    tq.kv_clear(keys=keys, partition_id="layout")
    tq.get_client().clear_partition(partition_id="ll2")


def test_per_sample_python_values_round_trip(api: tuple[Any, Any]) -> None:
    # verl keeps uids and chat messages beside the tensors (NonTensorStack fields)
    _, tq = api
    from tensordict import NonTensorStack

    td = TensorDict({"x": torch.arange(3)}, batch_size=3)
    td["uid"] = NonTensorStack("u0", "u1", "u2")
    td["raw_prompt"] = NonTensorStack(*[[{"role": "user", "content": f"q{i}"}] for i in range(3)])
    tq.kv_batch_put(keys=["n0", "n1", "n2"], partition_id="py", fields=td)
    out = tq.kv_batch_get(keys=["n2", "n0"], partition_id="py")
    assert list(out["uid"]) == ["u2", "u0"]
    assert out.get("raw_prompt").tolist() == [
        [{"role": "user", "content": "q2"}],
        [{"role": "user", "content": "q0"}],
    ]
    tq.kv_clear(keys=["n0", "n1", "n2"], partition_id="py")


def test_per_sample_status_and_key_lookups(api: tuple[Any, Any]) -> None:
    # the client's get_consumption_status / get_production_status (tensors per sample) and
    # kv_retrieve_keys / kv_retrieve_meta (a BatchMeta's indexes <-> KV keys, as verl's
    # helpers turn a BatchMeta into a KVBatchMeta)
    _, tq = api
    c = tq.get_client()
    meta = c.put(
        TensorDict({"a": torch.arange(4), "b": torch.ones(4, 2)}, batch_size=4),
        partition_id="st",
    )
    got = c.get_meta(data_fields=["a"], batch_size=2, partition_id="st", task_name="t")
    indexes, consumed = c.get_consumption_status("t", "st")
    assert indexes.tolist() == sorted(meta.global_indexes) and consumed.dtype == torch.int8
    done = {i for i, s in zip(indexes.tolist(), consumed.tolist(), strict=True) if s}
    assert done == set(got.global_indexes)
    assert c.get_consumption_status("other", "st")[1].tolist() == [0, 0, 0, 0]
    _, produced = c.get_production_status(["a", "b"], "st")
    assert produced.tolist() == [[1, 1]] * 4 and produced.dtype == torch.int8
    assert c.get_production_status(["a", "zz"], "st") == (None, None)
    assert c.get_consumption_status("t", "no-such-partition") == (None, None)
    c.clear_partition("st")

    tq.kv_batch_put(keys=["k1", "k2"], partition_id="kvr", fields=batch(2))
    kmeta = c.kv_retrieve_meta(["k2", "k1", "absent"], "kvr")  # the absent key is left out
    assert kmeta.size == 2 and sorted(kmeta.field_names) == ["input_ids", "score"]
    assert c.kv_retrieve_keys(list(kmeta.global_indexes), "kvr") == ["k2", "k1"]
    assert c.kv_retrieve_keys(kmeta.global_indexes[0], "kvr") == ["k2"]
    assert c.kv_retrieve_meta("k1", "no-such-partition").size == 0
    with pytest.raises(ValueError):
        c.kv_retrieve_keys([], "kvr")
    with pytest.raises(TypeError):
        c.kv_retrieve_meta([1], "kvr")
    tq.kv_clear(keys=["k1", "k2"], partition_id="kvr")
