"""Weight sync on one GPU: CUDA IPC buckets, one device-to-device copy per subscriber."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import PublisherLostError, WeightSync, WeightSyncError
from tests.integration.weights_classes import DeltaSubscriber, Publisher, Subscriber, moe_state

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.local_cluster(nodes=1, gpus_per_node=1, isolated=True),
]


async def test_cuda_ipc_buckets_reach_gpu_subscribers_in_their_dtype(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-cuda"):
        # small buckets: the state dict spans several of them
        pub = await local_cluster.spawn(Publisher, "ws-cuda", "cuda", 4096, gpus=0.25)
        subs = [
            await local_cluster.spawn(Subscriber, "ws-cuda", d, "cuda", gpus=0.25)
            for d in ("float32", "float16")
        ]
        assert [await s.device() for s in subs] == ["cuda:0", "cuda:0"]
        follows = [asyncio.ensure_future(s.follow(12)) for s in subs]
        for v in range(1, 13):
            await pub.publish(v)
        for seen in await asyncio.gather(*follows):
            assert seen[-1][0] == 12
            for version, values in seen:
                assert values == [float(version)], seen  # never a torn version
        assert [await s.dtype() for s in subs] == ["torch.float32", "torch.float16"]


async def test_a_subscriber_without_cuda_gets_a_typed_error_and_cpu_targets_work(
    local_cluster: Cluster,
) -> None:
    async with WeightSync.create(local_cluster, name="ws-cuda-cpu"):
        pub = await local_cluster.spawn(Publisher, "ws-cuda-cpu", "cuda", gpus=0.25)
        on_gpu_proc = await local_cluster.spawn(Subscriber, "ws-cuda-cpu", gpus=0.25)
        no_gpu = await local_cluster.spawn(Subscriber, "ws-cuda-cpu")
        await pub.publish(1)
        assert await on_gpu_proc.pull(1) == (1, [1.0])  # CPU tensors, device-to-host copy
        with pytest.raises(WeightSyncError, match="cuda_ipc=False"):
            await no_gpu.pull(1)


async def test_a_cuda_publisher_killed_with_sigkill_fails_pulls(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-cuda-kill"):
        pub = await local_cluster.spawn(Publisher, "ws-cuda-kill", "cuda", gpus=0.25)
        sub = await local_cluster.spawn(Subscriber, "ws-cuda-kill", "float32", "cuda", gpus=0.25)
        await pub.publish(1)
        assert await sub.pull(1) == (1, [1.0])
        os.kill(await pub.pid(), signal.SIGKILL)
        with pytest.raises(PublisherLostError):
            await asyncio.wait_for(sub.pull(2, None), 60)


async def test_cuda_delta_versions_are_exact_and_a_verified_pull_is_refused(
    local_cluster: Cluster,
) -> None:
    # Deltas on the CUDA IPC path: subscribers one version behind and several behind hold
    # exactly each version; the path carries no checksums, so a verified pull says so.
    async with WeightSync.create(local_cluster, name="ws-cuda-delta") as ws:
        every, skips = [
            await local_cluster.spawn(DeltaSubscriber, "ws-cuda-delta", "cuda", gpus=0.25)
            for _ in range(2)
        ]
        for v in range(1, 13):
            await ws.publish(moe_state(v, "cuda"), version=v, delta=True)
            assert await every.pull(v, False) == (v, True)
            if v in (3, 10):
                assert await skips.pull(v, False) == (v, True)
        with pytest.raises(WeightSyncError, match="without checksums"):
            await every.pull(12, True)
        assert await every.holds(12)
