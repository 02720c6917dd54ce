"""Discovery against the real NVML (skipped without a GPU)."""

from __future__ import annotations

import os

import pytest

from rayless.placement import discover_node

pytestmark = pytest.mark.cuda


def test_real_nvml_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.delenv("RAYLESS_FAKE_GPUS", raising=False)
    info = discover_node()
    assert not info.fake_gpus
    assert info.num_gpus == torch.cuda.device_count() >= 1
    for gpu in info.gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.memory_bytes > 0 and gpu.name and gpu.pci_bus_id
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        assert info.gpu_indices == tuple(range(info.num_gpus))
        total = torch.cuda.get_device_properties(0).total_memory
        # NVML and CUDA differ by the driver's reservation; within 5 %.
        assert abs(max(g.memory_bytes for g in info.gpus) - total) < 0.05 * total


def test_real_nvml_honours_visible_devices_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYLESS_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    every = discover_node()
    last = every.gpus[-1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", last.uuid)
    assert discover_node().gpus == (last,)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(last.index))
    assert discover_node().gpus == (last,)


def test_fake_gpus_on_a_real_host(monkeypatch: pytest.MonkeyPatch) -> None:
    info = discover_node(fake_gpus=3, node_id="n")
    assert info.fake_gpus and info.gpu_indices == (0, 1, 2)
