"""How the GRPO stages use a policy: :class:`PolicyOps` for the demo's small transformer.

Every stage (rollout, reward, reference, train, the warm start) builds, samples, scores and
warm-starts its policy through one of these (``algo.model``): this one for
:class:`rayless.demo.grpo_model.TinyGPT` (``tiny``), :class:`rayless.demo.grpo_hf.HfOps` for
a Hugging Face causal LM (``hf``). :func:`rayless.demo.grpo_algo.policy_ops` picks one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rayless.demo import grpo_task as task
from rayless.demo.grpo_model import (
    Generation,
    ModelConfig,
    TinyGPT,
    generate,
    response_logprobs,
    sft_step,
)

__all__ = ["PolicyOps", "model_config"]


def model_config(max_len: int, d_model: int, n_layers: int, n_heads: int) -> ModelConfig:
    """The policy's shape for prompts of up to ``max_len`` digits."""
    seq = task.prompt_length(max_len) + task.max_new_tokens(max_len)
    return ModelConfig(task.VOCAB_SIZE, d_model, n_layers, n_heads, seq)


class PolicyOps:
    """The policy as the GRPO stages use it: the demo's small transformer (``algo.model:
    tiny``). Prompts and responses travel in the model's token ids; the task (and so the
    reward) speaks :mod:`rayless.demo.grpo_task`'s ids, :meth:`task_ids` maps back."""

    kind = "tiny"
    pad = task.PAD  # fills responses after their stop token
    eos = task.EOS

    def __init__(self, algo: Any) -> None:
        self.algo = algo

    def build(self) -> nn.Module:
        """A fresh policy of the configured shape (weights from the warm start)."""
        a = self.algo
        return TinyGPT(model_config(a.max_len, a.d_model, a.n_layers, a.n_heads))

    def prompts(self, task_prompts: torch.Tensor) -> torch.Tensor:
        """The task's prompts ``[B, Lp]`` as the model's input ids (all one length)."""
        return task_prompts

    def task_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's token ids as the task's ids (for the reward)."""
        return tokens

    def generate(
        self,
        model: nn.Module,
        prompts: torch.Tensor,
        *,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Generation:
        """One sampled response per row of ``prompts`` (model ids), to the stop token."""
        return generate(
            model,
            prompts,
            max_new=task.max_new_tokens(self.algo.max_len),
            temperature=temperature,
            eos=self.eos,
            pad=self.pad,
            generator=generator,
        )

    def logprobs(
        self, model: nn.Module, prompts: torch.Tensor, responses: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """Log-probs ``[B, R]`` of the response tokens (differentiable)."""
        return response_logprobs(model, prompts, responses, temperature)

    def sft_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        tokens: torch.Tensor,
        mask: torch.Tensor,
    ) -> float:
        """One supervised step on :func:`grpo_task.sft_batch`'s demonstrations (task ids)."""
        return sft_step(model, optimizer, tokens, mask)

    def pull_target(self, model: nn.Module) -> dict[str, Any]:
        """How a rollout worker pulls new weights into ``model``: ``WeightSync.pull``'s
        keyword arguments (here: the module itself, in place)."""
        return {"target": model}
