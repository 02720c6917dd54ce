"""Actors of the weight-sync tests (importable by actor processes)."""

from __future__ import annotations

import os
from typing import Any

import torch

from rayless.actors import Actor
from rayless.weights import SyncWeightSync, WeightSync
from rayless.weights.messages import PathKind

SHAPES = {"layer.weight": (64, 32), "layer.bias": (64,), "head.weight": (8, 64), "steps": ()}


def state(
    version: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """A state dict whose every element equals ``version``."""
    out = {k: torch.full(s, float(version), dtype=dtype, device=device) for k, s in SHAPES.items()}
    out["steps"] = torch.tensor(version, dtype=torch.int64, device=device)
    return out


def versions_in(tensors: dict[str, torch.Tensor]) -> set[float]:
    """The distinct values held by the tensors (one value: a consistent version)."""
    return {float(v) for t in tensors.values() for v in t.reshape(-1).unique().tolist()}


class Subscriber(Actor):
    """A rollout worker's side: pulls into its own tensors of ``dtype``."""

    def __init__(self, name: str, dtype: str = "float32", device: str = "cpu") -> None:
        self.name = name
        self.tensors = state(0, getattr(torch, dtype), device)
        self.ws: Any = None

    async def setup(self) -> None:
        self.ws = await WeightSync.connect(self.name)

    def pid(self) -> int:
        """This process's pid."""
        return os.getpid()

    async def pull(self, min_version: int = 0, timeout: float | None = 30) -> tuple[int, list]:
        """Pull; the version and the distinct values now held."""
        v = await self.ws.pull(self.tensors, min_version, timeout)
        return v, sorted(versions_in(self.tensors))

    def dtype(self) -> str:
        """The dtype of the held weights."""
        return str(self.tensors["layer.weight"].dtype)

    def device(self) -> str:
        """The device of the held weights."""
        return str(self.tensors["layer.weight"].device)

    async def follow(self, last: int, timeout: float = 60) -> list[list[Any]]:
        """Pull every newer version until ``last``: (version, distinct values) each time."""
        seen: list[list[Any]] = []
        v = 0
        while v < last:
            v = await self.ws.pull(self.tensors, v + 1, timeout)
            seen.append([v, sorted(versions_in(self.tensors))])
        return seen

    def pull_sync(self, min_version: int) -> int:
        """The blocking face, from a sync method (the actor's worker thread)."""
        ws = SyncWeightSync.connect(self.name)
        try:
            return ws.pull(self.tensors, min_version, timeout=30)
        finally:
            ws.close()

    async def teardown(self) -> None:
        if self.ws is not None:
            await self.ws.aclose()


class Publisher(Actor):
    """A trainer's side: publishes ``state(version)``."""

    def __init__(self, name: str, device: str = "cpu", bucket_bytes: int = 512 << 20) -> None:
        self.name = name
        self.device = device
        self.bucket_bytes = bucket_bytes
        self.ws: Any = None
        self.sync_ws: SyncWeightSync | None = None

    async def setup(self) -> None:
        self.ws = await WeightSync.connect(self.name, bucket_bytes=self.bucket_bytes)

    def pid(self) -> int:
        """This process's pid."""
        return os.getpid()

    async def publish(
        self, version: int, keys: list[str] | None = None, shard: int = 0, num_shards: int = 1
    ) -> int:
        """Publish ``state(version)`` (only ``keys``, as shard ``shard``) in bf16 on this
        publisher's device."""
        s = state(version, torch.bfloat16, self.device)
        if keys is not None:
            s = {k: s[k] for k in keys}
        return int(await self.ws.publish(s, version, shard=shard, num_shards=num_shards))

    async def die_mid_publish(self, version: int) -> None:
        """Begin publishing ``version``, then die before any byte of it is written (as a
        trainer killed mid-publish)."""

        def die(*_: Any) -> None:
            os._exit(3)

        self.ws._paths[PathKind.SHM].write = die
        await self.ws.publish(state(version, torch.bfloat16, self.device), version)

    def publish_sync(self, version: int, keys: list[str], shard: int, num_shards: int) -> int:
        """``publish`` of shard ``shard`` through the blocking face, from a sync method (the
        actor's worker thread). The face stays open: a publisher's versions end with it."""
        if self.sync_ws is None:
            self.sync_ws = SyncWeightSync.connect(self.name, bucket_bytes=self.bucket_bytes)
        s = state(version, torch.bfloat16, self.device)
        s = {k: s[k] for k in keys}
        return self.sync_ws.publish(s, version, shard=shard, num_shards=num_shards)

    async def teardown(self) -> None:
        if self.ws is not None:
            await self.ws.aclose()  # unlinks this publisher's segments
        if self.sync_ws is not None:
            await self.sync_ws.ws.aclose()  # the blocking face's client (on this loop)


class DistMember(Actor):
    """A member of a torch.distributed group (``spawn_group(..., torch_distributed=True)``):
    gloo with CPU tensors, or NCCL with tensors on the member's GPU."""

    def __init__(self, name: str, dtype: str = "float32", backend: str = "gloo") -> None:
        self.name = name
        self.backend = backend
        self.device = "cuda" if backend == "nccl" else "cpu"
        self.tensors = state(0, getattr(torch, dtype), self.device)
        self.ws: Any = None

    async def setup(self) -> None:
        self.ws = await WeightSync.connect(self.name)

    def init(self) -> int:
        """Join the group (blocks until every member joined); this rank."""
        import datetime

        import torch.distributed as dist

        if self.backend == "nccl":
            torch.cuda.set_device(0)  # the member's GPU (CUDA_VISIBLE_DEVICES names one)
        dist.init_process_group(self.backend, timeout=datetime.timedelta(seconds=60))
        return dist.get_rank()

    async def publish(self, version: int) -> int:
        """Broadcast ``state(version)`` in bf16 over the group."""
        import torch.distributed as dist

        s = state(version, torch.bfloat16, self.device)
        return int(await self.ws.publish(s, version, group=dist.group.WORLD))

    async def pull(self, min_version: int) -> tuple[int, list]:
        """Receive broadcasts from rank 0 until one is >= ``min_version``."""
        import torch.distributed as dist

        v = await self.ws.pull(self.tensors, min_version, group=dist.group.WORLD, src=0)
        return v, sorted(versions_in(self.tensors))

    async def teardown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if self.ws is not None:
            await self.ws.aclose()


MOE = 20  # tensors of moe_state; two of them change at each version (10%)


def last_change(i: int, version: int) -> int:
    """The newest version <= ``version`` at which tensor ``i`` of moe_state changed (0: none)."""
    return next((u for u in range(version, 0, -1) if (7 * u + i) % 10 == 0), 0)


def moe_state(version: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """A state dict of which two tensors in ten change at each version (frozen experts)."""
    out = {}
    for i in range(MOE):
        base = torch.arange(16 * (i + 1), dtype=torch.float32, device=device).reshape(i + 1, 16)
        out[f"expert{i}.weight"] = base + 1000.0 * last_change(i, version)
    return out


class DeltaSubscriber(Actor):
    """A rollout worker pulling moe_state versions, verified, into its own tensors."""

    def __init__(self, name: str, device: str = "cpu") -> None:
        self.name = name
        self.device = device
        self.tensors = {k: torch.zeros_like(v) for k, v in moe_state(0, device).items()}
        self.loaded: list[str] = []
        self.ws: Any = None

    async def setup(self) -> None:
        self.ws = await WeightSync.connect(self.name)

    async def pull(self, min_version: int, verify: bool = True) -> tuple[int, bool]:
        """Pull; the version and whether every tensor now equals moe_state(version) exactly."""
        v = await self.ws.pull(self.tensors, min_version, timeout=30, verify=verify)
        return v, self.holds(v)

    def holds(self, version: int) -> bool:
        """Whether every tensor equals moe_state(version) exactly."""
        want = moe_state(version, self.device)
        return all(torch.equal(self.tensors[k], want[k]) for k in want)

    def _load(self, weights: Any) -> None:
        for name, t in weights:
            self.loaded.append(name)
            self.tensors[name].copy_(t)

    async def load(self, min_version: int) -> tuple[int, list[str], bool]:
        """Pull into a loader: the version, the tensors it was handed, and exactness."""
        self.loaded = []
        v = await self.ws.pull(into=self._load, min_version=min_version, timeout=30)
        return v, sorted(self.loaded), self.holds(v)

    async def reconnect(self) -> None:
        """A new client (as a restarted worker's): it knows no version it holds."""
        await self.ws.aclose()
        self.ws = await WeightSync.connect(self.name)

    async def teardown(self) -> None:
        if self.ws is not None:
            await self.ws.aclose()


def full_tp_state() -> dict[str, torch.Tensor]:
    """A small transformer block's full state (deterministic)."""
    g = torch.Generator().manual_seed(5)
    return {
        "qkv.weight": torch.randn(8, 4, generator=g).to(torch.bfloat16),  # column parallel
        "o.weight": torch.randn(4, 8, generator=g),  # row parallel
        "embed.weight": torch.randn(16, 4, generator=g),  # vocab parallel
        "norm.weight": torch.randn(4, generator=g),  # replicated
    }


TP_DIMS = {"qkv.weight": 0, "o.weight": 1, "embed.weight": 0}


def tp_spec(rank: int, world: int) -> Any:
    """Tensor parallel slices: ``TP_DIMS``, the rest whole."""
    from rayless.weights.messages import ShardSpec

    return {n: ShardSpec(d, rank, world) for n, d in TP_DIMS.items()}


def tp_slice(name: str, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank`` of ``world``'s slice of ``full_tp_state()[name]``."""
    t = full_tp_state()[name]
    if name not in TP_DIMS:
        return t
    return t.chunk(world, TP_DIMS[name])[rank].clone()


class TpTrainerRank(Actor):
    """A tensor-parallel trainer rank: publishes its slices (replicated tensors from rank 0)."""

    def __init__(self, name: str, rank: int, world: int) -> None:
        self.name, self.rank, self.world = name, rank, world
        self.ws: Any = None

    async def setup(self) -> None:
        self.ws = await WeightSync.connect(self.name, checksums=True)

    async def publish(self, version: int, bump: float = 0.0, delta: bool = False) -> int:
        """Publish this rank's share of ``full_tp_state()`` as ``version`` (its slice of
        ``o.weight`` plus ``bump``)."""
        state = {
            n: tp_slice(n, self.rank, self.world)
            for n in full_tp_state()
            if n in TP_DIMS or self.rank == 0
        }
        state["o.weight"] = state["o.weight"] + bump
        spec = tp_spec(self.rank, self.world)
        return int(
            await self.ws.publish(
                state, version, shard=self.rank, num_shards=self.world, split=spec, delta=delta
            )
        )

    async def teardown(self) -> None:
        if self.ws is not None:
            await self.ws.aclose()


class StandInEngine:
    """An inference engine's update protocol that enforces vLLM's order: pause → start →
    update_weights (one or more) → finish → resume; any other call raises RuntimeError.
    Its pause and finish are coroutines (as an async engine's are)."""

    NEXT = {
        "pause_generation": {"serving"},
        "start_weight_update": {"paused"},
        "update_weights": {"started", "updating"},
        "finish_weight_update": {"updating"},
        "resume_generation": {"paused", "finished"},
    }
    AFTER = {
        "pause_generation": "paused",
        "start_weight_update": "started",
        "update_weights": "updating",
        "finish_weight_update": "finished",
        "resume_generation": "serving",
    }

    def __init__(self) -> None:
        self.state = "serving"
        self.calls: list[str] = []
        self.weights: dict[str, torch.Tensor] = {}
        self.fail_update = False

    def _step(self, name: str) -> None:
        if self.state not in self.NEXT[name]:
            raise RuntimeError(f"{name} called while {self.state}")
        self.state = self.AFTER[name]
        self.calls.append(name)

    async def pause_generation(self) -> None:
        self._step("pause_generation")

    def start_weight_update(self) -> None:
        self._step("start_weight_update")

    def update_weights(self, weights: Any) -> None:
        self._step("update_weights")
        if self.fail_update:
            raise ValueError("the engine refused a bucket")
        self.weights.update(weights)

    async def finish_weight_update(self) -> None:
        self._step("finish_weight_update")

    def resume_generation(self) -> None:
        self._step("resume_generation")


class FsdpTrainerRank(Actor):
    """An FSDP trainer rank in a gloo group: its shard of every tensor of ``full_tp_state()``
    (dim 0), received from rank 0 over gloo; publishes it as one shard of the version."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.local: dict[str, torch.Tensor] = {}
        self.ws: Any = None

    async def setup(self) -> None:
        self.ws = await WeightSync.connect(self.name, checksums=True)

    def init(self) -> int:
        """Join the group and take this rank's shards (rank 0 broadcasts the full tensors)."""
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        for name, full in full_tp_state().items():
            wire = full.float() if rank == 0 else torch.zeros(full.shape)
            dist.broadcast(wire, 0)
            self.local[name] = wire.to(full.dtype).chunk(world, 0)[rank].clone()
        return rank

    async def publish(self, version: int) -> int:
        """Publish this rank's shards as shard ``rank`` of ``version``."""
        import torch.distributed as dist

        from rayless.weights.messages import ShardSpec

        rank, world = dist.get_rank(), dist.get_world_size()
        return int(
            await self.ws.publish(
                self.local, version, shard=rank, num_shards=world, split=ShardSpec(0, rank, world)
            )
        )

    async def teardown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if self.ws is not None:
            await self.ws.aclose()
