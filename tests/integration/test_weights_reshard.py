"""Resharding between real processes: a tensor-parallel trainer of 2 ranks (two publisher
processes, one shard each) → engine ranks of tensor parallel 4, each pulling its slices, bit-exact
against slicing the full state dict; verified and delta pulls combine with it."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import WeightSync
from tests.integration.weights_classes import (
    FsdpTrainerRank,
    TpTrainerRank,
    full_tp_state,
    tp_slice,
    tp_spec,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.local_cluster(nodes=2, gpus_per_node=0),
]


async def test_a_tp2_trainer_feeds_tp4_engine_ranks_bit_exact(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-reshard", checksums=True) as ws:
        trainers = [
            await local_cluster.spawn(TpTrainerRank, "ws-reshard", r, 2, cpus=0) for r in range(2)
        ]
        for v in (1, 2):
            for t in trainers:
                await t.publish(v)
        for rank in range(4):
            want = {n: tp_slice(n, rank, 4) for n in full_tp_state()}
            targets = {n: torch.zeros_like(t) for n, t in want.items()}
            got = await ws.pull(targets, 2, timeout=30, shard=tp_spec(rank, 4), verify=True)
            assert got == 2
            for name, t in want.items():
                assert torch.equal(targets[name], t), (rank, name)
            loaded: dict[str, torch.Tensor] = {}
            await ws.pull(into=loaded.update, min_version=2, timeout=30, shard=tp_spec(rank, 4))
            assert sorted(loaded) == sorted(want)
            assert all(torch.equal(loaded[n], t) for n, t in want.items())


async def test_a_delta_in_one_shard_reaches_slices_that_span_shards(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-reshard-delta") as ws:
        trainers = [
            await local_cluster.spawn(TpTrainerRank, "ws-reshard-delta", r, 2, cpus=0)
            for r in range(2)
        ]
        for t in trainers:
            await t.publish(1, delta=True)
        whole = tp_spec(0, 1)  # the full tensors: o.weight spans both trainer shards

        class Engine:
            def __init__(self) -> None:
                self.got: dict[str, torch.Tensor] = {}

            def load(self, weights: object) -> None:
                self.got.update(weights)  # type: ignore[call-overload]

        engine = Engine()
        targets = {n: torch.zeros_like(t) for n, t in full_tp_state().items()}
        sub = await WeightSync.connect("ws-reshard-delta", local_cluster)  # the loader's client
        try:
            assert await ws.pull(targets, 1, timeout=30, shard=whole) == 1
            for _ in range(2):
                await sub.pull(into=engine.load, min_version=1, timeout=30, shard=whole)
            await trainers[0].publish(2, bump=1.0, delta=True)  # only shard 0's slice changes
            await trainers[1].publish(2, delta=True)
            want = full_tp_state()
            want["o.weight"][:, :4] += 1.0
            assert await ws.pull(targets, 2, timeout=30, shard=whole) == 2  # a delta
            assert all(torch.equal(targets[n], t) for n, t in want.items())
            engine.got.clear()
            assert await sub.pull(into=engine.load, min_version=2, timeout=30, shard=whole) == 2
            assert sorted(engine.got) == sorted(want)  # a loader's slices come whole, always
            assert all(torch.equal(engine.got[n], t) for n, t in want.items())
        finally:
            await sub.aclose()


async def test_an_fsdp4_gloo_group_feeds_tp2_engine_ranks_bit_exact(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-fsdp", checksums=True) as ws:
        ranks = await local_cluster.spawn_group(
            FsdpTrainerRank, 4, "ws-fsdp", torch_distributed=True, cpus=0
        )
        assert sorted(await asyncio.gather(*(r.init() for r in ranks))) == [0, 1, 2, 3]
        await asyncio.gather(*(r.publish(1) for r in ranks))
        for rank in range(2):  # o.weight's columns span all four FSDP shards
            want = {n: tp_slice(n, rank, 2) for n in full_tp_state()}
            targets = {n: torch.zeros_like(t) for n, t in want.items()}
            assert await ws.pull(targets, 1, timeout=30, shard=tp_spec(rank, 2), verify=True) == 1
            for name, t in want.items():
                assert torch.equal(targets[name], t), (rank, name)
