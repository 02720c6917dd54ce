"""Resharding between real processes: a tensor-parallel trainer of 2 ranks (two publisher
processes, one shard each) → engine ranks of tensor parallel 4, each pulling its slices, bit-exact
against slicing the full state dict; verified and delta pulls combine with it."""

from __future__ import annotations

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import WeightSync
from tests.integration.weights_classes import TpTrainerRank, full_tp_state, tp_slice, tp_spec

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.local_cluster(nodes=2, gpus_per_node=0),
]


async def test_a_tp2_trainer_feeds_tp4_engine_ranks_bit_exact(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-reshard") as ws:
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
