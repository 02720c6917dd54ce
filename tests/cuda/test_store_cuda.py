"""The store with units on CUDA: columns stay on the GPU, same-node clients move CUDA tensors
by IPC handles, consumers choose their device. Needs a GPU (one is enough: two units share it)."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from rayless.actors import Cluster
from rayless.store import Store

pytestmark = [pytest.mark.cuda, pytest.mark.integration]
SHAPE = pytest.mark.local_cluster(nodes=1, gpus_per_node=1, isolated=True)


def batch(n: int, device: str) -> TensorDict:
    rows = [torch.arange(k % 7 + 1, dtype=torch.float32, device=device) for k in range(n)]
    return TensorDict(
        {
            "obs": torch.randn(n, 64, device=device),
            "ids": torch.arange(n, device=device),
            "resp": torch.nested.as_nested_tensor(rows, layout=torch.jagged),
            "text": NonTensorStack.from_list([f"s{k}" for k in range(n)]),
        },
        batch_size=[n],
    )


def same(a: TensorDict, b: TensorDict) -> bool:
    for key in ("obs", "ids"):
        if not torch.equal(a[key].cpu(), b[key].cpu()):
            return False
    rows = zip(a["resp"].unbind(0), b["resp"].unbind(0), strict=True)
    return (
        all(torch.equal(x.cpu(), y.cpu()) for x, y in rows)
        and a["text"].tolist() == b["text"].tolist()
    )


async def _cuda_store(cluster: Cluster) -> Store:
    return await Store.create(cluster, num_units=2, device="cuda", gpus_per_unit=0.5)


@SHAPE
async def test_cuda_round_trip_stays_on_gpu(local_cluster: Cluster) -> None:
    st = await _cuda_store(local_cluster)
    assert all(u["device"] == "cuda:0" for u in st.units)
    td = batch(32, "cuda")
    meta = await st.put(td, partition="p")
    assert meta.field_schemas["obs"].device == "cuda:0"
    stats = await st.stats()
    assert all(s["device"] == "cuda:0" and s["used_bytes"] > 0 for s in stats["unit_stats"])
    out = await st.get(meta)
    assert out["obs"].device.type == "cuda" and out["resp"].device.type == "cuda"
    assert same(td, out)
    on_cpu = await st.get(meta, device="cpu")
    assert on_cpu["obs"].device.type == "cpu" and same(td, on_cpu)


@SHAPE
async def test_cpu_put_into_cuda_units_comes_back_on_cpu(local_cluster: Cluster) -> None:
    st = await _cuda_store(local_cluster)
    td = batch(16, "cpu")
    meta = await st.put(td, partition="p")
    fetched = await st.get_meta("p", ["obs", "ids", "resp", "text"], 16, task="t", timeout=5)
    out = await st.get(fetched)
    assert out["obs"].device.type == "cpu" and same(td, out)
    on_gpu = await st.get(meta, device="cuda:0")
    assert on_gpu["ids"].device.type == "cuda"


@SHAPE
async def test_cuda_kv_and_column_put(local_cluster: Cluster) -> None:
    st = await _cuda_store(local_cluster)
    meta = await st.put(TensorDict({"a": torch.ones(8, 4, device="cuda")}, [8]), "p")
    await st.put(TensorDict({"b": torch.zeros(8, device="cuda")}, [8]), meta=meta)
    out = await st.get(await st.get_meta("p", ["a", "b"], 8, task="t", timeout=5))
    assert out["a"].is_cuda and float(out["a"].sum()) == 32.0 and float(out["b"].sum()) == 0.0
    await st.kv_put(["x", "y"], TensorDict({"v": torch.arange(2.0, device="cuda")}, [2]))
    got = await st.kv_get(["y", "x"], device="cuda:0")
    assert got["v"].is_cuda and got["v"].tolist() == [1.0, 0.0]
