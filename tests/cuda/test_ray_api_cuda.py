"""``rayless.ray`` on a real GPU: a GPU actor sees its GPU as Ray's do, and one spawned with
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` (verl's, OpenRLHF's, slime's and SGLang's
rollouts) sees the node's GPUs and selects its own by ``ray.get_gpu_ids()``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from rayless import ray

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module", autouse=True)
def session() -> Iterator[None]:
    ray.init(num_gpus=1, num_cpus=2)
    yield
    ray.shutdown()


@ray.remote(num_gpus=1, num_cpus=0)
class OnGpu:
    def allocate(self, select: bool) -> dict[str, Any]:
        import os

        import torch

        ids = ray.get_gpu_ids()
        if select:  # what a NOSET rollout does: its own GPU among the node's
            torch.cuda.set_device(ids[0])
        x = torch.ones(1 << 20, device="cuda")
        return {
            "ids": ids,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "count": torch.cuda.device_count(),
            "device": x.device.index,
            "sum": float(x.sum().item()),
        }


def test_a_gpu_actor_sees_its_gpu_with_and_without_noset() -> None:
    plain = ray.get(OnGpu.remote().allocate.remote(False), timeout=120)
    assert plain["ids"] == [int(plain["visible"])] and plain["count"] == 1
    assert plain["sum"] == float(1 << 20)
    noset = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}
    free = ray.get(OnGpu.options(runtime_env=noset).remote().allocate.remote(True), timeout=120)
    assert free["count"] >= 1 and free["device"] == free["ids"][0]  # the node's GPUs, its own
    assert free["sum"] == float(1 << 20)
