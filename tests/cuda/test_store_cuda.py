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
    st = await Store.create(cluster, num_units=2, device="cuda", gpus_per_unit=0.5)
    await st.ready()  # the tests read st.units before any operation waited for them
    return st


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


def _opened(st: Store) -> int:
    return sum(1 for m in st._plane._maps.values() if m.tensor is not None)


@SHAPE
async def test_same_host_cuda_put_and_get_go_through_the_units_ipc_columns(
    local_cluster: Cluster,
) -> None:
    st = await _cuda_store(local_cluster)
    assert all(await st._plane.is_local(u) for u in st.units)
    assert all(st._plane.gpu_of(u) is not None for u in st.units)
    td = batch(64, "cuda")
    meta = await st.put(td, partition="p")
    assert _opened(st) >= 2, "the client opened each unit's dense columns by CUDA IPC"
    out = await st.get(meta)
    assert out["obs"].is_cuda and same(td, out)
    assert same(td, await st.get(meta, device="cpu"))
    assert same(td, await st.get(meta, zero_copy=True))  # CUDA columns: a copy, not views
    picked = meta.select([5, 1, 40, 33])  # rows that are no run of slots
    assert torch.equal((await st.get(picked, ["obs"]))["obs"], td["obs"][[5, 1, 40, 33]])
    # column-wise, from the CPU, onto the same samples
    meta = await st.put(TensorDict({"y": torch.arange(64.0)}, [64]), meta=meta)
    assert (await st.get(meta, ["y"], device="cpu"))["y"].tolist() == list(range(64))
    # many rounds of put, get and clear: reused slots never show old or torn rows
    for k in range(20):
        new = await st.put(
            TensorDict({"obs": torch.full((32, 64), float(k), device="cuda")}, [32]), "q"
        )
        got = await st.get(new)
        assert bool((got["obs"] == k).all())
        await st.clear(new)
    await st.shutdown()


@SHAPE
async def test_a_cuda_unit_killed_leaves_no_lease_segment_and_reads_fail_typed(
    local_cluster: Cluster,
) -> None:
    import os

    from rayless.store import PartialResultError, UnitLostError
    from rayless.transport import shm
    from tests.chaos.scenarios import until

    st = await _cuda_store(local_cluster)
    meta = await st.put(batch(16, "cuda"), partition="p")
    pids = {a["name"]: int(a["pid"]) for n in await local_cluster.nodes() for a in n["actors"]}
    victim = st.units[1]
    pid = pids[victim["unit_id"]]
    assert [f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"rayless-{pid}-")]
    os.kill(pid, 9)
    with pytest.raises((UnitLostError, PartialResultError)):
        await st.get(meta)
    gone = lambda: not [f for f in os.listdir(shm.SHM_DIR) if f.startswith(f"rayless-{pid}-")]  # noqa: E731
    assert await until(gone, 30), "the agent's sweep removes a dead unit's lease segments"
    await st.shutdown()


@SHAPE
async def test_cuda_field_of_several_widths_dense_per_width_nested_mixed(
    local_cluster: Cluster,
) -> None:
    """Issue 41 item 9 on CUDA units: a put of another width goes to a column part of its own
    (CUDA IPC copies as for one width); each batch reads back dense, a mixed read nested."""
    st = await _cuda_store(local_cluster)
    a = torch.arange(32, dtype=torch.float32, device="cuda").view(8, 4)
    b = torch.arange(48, dtype=torch.float32, device="cuda").view(8, 6) + 100
    ma = await st.put(TensorDict({"x": a}, [8]), partition="p")
    mb = await st.put(TensorDict({"x": b}, [8]), partition="p")
    one = (await st.get(mb))["x"]
    assert one.device.type == "cuda" and not one.is_nested and torch.equal(one, b)
    both = (await st.get(type(ma).concat([ma, mb])))["x"]
    assert both.is_nested and both.device.type == "cuda"
    rows = [r.cpu().tolist() for r in both.unbind(0)]
    assert rows == [r.tolist() for r in a.cpu()] + [r.tolist() for r in b.cpu()]
    on_cpu = (await st.get(ma, device="cpu"))["x"]
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, a.cpu())
