"""The GRPO demo's pieces without processes: task and reward, model and KV cache,
advantages, loss, warm start, config."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rayless.demo import grpo_task as task
from rayless.demo.grpo_algo import (
    group_advantages,
    grpo_loss,
    grpo_step,
    model_config,
    train_single_process,
)
from rayless.demo.grpo_config import (
    CONFIG_DIR,
    GRPO_CONFIG,
    GrpoConfig,
    grpo_config_from_dict,
    is_grpo_config,
    load_grpo_config,
)
from rayless.demo.grpo_model import TinyGPT, generate, length_mask, response_logprobs
from rayless.demo.main import resolve_config


def _t(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int64)


def _prompt(*digits: int, max_len: int = 6) -> torch.Tensor:
    pad = [task.PAD] * (max_len - len(digits))
    return _t(*pad, *digits, task.SEP)


# -- task and reward ---------------------------------------------------------------------


def test_reward_is_one_only_for_the_sorted_answer_and_stop_token() -> None:
    p = _prompt(3, 1, 2)
    assert task.answer(p) == [1, 2, 3, task.EOS]
    assert task.sort_reward(p, _t(1, 2, 3, task.EOS, task.PAD)) == 1.0
    assert task.sort_reward(p, _t(1, 2, 3, task.EOS, 7, 7)) == 1.0  # after EOS: ignored
    assert task.sort_reward(p, _t(3, 2, 1, task.EOS)) == pytest.approx(2 / 4)  # 2 and EOS
    assert task.sort_reward(p, _t(1, 2, task.EOS)) == pytest.approx(2 / 4)  # stopped short
    assert task.sort_reward(p, _t(1, 2, 3, 4, task.EOS)) == pytest.approx(3 / 5)  # too long
    assert task.sort_reward(p, _t(1, 2, 3, 3, 3, 3, 3, 3)) == pytest.approx(3 / 8)  # no stop
    assert task.sort_reward(p, _t(task.EOS)) == 0.0


def test_reward_stays_in_unit_interval_on_random_responses() -> None:
    gen = torch.Generator().manual_seed(0)
    prompts, lengths = task.make_prompts(200, 2, 6, gen)
    responses = list(torch.randint(0, task.VOCAB_SIZE, (200, 8), generator=gen))
    rewards = task.rewards_for(prompts, responses)
    assert rewards.dtype == torch.float32 and bool(((rewards >= 0) & (rewards <= 1)).all())
    assert [len(task.prompt_digits(p)) for p in prompts] == lengths.tolist()
    with pytest.raises(ValueError):
        task.rewards_for(prompts, responses[:3])


def test_prompts_are_left_padded_with_a_separator() -> None:
    prompts, lengths = task.make_prompts(50, 2, 6, torch.Generator().manual_seed(1))
    assert prompts.shape == (50, task.prompt_length(6))
    assert bool((prompts[:, -1] == task.SEP).all())
    for p, n in zip(prompts, lengths.tolist(), strict=True):
        assert p[: 6 - n].tolist() == [task.PAD] * (6 - n)
        assert all(0 <= d <= 9 for d in p[6 - n : 6].tolist())
    with pytest.raises(ValueError):
        task.make_prompts(1, 5, 3, torch.Generator())


def test_sft_demonstrations_are_the_answer_without_noise() -> None:
    tokens, mask = task.sft_batch(20, 2, 6, 0.0, torch.Generator().manual_seed(2))
    lp = task.prompt_length(6)
    for row, m in zip(tokens, mask, strict=True):
        want = task.answer(row[:lp])
        assert row[lp : lp + len(want)].tolist() == want
        assert task.sort_reward(row[:lp], row[lp:]) == 1.0
        assert int(m.sum()) == len(want)  # learn the answer and its stop token
        assert bool(m[lp - 1 : lp - 1 + len(want)].all())
    noisy, _ = task.sft_batch(400, 2, 6, 1.0, torch.Generator().manual_seed(2))
    mean = float(task.rewards_for(noisy[:, :lp], list(noisy[:, lp:])).mean())
    assert 0.1 < mean < 0.5  # random digits, right length and stop token


# -- model -------------------------------------------------------------------------------


def test_kv_cached_generation_matches_a_full_forward() -> None:
    torch.manual_seed(0)
    model = TinyGPT(model_config(6, 32, 2, 4)).eval()
    prompts, _ = task.make_prompts(16, 2, 6, torch.Generator().manual_seed(3))
    out = generate(
        model,
        prompts,
        max_new=task.max_new_tokens(6),
        temperature=1.0,
        eos=task.EOS,
        pad=task.PAD,
        generator=torch.Generator().manual_seed(4),
    )
    mask = length_mask(out.lengths, out.responses.shape[1])
    with torch.no_grad():
        full = response_logprobs(model, prompts, out.responses, 1.0)
    assert torch.allclose(full[mask], out.logprobs[mask], atol=1e-5)
    assert bool((out.logprobs[~mask] == 0).all()) and bool((out.responses[~mask] == task.PAD).all())
    ended = out.lengths < out.responses.shape[1]
    rows = torch.arange(16)[ended]
    assert bool((out.responses[rows, out.lengths[ended] - 1] == task.EOS).all())


def test_model_refuses_sequences_past_its_context() -> None:
    model = TinyGPT(model_config(2, 16, 1, 2))
    with pytest.raises(ValueError, match="max_seq"):
        model(torch.zeros(1, model.cfg.max_seq + 1, dtype=torch.int64))


# -- advantages and loss -----------------------------------------------------------------


def test_group_advantages_normalise_each_group() -> None:
    r = torch.tensor([0.0, 1.0, 0.5, 0.5, 0.2, 0.2, 0.2, 0.2])
    adv = group_advantages(r, 4)
    first = adv[:4]
    assert float(first.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(first.std(unbiased=False)) == pytest.approx(1.0, rel=1e-4)
    assert first[1] > first[2] == first[3] > first[0]
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards: no signal
    by_id = group_advantages(r, group_ids=["a", "a", "a", "a", "b", "b", "b", "b"])
    assert torch.allclose(by_id, adv)
    shuffled = group_advantages(r[[0, 4, 1, 5]], group_ids=["a", "b", "a", "b"])
    assert shuffled[1] == shuffled[3] == 0 and shuffled[2] > 0 > shuffled[0]
    with pytest.raises(ValueError):
        group_advantages(r, 3)
    with pytest.raises(ValueError):
        group_advantages(r, group_ids=["a"])


def test_loss_is_the_clipped_objective_plus_kl() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.9]]))
    mask = torch.tensor([[True, True], [True, False]])
    adv = torch.tensor([1.0, -1.0])
    # on-policy, reference equal: loss = -mean over responses of A (ratio 1), kl 0
    loss, stats = grpo_loss(logp, logp, logp, adv, mask, clip=0.2, beta=0.1)
    assert float(loss) == pytest.approx(0.0) and stats["kl"] == pytest.approx(0.0)
    # ratio 2 with a positive advantage is clipped to 1.2; padding counts for nothing
    old = logp - math.log(2.0)
    loss, stats = grpo_loss(logp, old, logp, adv, mask, clip=0.2, beta=0.0)
    assert float(loss) == pytest.approx((-1.2 + 2.0) / 2)  # row 2: -(-1 * 2) = 2
    assert stats["clipfrac"] == pytest.approx(1.0)
    # the k3 KL estimator: exp(d) - d - 1 >= 0
    ref = logp - 0.5
    _, stats = grpo_loss(logp, logp, ref, torch.zeros(2), mask, clip=0.2, beta=1.0)
    assert stats["kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1)


def test_a_grpo_step_raises_the_likelihood_of_the_better_response() -> None:
    torch.manual_seed(0)
    model = TinyGPT(model_config(2, 16, 1, 2))
    prompts = _prompt(2, 1, max_len=2).repeat(2, 1)
    responses = torch.stack([_t(1, 2, task.EOS, task.PAD), _t(2, 1, task.EOS, task.PAD)])
    with torch.no_grad():
        old = response_logprobs(model, prompts, responses, 1.0)
    batch = {
        "prompts": prompts,
        "responses": responses,
        "lengths": torch.tensor([3, 3]),
        "logprobs": old,
        "ref_logprobs": old,
        "rewards": torch.tensor([1.0, 1 / 3]),
    }
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(5):
        grpo_step(
            model, opt, batch, group_size=2, temperature=1.0, clip=0.2, beta=0.0, max_grad_norm=1.0
        )
    with torch.no_grad():
        new = response_logprobs(model, prompts, responses, 1.0)
    assert float(new[0].sum()) > float(old[0].sum())
    assert float(new[1].sum()) < float(old[1].sum())


def test_single_process_loop_runs() -> None:
    algo = GrpoConfig().algo
    algo.sft_steps, algo.eval_prompts, algo.eval_interval = 5, 8, 1
    rows = train_single_process(algo, iterations=2, prompts_per_step=2)
    assert [r["iteration"] for r in rows] == [0.0, 1.0, 2.0]
    assert all(0 <= r["eval_reward"] <= 1 for r in rows)


# -- config ------------------------------------------------------------------------------


def _shipped() -> dict[str, Any]:
    data = yaml.safe_load(GRPO_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


def test_shipped_grpo_configs_load_and_round_trip() -> None:
    cfg = load_grpo_config()
    assert cfg.cluster.train_worker.count == 2 and cfg.run.device == "cpu"
    assert cfg.responses_per_iteration == 2 * 8 * 8
    assert grpo_config_from_dict(cfg.to_dict()) == cfg
    gpu = load_grpo_config(CONFIG_DIR / "grpo_gpu.yaml")
    assert gpu.run.device == "cuda" and gpu.cluster.fake_gpus_per_node == 0
    assert is_grpo_config(GRPO_CONFIG) and not is_grpo_config(CONFIG_DIR / "default.yaml")
    assert resolve_config("grpo") == GRPO_CONFIG
    assert resolve_config("grpo_gpu") == CONFIG_DIR / "grpo_gpu.yaml"
    with pytest.raises(ValueError, match="grpo"):
        resolve_config("nope")


def test_grpo_configs_are_told_from_ppo_ones(tmp_path: Path) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("cluster:\n  rollout_workers: {worker_num: 2}\nalgo:\n  group_size: 4\n")
    assert is_grpo_config(typo)  # so its error names GRPO's keys, not PPO's
    with pytest.raises(ValueError, match=r"unknown key 'rollout_workers'.*rollout_worker"):
        load_grpo_config(typo)
    for text in ("", "- 1\n", "cluster: 3\n", "::: not yaml"):
        typo.write_text(text)
        assert not is_grpo_config(typo)
    assert not is_grpo_config(tmp_path / "missing.yaml")


def test_planning_view_maps_grpo_workers_onto_planner_components() -> None:
    view = load_grpo_config().planning()
    assert view.cluster.eval_worker.count == 2  # rollout
    assert [w.count for w in view.cluster.env_worker] == [2, 1]  # reward, reference


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("algo", "group_size", 1, "algo.group_size"),
        ("algo", "lr", -1, "algo.lr"),
        ("algo", "max_len", 12, "algo.max_len"),
        ("algo", "min_len", 9, "algo.min_len"),
        ("algo", "target_reward", 1.5, "algo.target_reward"),
        ("algo", "sampler", "random", "algo.sampler"),
        ("algo", "n_heads", 5, "algo.d_model"),
        ("algo", "bogus", 1, "unknown key 'bogus'"),
        ("policy", "rollout_mode", "later", "policy.rollout_mode"),
        ("cluster", "env_worker", {"worker_num": 1}, "unknown key 'env_worker'"),
    ],
)
def test_bad_grpo_values_are_named(section: str, key: str, value: Any, message: str) -> None:
    data = _shipped()
    data[section][key] = value
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        grpo_config_from_dict(data)


def test_bad_worker_counts_name_grpo_workers() -> None:
    data = _shipped()
    data["cluster"]["reference_worker"]["worker_num"] = 2
    with pytest.raises(ValueError, match=r"cluster\.reference_worker\.worker_num"):
        grpo_config_from_dict(data)
    data = _shipped()
    data["cluster"]["rollout_worker"]["num_gpus"] = 1.5
    with pytest.raises(ValueError, match=r"cluster\.rollout_worker\.num_gpus"):
        grpo_config_from_dict(data)
    data = _shipped()
    data["cluster"]["rollout_worker"]["worker_num"] = 1
    data["algo"]["prompts_per_rollout"] = 3
    with pytest.raises(ValueError, match="3 groups of an iteration"):
        grpo_config_from_dict(data)  # 3 groups cannot split over 2 train ranks
    data = _shipped()
    data["cluster"]["rollout_worker"]["worker_num"] = 3  # 2 + 3 GPUs > 2 nodes x 2
    with pytest.raises(ValueError, match="GPUs"):
        grpo_config_from_dict(data)
