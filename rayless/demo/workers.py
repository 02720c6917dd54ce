"""The actors of the demo pipeline: env workers, eval (inference) workers, PPO learners.

* :class:`EvalWorker` holds a copy of the policy and answers ``act(obs)`` for a batch of
  observations; ``pull_weights`` loads a new version from the run's weight sync
  (``rayless.weights.WeightSync``, published by train rank 0 after every update).
* :class:`EnvWorker` steps a vectorised CartPole, sends each step's observations to an eval
  worker chosen by the router (node affinity by default), computes GAE with the rollout's
  values and puts the transitions into its storage shard's partition of the store.
* :class:`TrainWorker` is one rank of a torch.distributed group (gloo on CPU, nccl on GPU):
  it fetches its share of the iteration's samples from its node's shard and runs a PPO
  update on a DDP-wrapped policy; rank 0 publishes the new weights (``publish_weights``).

Every worker runs on its CUDA device when it has one (CUDA_VISIBLE_DEVICES is set by the
runtime), on the CPU otherwise.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import torch

from rayless.actors import Actor, ActorHandle
from rayless.actors.ext import apply_torch_threads, torch_threads
from rayless.actors.ext import free_port as rendezvous_port
from rayless.demo.config import AlgoConfig
from rayless.demo.env import VecCartPole
from rayless.demo.ppo import (
    ActorCritic,
    _unwrap,
    act,
    get_weights,
    make_optimizer,
    ppo_update,
    set_weights,
)
from rayless.demo.rollout import build_transitions, compute_advantages

FIELDS = ["obs", "action", "logp", "value", "advantage", "return", "policy_version"]


def worker_device() -> torch.device:
    """cuda:0 (the actor's own GPU) when CUDA is usable, else the CPU."""
    return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")


def free_port() -> tuple[str, int]:
    """An address of this node and a free TCP port on it (for MASTER_ADDR/PORT), from below
    the ephemeral range (``rayless.actors.ext.free_port``)."""
    return os.environ.get("RAYLESS_NODE_IP", "127.0.0.1"), rendezvous_port()


def join_process_group(
    rank: int, world_size: int, master_addr: str, master_port: int, device: torch.device
) -> str:
    """Join the train ranks' torch.distributed group (gloo on CPU, nccl on CUDA); blocks
    until every rank joined. Returns the backend."""
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    return backend


def _nbytes(td: Any) -> int:
    """Bytes of the tensors in a flat TensorDict."""
    return sum(
        int(t.numel() * t.element_size()) for t in td.values() if isinstance(t, torch.Tensor)
    )


def _algo(params: dict[str, Any]) -> AlgoConfig:
    return AlgoConfig(**params)


class EvalWorker(Actor):
    """Policy inference for env workers."""

    def __init__(self, algo: dict[str, Any], seed: int, weights_name: str | None = None) -> None:
        torch.set_num_threads(1)
        self.weights_name = weights_name
        self.weights: Any = None
        self.algo = _algo(algo)
        self.device = worker_device()
        torch.manual_seed(seed)
        self.policy = ActorCritic(hidden_sizes=self.algo.hidden_sizes).to(self.device)
        self.version = 0
        self.inflight = 0
        self.requests = 0

    async def act(
        self, obs: torch.Tensor, final_obs: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
        """Actions, log-probs and values for ``obs`` (and V of ``final_obs`` if given)."""
        self.inflight += 1
        self.requests += 1
        try:
            out = act(self.policy, obs.to(self.device))
            final_value = None
            if final_obs is not None:
                with torch.no_grad():
                    final_value = self.policy.value(final_obs.to(self.device)).cpu()
            return out.action.cpu(), out.logp.cpu(), out.value.cpu(), self.version, final_value
        finally:
            self.inflight -= 1

    async def set_weights(self, weights: dict[str, torch.Tensor]) -> int:
        """Install a new policy version; returns it."""
        self.version = set_weights(
            self.policy,
            {
                k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                for k, v in weights.items()
            },
        )
        return self.version

    async def setup(self) -> None:
        if self.weights_name is not None:
            from rayless.weights import WeightSync

            self.weights = await WeightSync.connect(self.weights_name, cuda_ipc=False)

    async def pull_weights(self, min_version: int, timeout: float = 120) -> int:
        """Load the newest published version >= ``min_version`` in place; returns it."""
        self.version = await self.weights.pull(self.policy, min_version, timeout)
        return self.version

    async def teardown(self) -> None:
        if self.weights is not None:
            await self.weights.aclose()

    async def check_idle(self) -> bool:
        """No request in flight (the router's probe)."""
        return self.inflight == 0

    async def num_requests(self) -> int:
        """Requests in flight (the router's probe)."""
        return self.inflight

    async def stats(self) -> dict[str, Any]:
        """Requests served and the policy version."""
        return {"requests": self.requests, "version": self.version}


class EnvWorker(Actor):
    """A vectorised CartPole that rolls out through eval workers and fills the store."""

    def __init__(
        self,
        index: int,
        algo: dict[str, Any],
        seed: int,
        evals: list[ActorHandle],
        distribution: dict[str, Any],
        router_type: str,
        store_name: str,
        partition: str,
    ) -> None:
        torch.set_num_threads(1)
        self.index = index
        self.algo = _algo(algo)
        self.env_id = f"env-{index}"
        # the env state lives on this worker's GPU when it has one; observations travel to
        # eval workers as small CPU tensors (CUDA IPC cannot cross CUDA_VISIBLE_DEVICES)
        self.env = VecCartPole(self.algo.num_envs, device=worker_device(), seed=seed * 1000 + index)
        self.obs = self.env.reset().cpu()
        self.evals = evals
        self.distribution = distribution
        self.router_type = router_type
        self.store_name = store_name
        self.partition = partition
        self.router: Any = None
        self.store: Any = None

    async def setup(self) -> None:
        from rayless.placement import create_router
        from rayless.store import Store

        self.router = create_router(
            "sync", self.router_type, self.evals, component_distribution=self.distribution
        )
        self.store = await Store.connect(self.store_name)

    async def rollout(self, iteration: int) -> dict[str, Any]:
        """Collect ``rollout_steps`` steps of every env, put them in the store; stats back."""
        algo = self.algo
        t_len, n = algo.rollout_steps, algo.num_envs
        obs_buf = torch.empty(t_len, n, 4)
        act_buf = torch.empty(t_len, n, dtype=torch.int64)
        logp, value, reward, trunc_val = (torch.zeros(t_len, n) for _ in range(4))
        done = torch.empty(t_len, n, dtype=torch.bool)
        trunc = torch.empty(t_len, n, dtype=torch.bool)
        versions = torch.empty(t_len, n, dtype=torch.int64)
        started = time.perf_counter()
        infer_s = 0.0
        policies: set[str] = set()
        final_obs: torch.Tensor | None = None
        prev_trunc: torch.Tensor | None = None
        obs = self.obs
        for t in range(t_len + 1):
            policy = await self.router.aselect_policy(self.env_id)
            policies.add(policy.name)
            t0 = time.perf_counter()
            action, lp, val, version, final_v = await policy.act(obs, final_obs)
            infer_s += time.perf_counter() - t0
            if final_v is not None and prev_trunc is not None:
                trunc_val[t - 1] = torch.where(prev_trunc, final_v, 0.0)
            if t == t_len:
                last_value = val
                break
            res = self.env.step(action.to(self.env.device))
            obs_buf[t], act_buf[t], logp[t], value[t] = obs, action, lp, val
            reward[t], done[t], trunc[t] = res.reward.cpu(), res.done.cpu(), res.truncated.cpu()
            versions[t] = version
            has_trunc = bool(trunc[t].any())
            final_obs = res.final_obs.cpu() if has_trunc else None
            prev_trunc = trunc[t] if has_trunc else None
            obs = res.obs.cpu()
        self.obs = obs
        env_time = time.perf_counter() - started - infer_s
        td = build_transitions(
            obs=obs_buf,
            action=act_buf,
            logp=logp,
            value=value,
            reward=reward,
            done=done,
            truncated=trunc,
            last_value=last_value,
            truncated_value=trunc_val,
            env_ids=torch.arange(n) + self.index * n,
            policy_version=versions,
        )
        td = compute_advantages(td, algo.gamma, algo.gae_lambda).select(*FIELDS)
        t0 = time.perf_counter()
        partition = f"it{iteration}-{self.partition}"  # one partition per iteration and shard
        await self.store.put(td, partition, env_ids=[self.env_id] * td.batch_size[0])
        put_s = time.perf_counter() - t0
        returns, _lengths = self.env.pop_finished_episodes()
        returns = returns.cpu()
        return {
            "env_steps": t_len * n,
            "returns": returns.tolist(),
            "env_s": env_time,
            "infer_s": infer_s,
            "infer_calls": t_len + 1,
            "put_s": put_s,
            "put_bytes": _nbytes(td),
            "min_version": int(versions.min()),
            "policies": sorted(policies),
        }


class TrainWorker(Actor):
    """One PPO learner rank; call ``init_distributed`` on every rank at once, then ``train``."""

    def __init__(
        self,
        rank: int,
        algo: dict[str, Any],
        seed: int,
        store_name: str,
        partition: str,
        samples_per_rank: int,
        weights_name: str | None = None,
    ) -> None:
        torch.set_num_threads(1)
        self.weights_name = weights_name
        self.weights_sync: Any = None
        self.rank = rank
        self.algo = _algo(algo)
        self.seed = seed
        self.store_name = store_name
        self.partition = partition
        self.samples = samples_per_rank
        self.device = worker_device()
        self.model: Any = None
        self.optimizer: Any = None
        self.store: Any = None

    def free_port(self) -> tuple[str, int]:
        """An address of this node and a free TCP port on it (for MASTER_ADDR/PORT)."""
        return free_port()

    def init_distributed(self, master_addr: str, master_port: int, world_size: int) -> str:
        """Join the process group and wrap the policy in DDP (blocks until all ranks join)."""
        from torch.nn.parallel import DistributedDataParallel

        backend = join_process_group(self.rank, world_size, master_addr, master_port, self.device)
        torch.manual_seed(self.seed)  # every rank starts from the same weights
        policy = ActorCritic(hidden_sizes=self.algo.hidden_sizes).to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(policy, device_ids=ids)
        self.optimizer = make_optimizer(self.model, self.algo)
        return backend

    async def setup(self) -> None:
        from rayless.store import Store

        self.store = await Store.connect(self.store_name)
        if self.weights_name is not None and self.rank == 0:
            from rayless.weights import WeightSync

            # CPU shared memory: eval workers on other GPUs (or none) can always read it
            self.weights_sync = await WeightSync.connect(self.weights_name, cuda_ipc=False)

    def weights(self, version: int) -> dict[str, torch.Tensor]:
        """The current weights (CPU copies) tagged with ``version``."""
        return get_weights(self.model, version)

    async def publish_weights(self, version: int) -> float:
        """Publish the current weights as ``version`` (rank 0); the seconds it took."""
        t0 = time.perf_counter()
        await self.weights_sync.publish(_unwrap(self.model).state_dict(), version)
        return time.perf_counter() - t0

    async def train(self, iteration: int) -> dict[str, Any]:
        """Fetch this rank's samples of the iteration and run one PPO update."""
        t0 = time.perf_counter()
        meta = await self.store.get_meta(
            f"it{iteration}-{self.partition}",
            FIELDS,
            self.samples,
            task="train",
            mode="fetch",
            timeout=120,
        )
        batch = await self.store.get(meta)
        get_s = time.perf_counter() - t0
        nbytes = _nbytes(batch)
        t1 = time.perf_counter()
        batch = batch.to(self.device)
        loop = asyncio.get_running_loop()
        stats = await loop.run_in_executor(None, self._update, batch)
        train_s = time.perf_counter() - t1
        await self.store.clear(meta)
        stats.update(
            samples=int(batch.batch_size[0]),
            get_s=get_s,
            get_bytes=nbytes,
            train_s=train_s,
            min_version=int(batch["policy_version"].min()),
        )
        return stats

    def _update(self, batch: Any) -> dict[str, Any]:
        apply_torch_threads(torch_threads())  # torch's thread count is per thread
        return ppo_update(self.model, self.optimizer, batch, self.algo)

    async def teardown(self) -> None:
        import torch.distributed as dist

        if self.weights_sync is not None:
            await self.weights_sync.aclose()  # unlinks the published segments
        if dist.is_initialized():
            dist.destroy_process_group()
