"""The engine update protocol driven by a pull: a stand-in engine that enforces vLLM's order
(pause → start → update by bucket → finish → resume), a delta reaching it as only the changed
tensors, failures before and after the first bucket, and the Hugging Face model path."""

from __future__ import annotations

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import WeightChecksumError, WeightMismatchError, WeightSync
from rayless.weights.engines import ModuleEngine
from rayless.weights.messages import ShardSpec
from tests.integration.weights_classes import StandInEngine, moe_state

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.local_cluster(nodes=1, gpus_per_node=0),
]

ORDER = [
    "pause_generation",
    "start_weight_update",
    "update_weights",
    "finish_weight_update",
    "resume_generation",
]


async def test_a_pull_drives_the_engine_protocol_in_order(local_cluster: Cluster) -> None:
    async with WeightSync.create(
        local_cluster, name="ws-engine", bucket_bytes=4096, checksums=True
    ) as ws:
        sub = await WeightSync.connect("ws-engine", local_cluster)
        try:
            engine = StandInEngine()
            await ws.publish(moe_state(1), version=1, delta=True)
            assert await sub.update_engine(engine, 1, timeout=30, verify=True) == 1
            buckets = engine.calls.count("update_weights")
            assert buckets > 1 and engine.calls == [*ORDER[:2], *["update_weights"] * buckets,
                                                   *ORDER[3:]]  # fmt: skip
            want = moe_state(1)
            assert all(torch.equal(engine.weights[k], want[k]) for k in want)
            with pytest.raises(RuntimeError, match="while serving"):
                engine.start_weight_update()  # the stand-in enforces the order
            engine.weights.clear()
            await ws.publish(moe_state(2), version=2, delta=True)
            engine.calls.clear()
            assert await sub.update_engine(engine, 2, timeout=30) == 2
            assert len(engine.weights) == 2  # a delta: only the changed tensors
            assert engine.calls[0] == "pause_generation" and engine.state == "serving"

            # before the first bucket: nothing applied, the engine serves its old weights
            with pytest.raises(WeightMismatchError):
                await sub.update_engine(engine, 2, timeout=30, shard=ShardSpec(0, 0, 3))
            assert engine.state == "serving"
            engine.weights.clear()  # nothing was copied: the next update is still a delta
            await ws.publish(moe_state(3), version=3, delta=True)
            assert await sub.update_engine(engine, 3, timeout=30) == 3
            assert sorted(engine.weights) == sorted(
                k for k, v in moe_state(3).items() if not torch.equal(v, moe_state(2)[k])
            )
            # after it: torn weights, the engine stays paused until updated again
            await ws.publish(moe_state(4), version=4)
            engine.fail_update = True
            with pytest.raises(ValueError, match="refused"):
                await sub.update_engine(engine, 4, timeout=30)
            assert engine.state == "updating"
            with pytest.raises(TypeError):
                await sub.update_engine(object(), 4, timeout=30)
        finally:
            await sub.aclose()


async def test_the_hugging_face_model_path_through_the_protocol(local_cluster: Cluster) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    trainer = transformers.LlamaForCausalLM(config)
    engine_model = transformers.LlamaForCausalLM(config)
    async with WeightSync.create(local_cluster, name="ws-hf", checksums=True) as ws:
        sub = await WeightSync.connect("ws-hf", local_cluster)
        try:
            state = {k: v.to(torch.bfloat16) for k, v in trainer.state_dict().items()}
            await ws.publish(state, version=1)
            engine = ModuleEngine(engine_model)
            await sub.update_engine(engine, 1, timeout=30, dtype=torch.float32, verify=True)
            for name, t in engine_model.state_dict().items():
                assert torch.equal(t, state[name].float()), name
            assert not engine.updating
            assert await sub.check_weights(engine_model, 1, timeout=5) == 1  # "holds exactly 1"
        finally:
            await sub.aclose()


async def test_a_corrupt_version_never_reaches_the_engine(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-engine-sum", checksums=True) as ws:
        sub = await WeightSync.connect("ws-engine-sum", local_cluster)
        try:
            await ws.publish(moe_state(1), version=1)
            seg = ws._slots.pool().newest
            assert seg is not None
            seg.payload[100] ^= 0xFF
            engine = StandInEngine()
            with pytest.raises(WeightChecksumError):
                await sub.update_engine(engine, 1, timeout=30, verify=True)
            assert engine.calls == [ORDER[0], ORDER[-1]] and not engine.weights
        finally:
            await sub.aclose()
