"""ShardStorage on a CUDA device: data stays on the unit's device; round trips and reuse."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from rayless.store.data.schema import merge_parts, split_columns
from rayless.store.unit.shard import ShardStorage

pytestmark = pytest.mark.cuda


def batch(n: int, device: str) -> TensorDict:
    rows = [torch.arange(k + 1, dtype=torch.float32, device=device) for k in range(n)]
    return TensorDict(
        {
            "obs": torch.arange(n * 3, dtype=torch.float16, device=device).reshape(n, 3),
            "resp": torch.nested.nested_tensor(rows, layout=torch.jagged),
            "text": NonTensorStack.from_list([f"s{k}" for k in range(n)]),
        },
        batch_size=[n],
    )


def test_cuda_unit_keeps_data_on_its_device() -> None:
    s = ShardStorage("gpu0", device="cuda:0")
    update = s.write("p", [0, 1, 2], batch(3, "cpu"))  # a CPU put lands on the GPU
    assert update.schemas["obs"].device == "cpu"
    col = s._parts["p"]["obs"]
    assert col.data.device.type == "cuda"
    out = s.read("p", [2, 0])
    assert out["obs"].device.type == "cuda" and out["resp"].device.type == "cuda"
    assert out["obs"].cpu().tolist() == [[6.0, 7.0, 8.0], [0.0, 1.0, 2.0]]
    assert [r.cpu().tolist() for r in out["resp"].unbind()] == [[0.0, 1.0, 2.0], [0.0]]
    assert out.get("text").tolist() == ["s2", "s0"]


def test_cuda_put_round_trip_and_slot_reuse() -> None:
    s = ShardStorage("gpu0", device="cuda:0", capacity_bytes=1 << 20)
    td = batch(4, "cuda:0")
    s.write("p", [0, 1, 2, 3], td)
    cap = s._parts["p"]["obs"].capacity
    s.delete("p", [1, 2])
    s.write("p", [5, 6], batch(2, "cuda:0"))
    assert s._parts["p"]["obs"].capacity == cap
    out = s.read("p", [0, 3])
    assert torch.equal(out["obs"], td["obs"][[0, 3]])


def test_merge_parts_on_cuda() -> None:
    td = batch(3, "cuda:0")
    schemas = {n: c.schema for n, c in split_columns(td).items()}
    out = merge_parts(3, schemas, [([2], td[[2]]), ([0, 1], td[[0, 1]])], device="cuda:0")
    assert torch.equal(out["obs"], td["obs"])
    assert out["obs"].device.type == "cuda"
