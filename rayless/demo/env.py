"""CartPole-v1, vectorised in torch.

The dynamics are those of Gymnasium's ``CartPole-v1`` (Barto, Sutton & Anderson): gravity
9.8, cart mass 1.0, pole mass 0.1, pole half-length 0.5, force 10, ``tau`` 0.02 with
explicit Euler integration. An episode terminates when ``|x| > 2.4`` or
``|theta| > 12 degrees`` and is truncated after 500 steps; every step, including the last,
gives reward 1, so an episode's return equals its length.

All ``num_envs`` environments advance together as one ``[num_envs, 4]`` state tensor on
``device``. Finished environments reset automatically inside :meth:`VecCartPole.step`; the
observation they end on is returned separately (``final_obs``), which the learner needs to
bootstrap the value of truncated episodes. Nothing in :meth:`~VecCartPole.step` reads a
tensor back to the host, so stepping on a GPU does not synchronise.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
LENGTH = 0.5  # half the pole's length
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
X_THRESHOLD = 2.4
THETA_THRESHOLD = 12 * 2 * math.pi / 360
MAX_EPISODE_STEPS = 500
OBS_SIZE = 4
NUM_ACTIONS = 2


class StepResult(NamedTuple):
    """What :meth:`VecCartPole.step` returns; every field has leading dimension ``num_envs``.

    ``obs`` is the observation to act on next (already reset where the episode ended);
    ``final_obs`` is the observation each environment reached by this step, before any
    reset. ``done`` marks an episode end of either kind; ``truncated`` marks the subset that
    ended by the time limit without terminating (bootstrap those).
    """

    obs: torch.Tensor  # float32 [N, 4]
    reward: torch.Tensor  # float32 [N]
    done: torch.Tensor  # bool [N]
    truncated: torch.Tensor  # bool [N]
    final_obs: torch.Tensor  # float32 [N, 4]


class VecCartPole:
    """``num_envs`` CartPole-v1 environments stepped as one batch.

    ``dtype`` is the dtype of the internal state (observations are always float32); pass
    ``torch.float64`` to reproduce the scalar reference bit for bit.
    """

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        *,
        max_episode_steps: int = MAX_EPISODE_STEPS,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.max_episode_steps = max_episode_steps
        self.dtype = dtype
        self._gen = torch.Generator(device=self.device)
        self._gen.manual_seed(seed)
        self.state = self._initial_state(num_envs)
        self.episode_length = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        self.episode_return = torch.zeros(num_envs, dtype=torch.float32, device=self.device)
        self._finished: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _initial_state(self, n: int) -> torch.Tensor:
        u = torch.rand(n, OBS_SIZE, generator=self._gen, device=self.device, dtype=self.dtype)
        return u * 0.1 - 0.05  # uniform in [-0.05, 0.05), as in Gymnasium

    def observe(self) -> torch.Tensor:
        """The current observations, float32 ``[num_envs, 4]``."""
        return self.state.to(torch.float32)

    def reset(self) -> torch.Tensor:
        """Reset every environment (dropping unfinished episodes); returns the observations."""
        self.state = self._initial_state(self.num_envs)
        self.episode_length.zero_()
        self.episode_return.zero_()
        return self.observe()

    def step(self, action: torch.Tensor) -> StepResult:
        """Apply ``action`` (int ``[num_envs]``, 0 pushes left and 1 right) to every env."""
        if action.shape != (self.num_envs,):
            raise ValueError(
                f"action must have shape ({self.num_envs},), got {tuple(action.shape)}"
            )
        x, x_dot, theta, theta_dot = self.state.unbind(1)
        force = torch.where(action.to(self.device) == 1, FORCE_MAG, -FORCE_MAG).to(self.dtype)
        cos, sin = torch.cos(theta), torch.sin(theta)
        temp = (force + POLE_MASS_LENGTH * theta_dot**2 * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            LENGTH * (4.0 / 3.0 - MASS_POLE * cos**2 / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * x_acc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * theta_acc
        new_state = torch.stack((x, x_dot, theta, theta_dot), dim=1)

        self.episode_length += 1
        self.episode_return += 1.0
        terminated = (x.abs() > X_THRESHOLD) | (theta.abs() > THETA_THRESHOLD)
        truncated = (self.episode_length >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        self._finished.append((done, self.episode_return.clone(), self.episode_length.clone()))

        fresh = self._initial_state(self.num_envs)
        self.state = torch.where(done.unsqueeze(1), fresh, new_state)
        self.episode_length = torch.where(done, 0, self.episode_length)
        self.episode_return = torch.where(done, 0.0, self.episode_return)
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return StepResult(self.observe(), reward, done, truncated, new_state.to(torch.float32))

    def pop_finished_episodes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns and lengths of the episodes finished since the last call (CPU tensors).

        Episodes come in the order they finished (by step, then by env index).
        """
        if not self._finished:
            empty = torch.zeros(0)
            return empty, empty.to(torch.int64)
        done = torch.stack([d for d, _, _ in self._finished])
        rets = torch.stack([r for _, r, _ in self._finished])[done]
        lens = torch.stack([n for _, _, n in self._finished])[done]
        self._finished.clear()
        return rets.cpu(), lens.cpu()
