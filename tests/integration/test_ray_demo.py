"""``rayless demo --api ray``: the PPO demo written against Ray's API only still solves."""

from __future__ import annotations

import pytest

from rayless.demo.config import DEFAULT_CONFIG, load_config
from rayless.demo.main import main

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rayless_ray_demo")]


@pytest.mark.slow  # a PPO run to its solve (~25 s)
def test_ppo_on_the_ray_api_solves_cartpole(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(DEFAULT_CONFIG)
    assert main(["--api", "ray", "--iterations", str(cfg.algo.iterations)]) == 0
    out = capsys.readouterr().out
    assert "solved: mean return" in out and "not solved" not in out


def test_ray_api_refuses_the_grpo_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--api", "ray", "--config", "grpo"]) == 1
    assert "PPO demo only" in capsys.readouterr().err
