"""``WeightSync.pull(into=loader)``: an engine's loader fed bucket by bucket (vLLM's
``load_weights``, SGLang's ``update_weights_from_tensor``, HF's ``load_state_dict``), with
renames, dtype conversion, tied weights once, and one bucket's memory at a time."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

from rayless.actors import Cluster
from rayless.weights import WeightInputError, WeightMismatchError, WeightSync
from tests.integration.loader_classes import EngineWorker, TiedModel

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.local_cluster(nodes=1, gpus_per_node=0),
]

MIB = 1 << 20


def big_state(n: int, version: float) -> dict[str, torch.Tensor]:
    """``n`` tensors of 1 MiB each (float32), every element ``version``."""
    return {f"layers.{i}.weight": torch.full((MIB // 4,), version) for i in range(n)}


async def test_the_loader_gets_one_bucket_at_a_time_and_holds_one_buckets_memory(
    local_cluster: Cluster,
) -> None:
    """8 tensors of 1 MiB in buckets of 2 MiB: 4 loader calls of 2 tensors each, and no
    tensor a previous call got (and dropped) is still alive when the next call starts: the
    pull never holds more than the bucket in hand, not the whole state dict."""
    async with WeightSync.create(local_cluster, name="ws-loader-mem", bucket_bytes=2 * MIB) as ws:
        await ws.publish(big_state(8, 3.0), version=1)
        sub = await WeightSync.connect("ws-loader-mem", local_cluster)
        calls: list[list[str]] = []
        given: list[weakref.ref[torch.Tensor]] = []
        alive_at_call: list[int] = []
        sums: dict[str, float] = {}

        def load_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            gc.collect()
            alive_at_call.append(sum(1 for r in given if r() is not None))
            names = []
            for name, tensor in weights:  # consumed and dropped, as an engine's copy does
                names.append(name)
                given.append(weakref.ref(tensor))
                sums[name] = float(tensor.sum())
                del tensor
            calls.append(names)

        try:
            assert await sub.pull(into=load_weights, min_version=1, timeout=30) == 1
        finally:
            await sub.aclose()
        assert calls == [[f"layers.{i}.weight", f"layers.{i + 1}.weight"] for i in (0, 2, 4, 6)]
        assert alive_at_call == [0, 0, 0, 0]
        assert sums == {f"layers.{i}.weight": 3.0 * (MIB // 4) for i in range(8)}


async def test_tied_weights_travel_once_and_arrive_once_renamed_and_converted(
    local_cluster: Cluster,
) -> None:
    """A bf16 model with a tied head: the layout gives the head the embedding's bytes (the
    segment holds them once), the loader gets the embedding once, renamed, in fp32; a module
    target (strict) still fills both names."""
    model = TiedModel().to(torch.bfloat16)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(i + 1)
    distinct = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    async with WeightSync.create(local_cluster, name="ws-loader-tied") as ws:
        await ws.publish(model.state_dict(), version=1)
        sub = await WeightSync.connect("ws-loader-tied", local_cluster)
        got: list[tuple[str, torch.dtype, float]] = []

        def load_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            got.extend((n, t.dtype, float(t.float().mean())) for n, t in weights)

        try:
            await sub.pull(
                into=load_weights,
                min_version=1,
                timeout=30,
                rename={"embed_tokens.weight": "model.embed_tokens.weight"},
                dtype=torch.float32,
            )
            names = [n for n, _, _ in got]
            assert names == ["model.embed_tokens.weight", "layer.weight", "layer.bias"]
            assert {d for _, d, _ in got} == {torch.float32}
            assert [m for _, _, m in got] == [1.0, 2.0, 3.0]
            # a callable rename can drop tensors (None)
            got.clear()
            await sub.pull(
                into=load_weights, rename=lambda n: None if n.startswith("layer.") else n
            )
            assert [n for n, _, _ in got] == ["embed_tokens.weight"]
            assert [d for _, d, _ in got] == [torch.bfloat16]  # no dtype: as published
            # a tied module as the target: both names filled (they are one tensor)
            other = TiedModel()
            await sub.pull(other, min_version=1, timeout=30)
            assert float(other.lm_head.weight.detach().mean()) == 1.0
            assert other.lm_head.weight is other.embed_tokens.weight
            # an untied target (strict) gets the head from the embedding's bytes
            untied = {k: torch.zeros(v.shape) for k, v in model.state_dict().items()}
            await sub.pull(untied, min_version=1, timeout=30)
            assert float(untied["lm_head.weight"].mean()) == 1.0
            assert float(untied["layer.bias"].mean()) == 3.0
        finally:
            await sub.aclose()
    from rayless.weights.layout import bucket_sizes, make_layout

    tied = bucket_sizes(make_layout(model.state_dict(), 1 << 30))
    once = bucket_sizes(make_layout(distinct, 1 << 30))
    assert tied == once  # the head adds no bytes


async def test_the_blocking_face_feeds_an_engine_workers_loader(local_cluster: Cluster) -> None:
    """A sync engine hook in another process (vLLM's worker extension) pulls bf16 weights
    through SyncWeightSync into its loader in fp32; its tied head follows its embedding."""
    model = TiedModel().to(torch.bfloat16)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(i + 1)
    async with WeightSync.create(local_cluster, name="ws-loader-sync") as ws:
        engine = await local_cluster.spawn(EngineWorker, "ws-loader-sync", cpus=0)
        await ws.publish(model.state_dict(), version=4)
        assert await engine.update(4) == 4
        seen = await engine.seen()
        assert [[n for n, _ in call] for call in seen] == [
            ["embed_tokens.weight", "layer.weight", "layer.bias"]
        ]
        assert {d for call in seen for _, d in call} == {"torch.float32"}
        values = await engine.values()
        assert values["embed_tokens.weight"] == 1.0 == values["lm_head.weight"]
        assert values["layer.bias"] == 3.0
        assert values["tied"] == 1.0


async def test_pull_refuses_a_target_and_a_loader_together(local_cluster: Cluster) -> None:
    async with WeightSync.create(local_cluster, name="ws-loader-args") as ws:
        await ws.publish({"w": torch.ones(4)}, version=1)
        with pytest.raises(WeightInputError):
            await ws.pull({"w": torch.zeros(4)}, into=lambda weights: None)
        with pytest.raises(WeightInputError):
            await ws.pull()
        with pytest.raises(WeightInputError):
            await ws.pull({"w": torch.zeros(4)}, dtype=torch.float16)
        with pytest.raises(TypeError):
            await ws.pull(into=lambda weights: None, rename=42)
        with pytest.raises(TypeError):
            await ws.pull(into=lambda weights: None, dtype="float16")
        with pytest.raises(WeightMismatchError):  # the module path is unchanged
            await ws.pull({"w": torch.zeros(5)})

        class EngineError(RuntimeError):
            pass

        def broken(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            raise EngineError("the engine refused")

        with pytest.raises(EngineError):  # the loader's error, as itself
            await ws.pull(into=broken, min_version=1, timeout=30)


async def test_the_loader_reads_a_relays_copy_on_the_cross_host_path(
    local_cluster: Cluster,
) -> None:
    """``per_node``: the engine worker's node gets the version through its relay (one transfer
    per host); the loader is fed from the relay's segment, tied weights once."""
    model = TiedModel().to(torch.bfloat16)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(i + 1)
    async with WeightSync.create(local_cluster, name="ws-loader-relay", per_node=True) as ws:
        engine = await local_cluster.spawn(EngineWorker, "ws-loader-relay", cpus=0)
        await ws.publish(model.state_dict(), version=2)
        assert await engine.update(2) == 2
        assert [[n for n, _ in call] for call in await engine.seen()] == [
            ["embed_tokens.weight", "layer.weight", "layer.bias"]
        ]
        values = await engine.values()
        assert values["lm_head.weight"] == 1.0 and values["layer.bias"] == 3.0
