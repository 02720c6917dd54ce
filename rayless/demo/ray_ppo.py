"""``rayless demo --api ray``: the PPO demo written against Ray's API only
(``from rayless import ray``), as a Ray user would write it; it still solves CartPole.

A placement group holds one ``{"CPU": 1}`` bundle per rollout actor and one for the learner
(``PACK``). Each iteration the driver ``ray.put``s the learner's weights, every rollout actor
collects ``rollout_steps`` steps of its ``num_envs`` environments with them and computes GAE,
``ray.get`` gathers the batches, and the learner runs the PPO update on all of them. It
stops once the mean return of the last ``return_window`` episodes reaches
``target_return``. The rayless-native pipeline (store, weight sync, torch.distributed train
ranks) is ``rayless.demo.pipeline``.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import torch

from rayless import ray
from rayless.demo.config import AlgoConfig, PipelineConfig
from rayless.demo.env import NUM_ACTIONS, OBS_SIZE, VecCartPole
from rayless.demo.ppo import ActorCritic, get_weights, make_optimizer, ppo_update, set_weights
from rayless.demo.rollout import ReturnTracker, collect_rollout, compute_advantages
from rayless.ray.util import placement_group, remove_placement_group
from rayless.ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class _Rollout:
    """Environments and a copy of the policy: a rollout per call."""

    def __init__(self, algo: dict[str, Any], seed: int) -> None:
        torch.set_num_threads(1)
        self.algo = AlgoConfig(**algo)
        torch.manual_seed(seed)
        self.env = VecCartPole(self.algo.num_envs, seed=seed)
        self.policy = ActorCritic(OBS_SIZE, NUM_ACTIONS, self.algo.hidden_sizes)
        self.obs = self.env.reset()

    def rollout(self, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Collect with ``weights``; the transitions (GAE computed) and finished returns."""
        version = set_weights(self.policy, weights)
        self.policy.eval()
        td, self.obs = collect_rollout(
            self.env, self.policy, self.obs, self.algo.rollout_steps, policy_version=version
        )
        compute_advantages(td, self.algo.gamma, self.algo.gae_lambda)
        returns, _ = self.env.pop_finished_episodes()
        return {"batch": td, "returns": returns}


class _Learner:
    """The policy being trained."""

    def __init__(self, algo: dict[str, Any], seed: int) -> None:
        torch.set_num_threads(1)
        self.algo = AlgoConfig(**algo)
        torch.manual_seed(seed)
        self.policy = ActorCritic(OBS_SIZE, NUM_ACTIONS, self.algo.hidden_sizes)
        self.optimizer = make_optimizer(self.policy, self.algo)
        self.generator = torch.Generator().manual_seed(seed)
        self.version = 0

    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights with their version."""
        return get_weights(self.policy, self.version)

    def update(self, *batches: Any) -> dict[str, float]:
        """One PPO update on the batches of every rollout actor."""
        from tensordict import TensorDict

        batch = TensorDict.cat(list(batches), 0) if len(batches) > 1 else batches[0]
        self.policy.train()
        stats = ppo_update(self.policy, self.optimizer, batch, self.algo, generator=self.generator)
        self.version += 1
        return stats


# Ray's other spelling (the classes stay plain classes of this module); typed Any for mypy
RolloutActor: Any = ray.remote(num_cpus=1)(_Rollout)
Learner: Any = ray.remote(num_cpus=1)(_Learner)


def _num_rollouts(cfg: PipelineConfig) -> int:
    counts = [w.worker_num for w in cfg.cluster.env_worker]
    return sum(c for c in counts if isinstance(c, int)) or 2


def run(cfg: PipelineConfig, log: Any = print) -> dict[str, Any]:
    """Train until solved or out of iterations or time; the outcome.

    Raises:
        PlacementError: the cluster cannot hold the placement group.
        RayActorError: an actor died.
    """
    algo = asdict(cfg.algo)
    n = _num_rollouts(cfg)
    ray.init(ignore_reinit_error=True, _num_nodes=cfg.cluster.num_nodes)
    start = time.perf_counter()
    pg = placement_group([{"CPU": 1}] * (n + 1), strategy="PACK")
    ray.get(pg.ready())
    learner = Learner.options(
        num_cpus=0.25, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, n)
    ).remote(algo, cfg.run.seed)
    rollouts = [
        RolloutActor.options(
            num_cpus=0.25, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)
        ).remote(algo, cfg.run.seed + 1 + i)
        for i in range(n)
    ]
    tracker = ReturnTracker(cfg.algo.return_window)
    history: list[dict[str, float]] = []
    solved = False
    try:
        for it in range(1, cfg.algo.iterations + 1):
            weights = ray.put(ray.get(learner.weights.remote()))
            outs = ray.get([r.rollout.remote(weights) for r in rollouts])
            for out in outs:
                tracker.add(out["returns"])
            stats = ray.get(learner.update.remote(*[out["batch"] for out in outs]))
            elapsed = time.perf_counter() - start
            row = {"iteration": float(it), "seconds": elapsed, "mean_return": tracker.mean()}
            history.append({**row, **stats})
            if it % max(1, cfg.run.log_interval) == 0:
                log(f"iter {it:4d}  return {tracker.mean():7.1f}  {elapsed:6.1f} s")
            if tracker.full and tracker.mean() >= cfg.algo.target_return:
                solved = True
                break
            if elapsed > cfg.run.time_limit_s:
                break
    finally:
        remove_placement_group(pg)
        ray.shutdown()
    return {
        "solved": solved,
        "iterations": len(history),
        "seconds": time.perf_counter() - start,
        "final_return": tracker.mean(),
        "history": history,
    }
