"""Codec with CUDA: IPC handles between real processes, pinned staging, receiver device choice."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.transport.codec import decode, encode

pytestmark = pytest.mark.cuda


def _consumer(frames: list[bytes], results: Any) -> None:
    """Child process: open the IPC tensors, check them, modify one in place, report back."""
    try:
        out = decode(frames)
        dense, view = out["dense"], out["view"]
        results.put(
            (
                str(dense.device),
                float(dense.sum().item()),
                tuple(view.stride()),
                float(view.sum().item()),
            )
        )
        dense.mul_(2)  # shared memory: the producer sees it
        torch.cuda.synchronize()
        del out, dense, view
        results.put("released")
    except BaseException as exc:  # report, don't hang the parent
        results.put(f"error: {exc!r}")


def test_ipc_round_trip_between_processes() -> None:
    base = torch.arange(64, dtype=torch.float32, device="cuda").reshape(8, 8)
    view = base.t()[2:6]  # non-contiguous: strides travel as they are, no copy
    frames = encode({"dense": base, "view": view}, cuda_ipc=True)
    assert len(frames) == 1  # handles only, no host buffers
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_consumer, args=([bytes(f) for f in frames], results))
    child.start()
    first = results.get(timeout=120)
    assert not isinstance(first, str), first
    device, total, stride, view_total = first
    assert device == "cuda:0"
    assert total == float(base.sum().item())
    assert stride == tuple(view.stride()) and view_total == float(view.sum().item())
    assert results.get(timeout=60) == "released"
    child.join(timeout=60)
    assert child.exitcode == 0
    torch.cuda.synchronize()
    assert torch.equal(base, torch.arange(64, dtype=torch.float32, device="cuda").reshape(8, 8) * 2)


def test_ipc_in_same_process_and_device_choice() -> None:
    t = torch.randn(1000, device="cuda")
    out = decode(encode(t, cuda_ipc=True))
    assert out.is_cuda and torch.equal(out, t)
    on_cpu = decode(encode(t, cuda_ipc=True), device="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu, t.cpu())


def test_pinned_staging_and_device_mapping() -> None:
    t = torch.randn(4, 5, device="cuda").t()  # non-contiguous
    frames = encode({"t": t, "cpu": torch.ones(2)})
    assert len(frames) == 3
    keep = decode(frames)
    assert keep["t"].device == torch.device("cuda", torch.cuda.current_device())
    assert torch.equal(keep["t"], t) and keep["cpu"].device.type == "cpu"
    cpu = decode(encode({"t": t, "cpu": torch.ones(2)}), device="cpu")
    assert cpu["t"].device.type == "cpu" and torch.equal(cpu["t"], t.cpu())
    last = torch.cuda.device_count() - 1
    explicit = decode(encode({"t": t, "cpu": torch.ones(2)}), device=last)
    assert explicit["t"].device == torch.device("cuda", last)
    assert explicit["cpu"].device.type == "cpu"  # CPU tensors stay on the CPU


@pytest.mark.parametrize("cuda_ipc", [False, True])
def test_cuda_tensordict(cuda_ipc: bool) -> None:
    td = TensorDict(
        {"a": torch.randn(3, 2), "sub": {"b": torch.arange(3)}}, batch_size=[3], device="cuda:0"
    )
    out = decode(encode(td, cuda_ipc=cuda_ipc))
    assert out.device is not None and out.device.type == "cuda"
    assert torch.equal(out["a"], td["a"]) and torch.equal(out["sub", "b"], td["sub", "b"])
    cpu = decode(encode(td, cuda_ipc=cuda_ipc), device="cpu")
    assert cpu.device == torch.device("cpu") and torch.equal(cpu["a"], td["a"].cpu())


def test_jagged_on_cuda() -> None:
    nt = torch.nested.nested_tensor(
        [torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged, device="cuda"
    )
    for ipc in (False, True):
        out = decode(encode(nt, cuda_ipc=ipc))
        assert out.is_cuda and torch.equal(out.values(), nt.values())


def test_decode_origin_keeps_each_tensor_on_its_device() -> None:
    """``device="origin"`` (a copy within one process, ``ray.put``'s): each CUDA tensor lands
    on the device it was sent from, not on the current one; the bytes are a copy."""
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    value = {"a": torch.ones(4, device="cuda:0"), "b": torch.arange(3, device=last), "c": 1}
    frames = [f if type(f) is bytes else bytearray(f) for f in encode(value)]
    with torch.cuda.device(0):
        out = decode(frames, device="origin")
    assert out["a"].device == value["a"].device and out["b"].device == last
    value["a"].add_(1)
    assert float(out["a"].sum()) == 4.0 and out["b"].tolist() == [0, 1, 2]
    td = TensorDict({"x": torch.zeros(2, device=last)}, batch_size=[2], device=last)
    assert decode(list(map(bytes, encode(td))), device="origin").device == last
