"""Rollouts as TensorDicts, advantages from them, and the single-process training loop.

The transition TensorDict is what the pipeline pushes through the store each iteration:
batch ``[T * N]``, time-major (row ``t * N + n`` is step ``t`` of env ``n``), with

==============  ========  ===============================================================
key             dtype     meaning
==============  ========  ===============================================================
obs             f32 [4]   observation acted on
action          int64     action taken
logp            f32       log-prob of ``action`` under the acting policy
value           f32       V(obs) under the acting policy
reward          f32       reward received
done            bool      the episode ended at this step (terminated or truncated)
truncated       bool      ... by the time limit (its value is bootstrapped)
next_value      f32       value to bootstrap from: V(next obs) inside an episode,
                          V(final obs) on truncation, 0 on termination
env_id          int64     global index of the environment
step            int64     index of the step within the rollout (0..T-1)
policy_version  int64     version of the weights that acted
==============  ========  ===============================================================

Because every row carries ``next_value``, ``env_id`` and ``step``, a train worker can compute
GAE on any shard holding whole env trajectories (:func:`compute_advantages`), in any row
order and from any number of env workers concatenated.

The *mean return* of a run is the mean return of the last ``algo.return_window`` finished
episodes over all environments (:class:`ReturnTracker`); training stops once it reaches
``algo.target_return`` and at least ``return_window`` episodes have finished.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from rayless.demo.config import AlgoConfig
from rayless.demo.env import NUM_ACTIONS, OBS_SIZE, VecCartPole
from rayless.demo.ppo import ActorCritic, act, compute_gae, make_optimizer, ppo_update


def build_transitions(
    *,
    obs: torch.Tensor,
    action: torch.Tensor,
    logp: torch.Tensor,
    value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    truncated: torch.Tensor,
    last_value: torch.Tensor,
    truncated_value: torch.Tensor | None = None,
    env_ids: torch.Tensor | None = None,
    policy_version: int | torch.Tensor = 0,
) -> TensorDict:
    """The ``[T * N]`` transition TensorDict from a time-major ``[T, N]`` rollout.

    ``obs`` is ``[T, N, 4]``; ``last_value`` (``[N]``) is V of the observation after the last
    step; ``truncated_value`` (``[T, N]``) holds V(final obs) where ``truncated`` (other
    entries are ignored; may be omitted when nothing was truncated). ``env_ids`` (``[N]``)
    defaults to ``0..N-1``; ``policy_version`` is one int or a ``[T, N]`` tensor.
    """
    if value.dim() != 2:
        raise ValueError(f"value must be [T, N], got {tuple(value.shape)}")
    t_len, n = value.shape
    for name, x in (("action", action), ("logp", logp), ("reward", reward), ("done", done)):
        if x.shape != (t_len, n):
            raise ValueError(f"{name} must be [{t_len}, {n}], got {tuple(x.shape)}")
    if truncated.shape != (t_len, n) or obs.shape[:2] != (t_len, n):
        raise ValueError("obs and truncated must match value's [T, N]")
    if last_value.shape != (n,):
        raise ValueError(f"last_value must be [{n}], got {tuple(last_value.shape)}")
    device = value.device
    next_value = torch.cat((value[1:], last_value.unsqueeze(0)), dim=0)
    if truncated_value is not None:
        next_value = torch.where(truncated, truncated_value, next_value)
    elif bool(truncated.any()):
        raise ValueError("truncated steps need truncated_value to bootstrap from")
    next_value = torch.where(done & ~truncated, 0.0, next_value)
    if env_ids is None:
        env_ids = torch.arange(n, device=device)
    version = torch.as_tensor(policy_version, dtype=torch.int64, device=device)
    data = {
        "obs": obs.to(torch.float32),
        "action": action.to(torch.int64),
        "logp": logp.to(torch.float32),
        "value": value.to(torch.float32),
        "reward": reward.to(torch.float32),
        "done": done.to(torch.bool),
        "truncated": truncated.to(torch.bool),
        "next_value": next_value.to(torch.float32),
        "env_id": env_ids.to(device, torch.int64).expand(t_len, n),
        "step": torch.arange(t_len, device=device).unsqueeze(1).expand(t_len, n),
        "policy_version": version.expand(t_len, n),
    }
    flat = {k: v.reshape(t_len * n, *v.shape[2:]) for k, v in data.items()}
    return TensorDict(flat, batch_size=[t_len * n], device=device)


def compute_advantages(td: TensorDict, gamma: float, lam: float) -> TensorDict:
    """Add ``advantage`` and ``return`` to a transition TensorDict (in place; returned).

    Rows are grouped by ``env_id`` and ordered by ``step``; every env must contribute the
    same number of steps.
    """
    n_rows = td.shape[0]
    env_id, step = td["env_id"], td["step"]
    envs = torch.unique(env_id)
    if n_rows % envs.numel():
        raise ValueError(f"{n_rows} rows do not split evenly over {envs.numel()} envs")
    t_len = n_rows // envs.numel()
    order = torch.argsort(env_id * (int(step.max()) + 1) + step)
    grid = order.view(envs.numel(), t_len).T  # [T, N] row indices
    if not bool((step[grid] == torch.arange(t_len, device=step.device).unsqueeze(1)).all()):
        raise ValueError("each env must have exactly the steps 0..T-1 once")
    adv, ret = compute_gae(
        td["reward"][grid],
        td["value"][grid],
        td["next_value"][grid],
        td["done"][grid],
        gamma,
        lam,
    )
    advantage = torch.empty_like(td["value"])
    returns = torch.empty_like(td["value"])
    advantage[grid] = adv
    returns[grid] = ret
    td.set("advantage", advantage)
    td.set("return", returns)
    return td


def collect_rollout(
    env: VecCartPole,
    policy: ActorCritic,
    obs: torch.Tensor,
    num_steps: int,
    *,
    policy_version: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[TensorDict, torch.Tensor]:
    """Step ``env`` ``num_steps`` times with ``policy`` from ``obs``.

    Returns the transition TensorDict and the observation to continue from.
    """
    t_len, n = num_steps, env.num_envs
    dev = env.device
    obs_buf = torch.empty(t_len, n, OBS_SIZE, device=dev)
    act_buf = torch.empty(t_len, n, dtype=torch.int64, device=dev)
    logp_buf, val_buf, rew_buf, trunc_val = (torch.zeros(t_len, n, device=dev) for _ in range(4))
    done_buf = torch.empty(t_len, n, dtype=torch.bool, device=dev)
    trunc_buf = torch.empty(t_len, n, dtype=torch.bool, device=dev)
    for t in range(t_len):
        out = act(policy, obs, generator=generator)
        res = env.step(out.action)
        obs_buf[t], act_buf[t], logp_buf[t], val_buf[t] = obs, out.action, out.logp, out.value
        rew_buf[t], done_buf[t], trunc_buf[t] = res.reward, res.done, res.truncated
        if bool(res.truncated.any()):  # rare: 500-step episodes
            with torch.no_grad():
                trunc_val[t] = torch.where(res.truncated, policy.value(res.final_obs), 0.0)
        obs = res.obs
    with torch.no_grad():
        last_value = policy.value(obs)
    td = build_transitions(
        obs=obs_buf,
        action=act_buf,
        logp=logp_buf,
        value=val_buf,
        reward=rew_buf,
        done=done_buf,
        truncated=trunc_buf,
        last_value=last_value,
        truncated_value=trunc_val,
        policy_version=policy_version,
    )
    return td, obs


class ReturnTracker:
    """Mean return of the last ``window`` finished episodes."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._returns: collections.deque[float] = collections.deque(maxlen=window)
        self.episodes = 0

    def add(self, returns: torch.Tensor) -> None:
        values = returns.tolist()
        self._returns.extend(values)
        self.episodes += len(values)

    @property
    def full(self) -> bool:
        return len(self._returns) == self.window

    def mean(self) -> float:
        """The mean (NaN before the first episode finishes)."""
        return sum(self._returns) / len(self._returns) if self._returns else float("nan")


@dataclass
class TrainResult:
    solved: bool
    iterations: int
    env_steps: int
    seconds: float
    time_to_target_s: float | None
    history: list[dict[str, float]] = field(default_factory=list)


def train_single_process(
    algo: AlgoConfig,
    *,
    seed: int = 0,
    num_env_workers: int = 1,
    time_limit_s: float | None = None,
    log: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    """Collect, GAE, PPO update in one process until the mean return hits the target.

    ``num_env_workers`` multiplies the environments (the batch the distributed pipeline
    would gather per iteration from that many env workers).
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    env = VecCartPole(algo.num_envs * num_env_workers, seed=seed)
    policy = ActorCritic(OBS_SIZE, NUM_ACTIONS, algo.hidden_sizes)
    optimizer = make_optimizer(policy, algo)
    tracker = ReturnTracker(algo.return_window)
    obs = env.reset()
    start = time.perf_counter()
    result = TrainResult(False, 0, 0, 0.0, None)
    for it in range(1, algo.iterations + 1):
        policy.eval()
        td, obs = collect_rollout(env, policy, obs, algo.rollout_steps, policy_version=it - 1)
        compute_advantages(td, algo.gamma, algo.gae_lambda)
        stats = ppo_update(policy, optimizer, td, algo, generator=gen)
        returns, _ = env.pop_finished_episodes()
        tracker.add(returns)
        elapsed = time.perf_counter() - start
        row = {
            "iteration": float(it),
            "env_steps": float(it * td.shape[0]),
            "seconds": elapsed,
            "mean_return": tracker.mean(),
            "episodes": float(tracker.episodes),
            **stats,
        }
        result.history.append(row)
        result.iterations, result.env_steps, result.seconds = it, int(row["env_steps"]), elapsed
        if log is not None:
            log(row)
        if tracker.full and tracker.mean() >= algo.target_return:
            result.solved, result.time_to_target_s = True, elapsed
            break
        if time_limit_s is not None and elapsed > time_limit_s:
            break
    return result
