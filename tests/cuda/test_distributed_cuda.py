"""torch.distributed on GPUs: weight buckets broadcast over a 2-process NCCL group.

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected": it needs a
GPU per rank), so the group test needs two GPUs. On one GPU the test of that case checks
that a refused group is an error at the caller within a deadline, never a hang.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import WeightSync
from tests.integration.weights_classes import DistMember

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 2, reason="NCCL needs one GPU per rank; this machine has fewer than 2")
@pytest.mark.local_cluster(nodes=1, gpus_per_node=2, isolated=True)
async def test_buckets_broadcast_over_a_two_gpu_nccl_group(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-nccl", bucket_bytes=4096) as ws:
        members = await local_cluster.spawn_group(
            DistMember, 2, "ws-nccl", "float32", "nccl", torch_distributed=True, gpus=1
        )
        assert sorted(await asyncio.gather(*(m.init() for m in members))) == [0, 1]
        pub, sub = members
        for v in (1, 2, 3):
            results = await asyncio.wait_for(asyncio.gather(pub.publish(v), sub.pull(v)), 120)
            assert results == [v, (v, [float(v)])]
        assert await ws.latest_version() == 3


@pytest.mark.local_cluster(nodes=1, gpus_per_node=1, isolated=True)
async def test_an_nccl_group_of_two_ranks_on_one_gpu_fails_or_works_but_never_hangs(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-nccl-1", bucket_bytes=4096):
        members = await local_cluster.spawn_group(
            DistMember, 2, "ws-nccl-1", "float32", "nccl", torch_distributed=True, gpus=0.5
        )
        pub, sub = members
        try:
            await asyncio.wait_for(asyncio.gather(*(m.init() for m in members)), 120)
            results = await asyncio.wait_for(asyncio.gather(pub.publish(1), sub.pull(1)), 120)
        except asyncio.TimeoutError:
            pytest.fail("an NCCL group of two ranks on one GPU hung instead of failing")
        except Exception as exc:  # NCCL's refusal, as the caller sees it
            assert "nccl" in str(exc).lower() or "duplicate gpu" in str(exc).lower(), exc
        else:
            assert results == [1, (1, [1.0])]  # an NCCL that allows it: the weights arrive


@pytest.mark.skipif(GPUS < 2, reason="NCCL needs one GPU per rank; this machine has fewer than 2")
def test_a_ray_collective_group_over_nccl_broadcasts_cuda_tensors() -> None:
    # verl's and OpenRLHF's weight broadcast: ray.util.collective with backend="nccl"
    from rayless import ray
    from rayless.ray.util import collective as col

    @ray.remote(num_gpus=1, num_cpus=0)
    class Member:
        def __init__(self, rank: int) -> None:
            self.rank = rank

        def run(self) -> list[float]:
            import torch

            col.init_collective_group(2, self.rank, backend="nccl", group_name="cuda-g")
            t = torch.full((4,), float(self.rank + 1), device="cuda")
            col.broadcast(t, src_rank=1, group_name="cuda-g")
            col.allreduce(t, "cuda-g")
            col.barrier("cuda-g")
            return [float(x) for x in t.cpu()]

    ray.init(num_gpus=2)
    try:
        members = [Member.remote(r) for r in range(2)]
        assert ray.get([m.run.remote() for m in members], timeout=300) == [[4.0] * 4] * 2
    finally:
        ray.shutdown()
