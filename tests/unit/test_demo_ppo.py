"""GAE, the transition TensorDict, the PPO update and weight broadcasting."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch.nn.parallel import DistributedDataParallel

from rayless.demo.config import AlgoConfig
from rayless.demo.env import VecCartPole
from rayless.demo.ppo import (
    VERSION_KEY,
    ActorCritic,
    act,
    compute_gae,
    get_weights,
    make_optimizer,
    ppo_loss,
    ppo_update,
    set_weights,
)
from rayless.demo.rollout import build_transitions, collect_rollout, compute_advantages

GAMMA, LAM = 0.9, 0.8
# env 0 terminates at t=1; env 1 is truncated at t=0 with V(final obs) = 5.
REWARD = torch.ones(3, 2)
VALUE = torch.tensor([[0.5, 1.0], [0.6, 2.0], [0.7, 3.0]])
DONE = torch.tensor([[False, True], [True, False], [False, False]])
TRUNCATED = torch.tensor([[False, True], [False, False], [False, False]])
TRUNCATED_VALUE = torch.tensor([[0.0, 5.0], [0.0, 0.0], [0.0, 0.0]])
LAST_VALUE = torch.tensor([0.4, 2.5])
# By hand. env 0: next values 0.6, 0 (terminal), 0.4
#   deltas 1 + .9*.6 - .5 = 1.04, 1 - .6 = .4, 1 + .9*.4 - .7 = .66
#   A2 = .66, A1 = .4 (episode ends), A0 = 1.04 + .9*.8*.4 = 1.328
# env 1: next values 5 (bootstrap), 3, 2.5
#   deltas 1 + 4.5 - 1 = 4.5, 1 + 2.7 - 2 = 1.7, 1 + 2.25 - 3 = .25
#   A2 = .25, A1 = 1.7 + .72*.25 = 1.88, A0 = 4.5 (episode ends)
EXPECTED_ADV = torch.tensor([[1.328, 4.5], [0.4, 1.88], [0.66, 0.25]])


def _transitions(env_ids: torch.Tensor | None = None) -> TensorDict:
    return build_transitions(
        obs=torch.randn(3, 2, 4),
        action=torch.zeros(3, 2, dtype=torch.int64),
        logp=torch.zeros(3, 2),
        value=VALUE,
        reward=REWARD,
        done=DONE,
        truncated=TRUNCATED,
        last_value=LAST_VALUE,
        truncated_value=TRUNCATED_VALUE,
        env_ids=env_ids,
        policy_version=3,
    )


def test_gae_hand_computed() -> None:
    td = _transitions()
    next_value = td["next_value"].view(3, 2)
    assert torch.allclose(next_value, torch.tensor([[0.6, 5.0], [0.0, 3.0], [0.4, 2.5]]))
    adv, ret = compute_gae(REWARD, VALUE, next_value, DONE, GAMMA, LAM)
    assert torch.allclose(adv, EXPECTED_ADV)
    assert torch.allclose(ret, EXPECTED_ADV + VALUE)


def test_transition_layout() -> None:
    td = _transitions()
    assert td.batch_size == torch.Size([6])
    assert td["obs"].shape == (6, 4) and td["obs"].dtype == torch.float32
    assert td["action"].dtype == torch.int64
    assert td["env_id"].tolist() == [0, 1, 0, 1, 0, 1]
    assert td["step"].tolist() == [0, 0, 1, 1, 2, 2]
    assert td["policy_version"].tolist() == [3] * 6
    with pytest.raises(ValueError, match="truncated_value"):
        build_transitions(
            obs=torch.zeros(3, 2, 4),
            action=torch.zeros(3, 2, dtype=torch.int64),
            logp=torch.zeros(3, 2),
            value=VALUE,
            reward=REWARD,
            done=DONE,
            truncated=TRUNCATED,
            last_value=LAST_VALUE,
        )


def test_advantages_on_shuffled_concatenated_shards() -> None:
    a, b = _transitions(), _transitions(torch.tensor([7, 9]))
    td = torch.cat([a, b])
    td = td[torch.randperm(12, generator=torch.Generator().manual_seed(0))]
    compute_advantages(td, GAMMA, LAM)
    for row in range(12):
        t, env = int(td["step"][row]), int(td["env_id"][row])
        col = {0: 0, 1: 1, 7: 0, 9: 1}[env]
        assert td["advantage"][row] == pytest.approx(float(EXPECTED_ADV[t, col]), abs=1e-6)
        assert td["return"][row] == pytest.approx(float(EXPECTED_ADV[t, col] + VALUE[t, col]))
    with pytest.raises(ValueError, match="steps"):
        compute_advantages(torch.cat([a, a[:2]]), GAMMA, LAM)


def _batch(seed: int = 0) -> TensorDict:
    torch.manual_seed(seed)
    env = VecCartPole(16, seed=seed)
    policy = ActorCritic()
    td, _ = collect_rollout(env, policy, env.reset(), 32)
    return compute_advantages(td, 0.99, 0.95)


def test_act_shapes() -> None:
    policy = ActorCritic()
    out = act(policy, torch.randn(5, 4), generator=torch.Generator().manual_seed(0))
    assert out.action.shape == out.logp.shape == out.value.shape == (5,)
    assert out.action.dtype == torch.int64 and bool((out.logp <= 0).all())
    greedy = act(policy, torch.randn(5, 4), deterministic=True)
    assert set(greedy.action.tolist()) <= {0, 1}


def test_update_reduces_loss_and_changes_weights() -> None:
    batch = _batch()
    policy = ActorCritic()
    torch.manual_seed(0)
    algo = AlgoConfig(epochs=4, num_minibatches=4, lr=1e-3)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with torch.no_grad():
        loss_before, _ = ppo_loss(policy, batch, algo)
    stats = ppo_update(policy, make_optimizer(policy, algo), batch, algo)
    with torch.no_grad():
        loss_after, _ = ppo_loss(policy, batch, algo)
    assert float(loss_after) < float(loss_before)
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert {"loss", "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac"} <= set(stats)


def test_update_rejects_too_small_batch() -> None:
    policy = ActorCritic()
    algo = AlgoConfig(num_minibatches=64)
    with pytest.raises(ValueError, match="num_minibatches"):
        ppo_update(policy, make_optimizer(policy, algo), _batch()[:10], algo)


def test_weights_round_trip() -> None:
    src, dst = ActorCritic(hidden_sizes=[8, 8]), ActorCritic(hidden_sizes=[8, 8])
    weights = get_weights(src, version=7)
    assert int(weights[VERSION_KEY]) == 7
    assert all(isinstance(v, torch.Tensor) for v in weights.values())
    assert set_weights(dst, weights) == 7
    for k, v in src.state_dict().items():
        assert torch.equal(v, dst.state_dict()[k])
    weights["actor.0.weight"].add_(1.0)  # a copy: the source is untouched
    assert not torch.equal(weights["actor.0.weight"], src.state_dict()["actor.0.weight"])
    with pytest.raises(ValueError, match=VERSION_KEY):
        set_weights(dst, {k: v for k, v in weights.items() if k != VERSION_KEY})


def test_update_and_weights_under_ddp(tmp_path: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    ddp: DistributedDataParallel | None = None
    try:
        plain = ActorCritic()
        ddp = DistributedDataParallel(ActorCritic())
        ddp.module.load_state_dict(plain.state_dict())
        algo = dataclasses.replace(AlgoConfig(), epochs=1, num_minibatches=2)
        batch = _batch(1)
        gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        ppo_update(plain, make_optimizer(plain, algo), batch, algo, generator=gen_a)
        ppo_update(ddp, make_optimizer(ddp, algo), batch, algo, generator=gen_b)
        weights = get_weights(ddp, version=1)
        assert not any(k.startswith("module.") for k in weights)
        for k, v in plain.state_dict().items():
            assert torch.allclose(v, weights[k], atol=1e-6)
        assert set_weights(ddp, get_weights(plain, version=2)) == 2
    finally:
        # The DDP reducer must go before its process group: collected later (in another
        # test), its gloo process group's destructor hung joining its threads.
        del ddp
        gc.collect()
        dist.destroy_process_group()
