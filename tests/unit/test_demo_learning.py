"""A short single-process PPO run learns CartPole well beyond the random policy."""

from __future__ import annotations

import dataclasses

import torch

from rayless.demo.config import AlgoConfig
from rayless.demo.rollout import train_single_process


def test_ppo_learns_cartpole() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        algo = dataclasses.replace(AlgoConfig(), iterations=12, return_window=32)
        result = train_single_process(algo, seed=0, num_env_workers=2)
    finally:
        torch.set_num_threads(threads)
    first = result.history[0]["mean_return"]
    last = result.history[-1]["mean_return"]
    assert first < 40  # the random policy: about 22
    assert last > 80, [round(r["mean_return"]) for r in result.history]
