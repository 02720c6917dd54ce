"""The GRPO demo's task: sort a list of digits, with a reward computed by code (RLVR).

A prompt is ``n`` random digits (``min_len <= n <= max_len``), left-padded with ``PAD`` to
``max_len`` and closed by ``SEP``, so every prompt has the same length (``max_len + 1``) and
generation starts at the same position for a whole batch. The right response is the digits
in ascending order followed by the stop token ``EOS``; responses are as long as their prompt
(plus ``EOS``), so lengths vary within a batch.

Why sorting: it has one right answer that a few lines of code verify, a reward with partial
credit (:func:`sort_reward`: the share of positions right) so a group of ``G`` samples
nearly always holds different rewards (GRPO learns nothing from a group of equal rewards),
response lengths that vary with the prompt, and a tiny vocabulary (13 tokens) that a
two-layer transformer learns on a CPU within seconds.

Warm start: :func:`sft_batch` makes supervised demonstrations in which every digit of the
answer is replaced by a random digit with probability ``noise``. A model trained on them
imitates the noise as well as the task (like an SFT model copying imperfect human
demonstrations), so its sampled answers score well below 1 (about ``1 - noise * 0.9`` per
position once it has learned the task); the verifiable reward then lets RL do better than its
demonstrations.
"""

from __future__ import annotations

import torch

NUM_DIGITS = 10
SEP = 10  # ends the prompt
EOS = 11  # the stop token: ends a response
PAD = 12  # left padding of prompts; fill after EOS
VOCAB_SIZE = 13


def prompt_length(max_len: int) -> int:
    """Tokens in every prompt: ``max_len`` (padded) digits and ``SEP``."""
    return max_len + 1


def max_new_tokens(max_len: int) -> int:
    """The generation budget: the longest answer, its ``EOS`` and one spare token."""
    return max_len + 2


def make_prompts(
    num: int, min_len: int, max_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num`` prompts ``[num, max_len + 1]`` (int64) and their digit counts ``[num]``."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=generator)
    digits = torch.randint(0, NUM_DIGITS, (num, max_len), generator=generator)
    pos = torch.arange(max_len).unsqueeze(0)
    pad = pos < (max_len - lengths).unsqueeze(1)  # left padding
    prompts = torch.where(pad, PAD, digits)
    sep = torch.full((num, 1), SEP, dtype=torch.int64)
    return torch.cat((prompts, sep), dim=1), lengths


def prompt_digits(prompt: torch.Tensor) -> list[int]:
    """The digits of one prompt (padding and ``SEP`` dropped)."""
    return [int(t) for t in prompt.tolist() if 0 <= t < NUM_DIGITS]


def answer(prompt: torch.Tensor) -> list[int]:
    """The right response to one prompt: its digits sorted, then ``EOS``."""
    return [*sorted(prompt_digits(prompt)), EOS]


def response_tokens(response: torch.Tensor) -> list[int]:
    """A response's tokens up to and including its first ``EOS`` (all of them without one)."""
    out = []
    for t in response.tolist():
        out.append(int(t))
        if t == EOS:
            break
    return out


def sort_reward(prompt: torch.Tensor, response: torch.Tensor) -> float:
    """The reward of one response in [0, 1]: positions equal to the right answer (sorted digits
    and ``EOS``) over the longer of answer and response. 1 only for the exact answer; a
    response that never stops (no ``EOS``) or runs long is penalised by its length."""
    want = answer(prompt)
    got = response_tokens(response)
    hits = sum(1 for a, b in zip(want, got, strict=False) if a == b)
    return hits / max(len(want), len(got))


def rewards_for(prompts: torch.Tensor, responses: list[torch.Tensor]) -> torch.Tensor:
    """:func:`sort_reward` of each (prompt, response) pair, as a float32 tensor."""
    if len(responses) != prompts.shape[0]:
        raise ValueError(f"{prompts.shape[0]} prompts but {len(responses)} responses")
    return torch.tensor(
        [sort_reward(p, r) for p, r in zip(prompts, responses, strict=True)], dtype=torch.float32
    )


def sft_batch(
    num: int, min_len: int, max_len: int, noise: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy demonstrations for the warm start: token sequences ``[num, Lp + max_new]`` (prompt,
    answer with each digit replaced by a random one with probability ``noise``, ``EOS``,
    ``PAD`` fill) and the mask ``[num, Lp + max_new - 1]`` of the positions to learn (each
    position predicts the next token: the answer's tokens and its ``EOS``)."""
    if not 0.0 <= noise <= 1.0:
        raise ValueError(f"noise must be in [0, 1], got {noise}")
    prompts, lengths = make_prompts(num, min_len, max_len, generator)
    lp, new = prompt_length(max_len), max_new_tokens(max_len)
    digits = prompts[:, :max_len]
    key = torch.where(digits == PAD, NUM_DIGITS, digits)  # padding sorts last
    ordered = torch.sort(key, dim=1).values
    flip = torch.rand(num, max_len, generator=generator) < noise
    random_digits = torch.randint(0, NUM_DIGITS, (num, max_len), generator=generator)
    ordered = torch.where(flip & (ordered < NUM_DIGITS), random_digits, ordered)
    response = torch.full((num, new), PAD, dtype=torch.int64)
    pos = torch.arange(new).unsqueeze(0)
    in_answer = pos < lengths.unsqueeze(1)
    response[:, :max_len] = torch.where(in_answer[:, :max_len], ordered, PAD)
    response[pos == lengths.unsqueeze(1)] = EOS
    tokens = torch.cat((prompts, response), dim=1)
    mask = torch.zeros(num, lp + new - 1, dtype=torch.bool)
    mask[:, lp - 1 :] = pos[:, :new] <= lengths.unsqueeze(1)
    return tokens, mask
