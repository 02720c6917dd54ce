"""Worker classes and driver functions for the single-controller integration tests
(importable by the actor processes)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rayless import actors
from rayless.single_controller import (
    ClassWithInitArgs,
    Dispatch,
    Execute,
    Worker,
    WorkerGroup,
    register,
)
from rayless.single_controller.decorator import collect_all_to_all


def two_to_all_dispatch_fn(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """verl's custom mode of its basics test: a list of 2, repeated over the ranks."""
    for arg in args:
        for i in range(worker_group.world_size - 2):
            arg.append(arg[i % 2])
    for v in kwargs.values():
        for i in range(worker_group.world_size - 2):
            v.append(v[i % 2])
    return args, kwargs


class TestActor(Worker):
    """verl's test_worker_group_basics worker."""

    __test__ = False

    def __init__(self, x: int) -> None:
        super().__init__()
        self._x = x

    def foo(self, y: int) -> int:
        return self._x + y

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def foo_rank_zero(self, x: int, y: int) -> int:
        return self._x + y + x

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def foo_one_to_all(self, x: int, y: int) -> int:
        return self._x + y + x

    @register(Dispatch.ALL_TO_ALL, blocking=False)
    def foo_all_to_all(self, x: int, y: int) -> int:
        return self._x + y + x

    @register(
        dispatch_mode={"dispatch_fn": two_to_all_dispatch_fn, "collect_fn": collect_all_to_all}
    )
    def foo_custom(self, x: int, y: int) -> int:
        return self._x + y + x

    @register(Dispatch.ONE_TO_ALL)
    def place(self) -> dict[str, Any]:
        """Where this rank runs and what its environment says."""
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "WG_PREFIX")
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "node": self.get_node_id(),
            "gpus": self.get_cuda_visible_devices(),
            "pid": os.getpid(),
            **{k: os.environ.get(k) for k in keys},
        }

    @register(Dispatch.ONE_TO_ALL)
    async def nap(self, seconds: float) -> int:
        await asyncio.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def collective(self, dead_rank: int, hold: float) -> int:
        """A collective that one rank leaves by dying: the others wait ``hold`` seconds."""
        if self.rank == dead_rank:
            os._exit(3)
        time.sleep(hold)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        return self.rank


def add_one(data: torch.Tensor) -> torch.Tensor:
    """A driver function run on rank 0 (verl's execute_func_rank_zero)."""
    return data + 1


def scale_by_rank(worker: Worker, data: TensorDict) -> TensorDict:
    """A driver function run on every rank's chunk (DP_COMPUTE_PROTO_WITH_FUNC)."""
    data["a"] = data["a"] * 10 + worker.rank
    return data


class DataWorker(Worker):
    """verl's split-resource-pool worker: adds its rank and its id to the data."""

    def __init__(self, worker_id: int = 0) -> None:
        super().__init__()
        self.worker_id = worker_id

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add(self, data: TensorDict) -> TensorDict:
        data["a"] = data["a"] + self.rank + self.worker_id
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, auto_padding=True)
    def add_padded(self, data: TensorDict) -> TensorDict:
        data["a"] = data["a"] + self.rank
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    async def metrics(self, data: TensorDict) -> dict[str, float]:
        return {"rank": float(self.rank), "rows": float(data.batch_size[0])}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def add_later(self, data: TensorDict) -> TensorDict:
        data["a"] = data["a"] + 1
        return data

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        """Join the group's gloo process group (the env the group gave) and all-reduce."""
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        t = torch.tensor([value])
        dist.all_reduce(t)
        return float(t.item())


class Driver(actors.Actor):
    """Another actor that drives a group it did not create (verl's detached-worker test)."""

    async def drive(self, worker_names: list[str]) -> dict[str, Any]:
        cluster = await actors.connect()
        wg = await WorkerGroup.afrom_detached(
            worker_names, ClassWithInitArgs(TestActor, x=2), cluster=cluster
        )
        return {
            "names": wg.worker_names,
            "custom": await wg.foo_custom.aio(x=[1, 2], y=[5, 6]),
            "rank_zero": await wg.foo_rank_zero.aio(x=1, y=2),
            "all": await wg.aexecute_all("foo", 1),
        }

    def drive_sync(self, handles: list[actors.ActorHandle]) -> list[int]:
        wg = WorkerGroup.from_detached(
            worker_handles=handles, ray_cls_with_init=ClassWithInitArgs(TestActor, x=2)
        )
        return wg.execute_all_sync("foo", 10)


class ProtoWorker(Worker):
    """A worker that takes and returns verl DataProtos (never importing verl itself)."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def tag(self, data: Any) -> Any:
        data.batch["obs"] = data.batch["obs"] + 1
        data.non_tensor_batch["rank"] = np.array([self.rank] * len(data), dtype=object)
        kind = f"{type(data).__module__}.{type(data).__qualname__}"
        data.meta_info = {**data.meta_info, "seen_as": kind}
        return data


class GroupUser(actors.Actor):
    """An actor handed a whole WorkerGroup (Ray lets a group's handles travel)."""

    def call_sync(self, wg: WorkerGroup, y: int) -> dict[str, Any]:
        return {
            "names": wg.worker_names,
            "rank_zero": wg.foo_rank_zero(x=1, y=y),
            "all": wg.execute_all_sync("foo", y),
            "one_to_all": wg.foo_one_to_all(x=1, y=y).result(),
        }

    async def call_async(self, wg: WorkerGroup, data: Any) -> Any:
        return await wg.tag.aio(data)


class ActorRole(Worker):
    """A fused role: the policy."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.steps = 0

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> dict[str, Any]:
        return {"role": "actor", "pid": os.getpid(), "rank": self.rank, "lr": self.lr}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: TensorDict) -> TensorDict:
        self.steps += 1
        data["a"] = data["a"] + 1
        return data

    @register(Dispatch.ONE_TO_ALL)
    def peer_steps(self) -> int:
        """The critic's step count, read in-process through fused_worker_dict."""
        critic: CriticRole = self.fused_worker_dict["critic"]  # type: ignore[attr-defined]
        return critic.steps


class CriticRole(Worker):
    """A fused role: the value function."""

    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.scale = scale
        self.steps = 0

    @register(Dispatch.ONE_TO_ALL)
    async def whoami(self) -> dict[str, Any]:
        return {"role": "critic", "pid": os.getpid(), "rank": self.rank, "scale": self.scale}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: TensorDict) -> TensorDict:
        self.steps += 1
        return TensorDict({"v": data["a"].float() * self.scale}, batch_size=data.batch_size)


class StoreWorker(Worker):
    """Store-aware dispatch: a rank gets its part of a BatchMeta and fetches the data itself."""

    def __init__(self, store_name: str) -> None:
        super().__init__()
        self.store_name = store_name

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    async def double(self, meta: Any) -> Any:
        from rayless import store

        st = await store.Store.connect(self.store_name)
        try:
            data = await st.get(meta, fields=["x"])
            out = TensorDict(
                {"y": data["x"] * 2, "rank": torch.full((len(meta),), self.rank)},
                batch_size=data.batch_size,
            )
            return await st.put(out, meta=meta)
        finally:
            await st.aclose()


OBS, ACTIONS = 4, 2


def _init_dist() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")


def _all_reduce_grads(module: torch.nn.Module, world_size: int) -> None:
    import torch.distributed as dist

    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world_size


class PPOActor(Worker):
    """A tiny policy: generates actions, computes log-probs, takes PPO steps (gloo DP)."""

    def __init__(self, lr: float = 0.5, trainable: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.policy = torch.nn.Linear(OBS, ACTIONS)
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=lr)
        self.trainable = trainable

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        _init_dist()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: TensorDict) -> TensorDict:
        gen = torch.Generator().manual_seed(1000 + self.rank)
        with torch.no_grad():
            logits = self.policy(prompts["obs"])
            actions = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(-1)
            logp = torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1)
        out = prompts.clone()
        out["actions"] = actions
        out["old_log_probs"] = logp
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, batch: TensorDict) -> TensorDict:
        with torch.no_grad():
            logp = torch.log_softmax(self.policy(batch["obs"]), -1)
            picked = logp.gather(-1, batch["actions"][:, None]).squeeze(-1)
        return TensorDict({"ref_log_probs": picked}, batch_size=batch.batch_size)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def update_actor(self, batch: TensorDict) -> dict[str, float]:
        logp = torch.log_softmax(self.policy(batch["obs"]), -1)
        logp = logp.gather(-1, batch["actions"][:, None]).squeeze(-1)
        ratio = torch.exp(logp - batch["old_log_probs"])
        adv = batch["advantages"]
        loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        kl = (logp - batch["ref_log_probs"]).mean()
        self.opt.zero_grad()
        (loss + 0.01 * kl).backward()
        _all_reduce_grads(self.policy, self.world_size)
        self.opt.step()
        return {"loss": loss.item(), "rank": float(self.rank)}

    @register(Dispatch.ONE_TO_ALL)
    def weights(self) -> list[float]:
        return torch.cat([p.detach().flatten() for p in self.policy.parameters()]).tolist()


class PPOCritic(Worker):
    """A fused role: the value function (gloo DP over the fused group)."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.value = torch.nn.Linear(OBS, 1)
        self.opt = torch.optim.SGD(self.value.parameters(), lr=lr)

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        _init_dist()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, batch: TensorDict) -> TensorDict:
        with torch.no_grad():
            v = self.value(batch["obs"]).squeeze(-1)
        return TensorDict({"values": v}, batch_size=batch.batch_size)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def update_critic(self, batch: TensorDict) -> dict[str, float]:
        loss = ((self.value(batch["obs"]).squeeze(-1) - batch["returns"]) ** 2).mean()
        self.opt.zero_grad()
        loss.backward()
        _all_reduce_grads(self.value, self.world_size)
        self.opt.step()
        return {"vf_loss": loss.item()}


class PPOReward(Worker):
    """A fused role: the reward model (action 1 is right when obs[0] > 0)."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rewards(self, batch: TensorDict) -> TensorDict:
        right = (batch["obs"][:, 0] > 0).long()
        reward = (batch["actions"] == right).float()
        return TensorDict({"rewards": reward}, batch_size=batch.batch_size)
