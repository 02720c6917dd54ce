"""PPO for discrete actions: actor-critic MLP, action sampling, GAE and the update.

- :class:`ActorCritic` — separate tanh MLPs for the policy logits and the value.
- :func:`act` — the inference side: sample actions with log-probs and values for a batch.
- :func:`compute_gae` — GAE(lambda) over a ``[T, N]`` rollout. ``done`` cuts the recursion at
  an episode boundary; ``next_value`` carries the value to bootstrap from, which the rollout
  sets to V(final observation) for truncated episodes and to 0 for terminated ones.
- :func:`ppo_update` — clipped PPO on a batch (a plain module or a DDP-wrapped one).
- :func:`get_weights` / :func:`set_weights` — the policy as a flat ``{name: tensor}`` dict
  with its version under :data:`VERSION_KEY`, for broadcasting to inference workers.

Under DDP every rank must take the same number of optimiser steps (each backward is a
collective), so :func:`ppo_update` always runs ``epochs * num_minibatches`` steps, whatever
the size of the local shard.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch
from tensordict import TensorDict
from torch import nn

from rayless.demo.config import AlgoConfig

VERSION_KEY = "__version__"


def _mlp(sizes: list[int], out: int, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        linear = nn.Linear(a, b)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, nn.Tanh()]
    head = nn.Linear(sizes[-1], out)
    nn.init.orthogonal_(head.weight, out_gain)
    nn.init.zeros_(head.bias)
    layers.append(head)
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Actor and critic MLPs (no shared trunk); ``forward`` gives ``(logits, value)``."""

    def __init__(
        self, obs_size: int = 4, num_actions: int = 2, hidden_sizes: list[int] | None = None
    ) -> None:
        super().__init__()
        sizes = [obs_size, *(hidden_sizes or [64, 64])]
        self.actor = _mlp(sizes, num_actions, 0.01)
        self.critic = _mlp(sizes, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.critic(obs).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape ``obs.shape[:-1]``."""
        return self.critic(obs).squeeze(-1)


class ActOutput(NamedTuple):
    action: torch.Tensor  # int64 [B]
    logp: torch.Tensor  # float32 [B]
    value: torch.Tensor  # float32 [B]


@torch.no_grad()
def act(
    policy: ActorCritic,
    obs: torch.Tensor,
    *,
    deterministic: bool = False,
    generator: torch.Generator | None = None,
) -> ActOutput:
    """Sample (or, ``deterministic``, take the argmax of) actions for a batch of observations."""
    logits, value = policy(obs)
    logp_all = torch.log_softmax(logits, dim=-1)
    if deterministic:
        action = logits.argmax(dim=-1)
    else:
        action = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
    logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    return ActOutput(action, logp, value)


def compute_gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(lambda) advantages and returns (``advantage + value``) over time-major ``[T, N]``.

    ``delta_t = r_t + gamma * next_value_t - value_t``;
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` with ``A_T = 0``.
    ``next_value_t`` must already be 0 where the episode terminated and V(final obs) where it
    was truncated (see :func:`rayless.demo.rollout.build_transitions`).
    """
    if not (reward.shape == value.shape == next_value.shape == done.shape) or reward.dim() != 2:
        raise ValueError(
            "reward, value, next_value and done must share one [T, N] shape, got "
            f"{[tuple(t.shape) for t in (reward, value, next_value, done)]}"
        )
    delta = reward + gamma * next_value - value
    carry = (1.0 - done.to(reward.dtype)) * (gamma * lam)
    adv = torch.empty_like(reward)
    last = torch.zeros_like(reward[0])
    for t in range(reward.shape[0] - 1, -1, -1):
        last = delta[t] + carry[t] * last
        adv[t] = last
    return adv, adv + value


def _unwrap(module: nn.Module) -> nn.Module:
    inner = getattr(module, "module", None)
    return inner if isinstance(inner, nn.Module) else module


def ppo_loss(
    module: nn.Module, batch: TensorDict, algo: AlgoConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss on ``batch`` (keys ``obs action logp value advantage return``)."""
    logits, value = module(batch["obs"])
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, batch["action"].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    log_ratio = logp - batch["logp"]
    ratio = log_ratio.exp()
    adv = batch["advantage"]
    if algo.norm_adv and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    clipped = ratio.clamp(1.0 - algo.clip_coef, 1.0 + algo.clip_coef)
    pg_loss = torch.max(-adv * ratio, -adv * clipped).mean()
    ret = batch["return"]
    if algo.clip_vloss:
        old = batch["value"]
        v_clipped = old + (value - old).clamp(-algo.clip_coef, algo.clip_coef)
        v_loss = 0.5 * torch.max((value - ret) ** 2, (v_clipped - ret) ** 2).mean()
    else:
        v_loss = 0.5 * ((value - ret) ** 2).mean()
    loss = pg_loss + algo.vf_coef * v_loss - algo.ent_coef * entropy
    with torch.no_grad():
        stats = {
            "pg_loss": pg_loss.detach(),
            "v_loss": v_loss.detach(),
            "entropy": entropy.detach(),
            "approx_kl": ((ratio - 1) - log_ratio).mean(),
            "clipfrac": ((ratio - 1).abs() > algo.clip_coef).float().mean(),
        }
    return loss, stats


def ppo_update(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TensorDict,
    algo: AlgoConfig,
    *,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """``algo.epochs`` passes of ``algo.num_minibatches`` clipped-PPO steps over ``batch``.

    ``batch`` is a 1-D TensorDict with ``obs action logp value advantage return`` (see
    :func:`rayless.demo.rollout.compute_advantages`). ``module`` may be wrapped in
    ``DistributedDataParallel``; gradients are then averaged across ranks in ``backward``.
    Returns the mean of the loss statistics over all steps.
    """
    n = batch.shape[0]
    if n < algo.num_minibatches:
        raise ValueError(f"batch of {n} is smaller than num_minibatches={algo.num_minibatches}")
    batch = batch.select("obs", "action", "logp", "value", "advantage", "return")
    params = [p for p in module.parameters() if p.requires_grad]
    bounds = torch.linspace(0, n, algo.num_minibatches + 1).round().long().tolist()
    totals: dict[str, torch.Tensor] = {}
    module.train()
    for _ in range(algo.epochs):
        perm = torch.randperm(n, generator=generator).to(batch.device)
        for lo, hi in itertools.pairwise(bounds):
            loss, stats = ppo_loss(module, batch[perm[lo:hi]], algo)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, algo.max_grad_norm)
            optimizer.step()
            stats["loss"] = loss.detach()
            for k, v in stats.items():
                totals[k] = totals[k] + v if k in totals else v
    steps = algo.epochs * algo.num_minibatches
    return {k: float(v) / steps for k, v in totals.items()}


def make_optimizer(module: nn.Module, algo: AlgoConfig) -> torch.optim.Optimizer:
    """Adam with the PPO-customary ``eps=1e-5``."""
    return torch.optim.Adam(module.parameters(), lr=algo.lr, eps=1e-5)


def get_weights(module: nn.Module, version: int) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers as a flat dict of detached CPU tensors.

    DDP's ``module.`` prefix is dropped; ``weights[VERSION_KEY]`` is the 0-d int64 version.
    """
    weights = {k: v.detach().to("cpu", copy=True) for k, v in _unwrap(module).state_dict().items()}
    weights[VERSION_KEY] = torch.tensor(version, dtype=torch.int64)
    return weights


def set_weights(module: nn.Module, weights: dict[str, torch.Tensor]) -> int:
    """Load weights made by :func:`get_weights` (strictly) and return their version."""
    if VERSION_KEY not in weights:
        raise ValueError(f"weights lack the {VERSION_KEY!r} entry")
    state = {k: v for k, v in weights.items() if k != VERSION_KEY}
    _unwrap(module).load_state_dict(state, strict=True)
    return int(weights[VERSION_KEY])
