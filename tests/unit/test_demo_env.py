"""VecCartPole against a scalar reference of the CartPole-v1 equations."""

from __future__ import annotations

import math

import pytest
import torch

from rayless.demo.env import VecCartPole


def reference_step(state: list[float], action: int) -> tuple[list[float], bool]:
    """One CartPole-v1 step written out with Python floats, as in Gymnasium."""
    x, x_dot, theta, theta_dot = state
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    total_mass = masscart + masspole
    polemass_length = masspole * length
    force = force_mag if action == 1 else -force_mag
    costheta, sintheta = math.cos(theta), math.sin(theta)
    temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
    thetaacc = (gravity * sintheta - costheta * temp) / (
        length * (4.0 / 3.0 - masspole * costheta**2 / total_mass)
    )
    xacc = temp - polemass_length * thetaacc * costheta / total_mass
    x = x + tau * x_dot
    x_dot = x_dot + tau * xacc
    theta = theta + tau * theta_dot
    theta_dot = theta_dot + tau * thetaacc
    terminated = (
        x < -2.4 or x > 2.4 or theta < -12 * 2 * math.pi / 360 or theta > 12 * 2 * math.pi / 360
    )
    return [x, x_dot, theta, theta_dot], terminated


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float64, 1e-6), (torch.float32, 1e-4)])
def test_dynamics_match_reference(dtype: torch.dtype, atol: float) -> None:
    env = VecCartPole(8, seed=3, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    terminations = 0
    for _ in range(200):
        before = env.state.double().tolist()
        action = torch.randint(0, 2, (8,), generator=gen)
        res = env.step(action)
        for i in range(8):
            expected, terminated = reference_step(before[i], int(action[i]))
            assert res.final_obs[i].double().tolist() == pytest.approx(expected, abs=atol)
            if abs(abs(expected[0]) - 2.4) > atol and abs(abs(expected[2]) - 0.2094) > atol:
                assert bool(res.done[i]) == terminated
            terminations += terminated
        assert not res.truncated.any()
    assert terminations > 20  # random actions end episodes quickly: resets were exercised


def test_auto_reset_of_finished_envs() -> None:
    env = VecCartPole(3, seed=0)
    env.reset()
    env.state[1] = torch.tensor([2.39, 1.0, 0.0, 0.0])  # about to leave the track
    env.episode_length[1] = 17
    res = env.step(torch.tensor([1, 1, 1]))
    assert res.done.tolist() == [False, True, False]
    assert not res.truncated.any()
    assert res.final_obs[1, 0] > 2.4
    assert res.obs[1].abs().max() <= 0.05  # fresh initial state
    assert torch.equal(res.obs[[0, 2]], res.final_obs[[0, 2]])
    assert env.episode_length.tolist() == [1, 0, 1]
    assert res.reward.tolist() == [1.0, 1.0, 1.0]
    assert res.obs.dtype == torch.float32


def test_truncation_at_500_steps() -> None:
    env = VecCartPole(2, seed=0)
    env.state.zero_()
    env.episode_length[0] = 499
    env.episode_return[0] = 499.0
    res = env.step(torch.tensor([0, 1]))
    assert res.done.tolist() == [True, False]
    assert res.truncated.tolist() == [True, False]
    returns, lengths = env.pop_finished_episodes()
    assert returns.tolist() == [500.0] and lengths.tolist() == [500]


def test_truncation_on_a_short_limit() -> None:
    env = VecCartPole(4, seed=1, max_episode_steps=5)
    for t in range(1, 16):
        res = env.step(torch.full((4,), t % 2))  # alternate: the pole stays up
        assert res.truncated.all() == (t % 5 == 0)
        assert torch.equal(res.done, res.truncated)
    returns, lengths = env.pop_finished_episodes()
    assert returns.tolist() == [5.0] * 12 and lengths.tolist() == [5] * 12


def test_episode_statistics() -> None:
    env = VecCartPole(16, seed=2)
    gen = torch.Generator().manual_seed(1)
    dones, total_steps = 0, 0
    for _ in range(100):
        res = env.step(torch.randint(0, 2, (16,), generator=gen))
        dones += int(res.done.sum())
        total_steps += 16
    returns, lengths = env.pop_finished_episodes()
    assert len(returns) == len(lengths) == dones > 0
    assert torch.equal(returns, lengths.float())  # reward 1 per step
    in_progress = int(env.episode_length.sum())
    assert int(lengths.sum()) + in_progress == total_steps
    assert 10 < float(returns.mean()) < 40  # random policy: about 22
    assert env.pop_finished_episodes()[0].numel() == 0


def test_reset_and_bad_input() -> None:
    env = VecCartPole(2)
    obs = env.reset()
    assert obs.shape == (2, 4) and obs.abs().max() <= 0.05
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="num_envs"):
        VecCartPole(0)
