"""GRPO's arithmetic: group-normalised advantages, the clipped policy loss with a KL term.

- :func:`group_advantages` — ``A_i = (r_i - mean(group)) / (std(group) + eps)`` over the
  ``G`` responses of each prompt (groups are consecutive runs of ``G`` rows, as the grouped
  sampler returns them, or given by group ids).
- :func:`grpo_loss` — per token ``-min(ratio * A, clip(ratio) * A) + beta * KL``, where
  ``ratio = exp(logp - old_logp)`` and KL is the ``k3`` estimator
  ``exp(ref - logp) - (ref - logp) - 1`` (always >= 0, unbiased for KL(pi || ref));
  averaged over each response's tokens, then over responses (the GRPO paper's form).
- :func:`grpo_step` — one optimiser step on a batch (a plain or a DDP-wrapped model).
- :func:`train_single_process` — warm start then GRPO in one process: what the distributed
  pipeline does, without it (unit tests and tuning).
- :func:`policy_ops` — the :class:`~rayless.demo.grpo_policy.PolicyOps` of ``algo.model``:
  how every stage builds, samples, scores and warm-starts the policy (``tiny``: the small
  transformer of :mod:`rayless.demo.grpo_model`; ``hf``: a Hugging Face causal LM,
  :class:`rayless.demo.grpo_hf.HfOps`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rayless.demo import grpo_task as task
from rayless.demo.grpo_model import (
    generate,
    length_mask,
    response_logprobs,
    sft_step,
)
from rayless.demo.grpo_policy import PolicyOps, model_config

__all__ = [
    "PolicyOps",
    "evaluate",
    "group_advantages",
    "grpo_loss",
    "grpo_step",
    "model_config",
    "policy_ops",
    "train_single_process",
    "warm_start",
]


def policy_ops(algo: Any) -> PolicyOps:
    """The :class:`PolicyOps` of ``algo.model`` (``hf`` imports transformers)."""
    if getattr(algo, "model", "tiny") == "hf":
        from rayless.demo.grpo_hf import HfOps

        return HfOps(algo)
    return PolicyOps(algo)


def group_advantages(
    rewards: torch.Tensor,
    group_size: int | None = None,
    *,
    group_ids: Any = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-normalised advantages of ``rewards`` ``[N]``: consecutive groups of
    ``group_size``, or the groups named by ``group_ids`` (a sequence of ``N`` keys). A group
    whose rewards are all equal gets advantages 0. Raises ValueError for ragged groups."""
    n = rewards.shape[0]
    if group_ids is None:
        if group_size is None or group_size < 1 or n % group_size:
            raise ValueError(f"{n} rewards do not split into groups of {group_size}")
        r = rewards.view(-1, group_size)
        mean = r.mean(dim=1, keepdim=True)
        std = r.std(dim=1, unbiased=False, keepdim=True)
        return ((r - mean) / (std + eps)).view(n)
    keys = list(group_ids)
    if len(keys) != n:
        raise ValueError(f"{n} rewards but {len(keys)} group ids")
    out = torch.empty_like(rewards)
    members: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    for rows in members.values():
        idx = torch.tensor(rows, device=rewards.device)
        g = rewards[idx]
        out[idx] = (g - g.mean()) / (g.std(unbiased=False) + eps)
    return out


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss over ``[B, R]`` token log-probs (``mask`` marks real tokens; every row
    holds at least one) and per-response ``advantages`` ``[B]``; the statistics."""
    m = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    adv = advantages.unsqueeze(1)
    pg = -torch.min(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    d = ref_logp - logp
    kl = d.exp() - d - 1.0
    per_token = pg + beta * kl
    count = m.sum(dim=1).clamp(min=1.0)
    loss = ((per_token * m).sum(dim=1) / count).mean()
    with torch.no_grad():
        total = m.sum().clamp(min=1.0)
        stats = {
            "loss": float(loss),
            "pg_loss": float(((pg * m).sum(dim=1) / count).mean()),
            "kl": float((kl * m).sum() / total),
            "clipfrac": float(((ratio - 1).abs() > clip).to(m.dtype).mul(m).sum() / total),
        }
    return loss, stats


def grpo_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    *,
    group_size: int,
    temperature: float,
    clip: float,
    beta: float,
    max_grad_norm: float,
    advantages: torch.Tensor | None = None,
    ops: PolicyOps | None = None,
) -> dict[str, float]:
    """One optimiser step on ``batch`` (``prompts [B, Lp]``, ``responses [B, R]`` padded,
    ``lengths [B]``, ``logprobs``/``ref_logprobs [B, R]``, ``rewards [B]``; rows in whole
    consecutive groups unless ``advantages`` are given). Under DDP the backward averages the
    gradients across ranks."""
    if advantages is None:
        advantages = group_advantages(batch["rewards"], group_size)
    mask = length_mask(batch["lengths"], batch["responses"].shape[1])
    model.train()
    if ops is None:
        logp = response_logprobs(model, batch["prompts"], batch["responses"], temperature)
    else:
        logp = ops.logprobs(model, batch["prompts"], batch["responses"], temperature)
    loss, stats = grpo_loss(
        logp,
        batch["logprobs"],
        batch["ref_logprobs"],
        advantages,
        mask,
        clip=clip,
        beta=beta,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    stats["grad_norm"] = float(nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    optimizer.step()
    return stats


@torch.no_grad()
def evaluate(
    model: nn.Module,
    prompts: torch.Tensor,
    *,
    max_len: int,
    temperature: float,
    generator: torch.Generator,
    ops: PolicyOps | None = None,
) -> tuple[float, float]:
    """Mean reward and mean response length of one sample per prompt (task ids) at
    ``temperature``."""
    model.eval()
    if ops is None:
        gen = generate(
            model,
            prompts,
            max_new=task.max_new_tokens(max_len),
            temperature=temperature,
            eos=task.EOS,
            pad=task.PAD,
            generator=generator,
        )
        rewards = task.rewards_for(prompts, list(gen.responses))
    else:
        gen = ops.generate(
            model, ops.prompts(prompts), temperature=temperature, generator=generator
        )
        rewards = task.rewards_for(prompts, [ops.task_ids(r) for r in gen.responses])
    return float(rewards.mean()), float(gen.lengths.float().mean())


def warm_start(
    model: nn.Module,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    min_len: int,
    max_len: int,
    noise: float,
    generator: torch.Generator,
    ops: PolicyOps | None = None,
) -> float:
    """``steps`` supervised steps on noisy demonstrations (:func:`grpo_task.sft_batch`).
    Every DDP rank must pass the same ``steps``. Returns the last loss."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    loss = float("nan")
    model.train()
    for _ in range(steps):
        tokens, mask = task.sft_batch(batch_size, min_len, max_len, noise, generator)
        if ops is None:
            loss = sft_step(model, optimizer, tokens.to(device), mask.to(device))
        else:
            loss = ops.sft_step(model, optimizer, tokens.to(device), mask.to(device))
    return loss


def train_single_process(
    algo: Any,
    *,
    seed: int = 0,
    iterations: int | None = None,
    prompts_per_step: int = 16,
    log: Callable[[dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Warm start, then ``iterations`` (default ``algo.iterations``) GRPO steps of
    ``prompts_per_step`` prompts x ``algo.group_size`` responses, in this process, with the
    keys of a :class:`~rayless.demo.grpo_config.GrpoAlgoConfig`; per-step statistics (a
    held-out evaluation every ``algo.eval_interval`` steps). For tests and tuning."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    eval_gen = torch.Generator().manual_seed(seed + 1)
    held_out, _ = task.make_prompts(
        algo.eval_prompts, algo.min_len, algo.max_len, torch.Generator().manual_seed(10_000 + seed)
    )
    ops = policy_ops(algo)
    model = ops.build()
    t0 = time.perf_counter()
    warm_start(
        model,
        steps=algo.sft_steps,
        batch_size=algo.sft_batch_size,
        lr=algo.sft_lr,
        min_len=algo.min_len,
        max_len=algo.max_len,
        noise=algo.sft_noise,
        generator=gen,
        ops=ops,
    )
    ref = ops.build()
    ref.load_state_dict(model.state_dict())
    optimizer = torch.optim.Adam(model.parameters(), lr=algo.lr)
    history = []
    r0, l0 = evaluate(
        model,
        held_out,
        max_len=algo.max_len,
        temperature=algo.temperature,
        generator=eval_gen,
        ops=ops,
    )
    history.append(
        {"iteration": 0.0, "eval_reward": r0, "length": l0, "s": time.perf_counter() - t0}
    )
    if log is not None:
        log(history[-1])
    n_iter = algo.iterations if iterations is None else iterations
    for it in range(1, n_iter + 1):
        prompts, _ = task.make_prompts(prompts_per_step, algo.min_len, algo.max_len, gen)
        task_prompts = prompts.repeat_interleave(algo.group_size, dim=0)
        prompts = ops.prompts(task_prompts)
        model.eval()
        g = ops.generate(model, prompts, temperature=algo.temperature, generator=gen)
        with torch.no_grad():
            ref_lp = ops.logprobs(ref, prompts, g.responses, algo.temperature)
        rewards = task.rewards_for(task_prompts, [ops.task_ids(r) for r in g.responses])
        batch = {
            "prompts": prompts,
            "responses": g.responses,
            "lengths": g.lengths,
            "logprobs": g.logprobs,
            "ref_logprobs": ref_lp,
            "rewards": rewards,
        }
        for _ in range(algo.epochs):
            stats = grpo_step(
                model,
                optimizer,
                batch,
                group_size=algo.group_size,
                temperature=algo.temperature,
                clip=algo.clip_coef,
                beta=algo.kl_coef,
                max_grad_norm=algo.max_grad_norm,
                ops=ops,
            )
        row = {"iteration": float(it), "mean_reward": float(rewards.mean()), **stats}
        if it % algo.eval_interval == 0:
            row["eval_reward"], row["length"] = evaluate(
                model,
                held_out,
                max_len=algo.max_len,
                temperature=algo.temperature,
                generator=eval_gen,
                ops=ops,
            )
        row["s"] = time.perf_counter() - t0
        history.append(row)
        if log is not None:
            log(row)
    return history
