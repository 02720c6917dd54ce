"""The GRPO demo's policy: a small decoder-only transformer, its KV-cached sampler, log-probs.

- :class:`TinyGPT` — token and learned position embeddings, ``n_layers`` pre-norm blocks
  (causal multi-head self-attention, GELU MLP), a final norm and an untied head. ``forward``
  takes an optional KV cache (one ``(k, v)`` pair per layer) and returns the logits with the
  grown cache, so generation feeds only the newest token after the prompt.
- :func:`generate` — ``G`` responses per prompt by temperature sampling until the stop token
  (or the budget), with the KV cache; returns the responses, their lengths and the log-probs
  of the sampled tokens.
- :func:`response_logprobs` — log-probs of given responses under a model (one forward over
  prompt + response), for the trainer's ratio and the reference worker.
- :func:`sft_step` — one supervised step on demonstrations (the warm start).

Log-probs are of the temperature-scaled distribution (``logits / temperature``) everywhere, so
the trainer's ratio compares the same distributions the rollout sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class ModelConfig:
    vocab_size: int = 13
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    max_seq: int = 32


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k = torch.cat((cache[0], k), dim=2)
            v = torch.cat((cache[1], v), dim=2)
        # a cached step attends to everything before it; a fresh sequence is causal
        att = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and t > 1)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        return x, (k, v)


class TinyGPT(nn.Module):
    """A decoder-only transformer; ``forward(tokens, cache)`` -> ``(logits, cache)``."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or ModelConfig()
        c = self.cfg
        self.tok = nn.Embedding(c.vocab_size, c.d_model)
        self.pos = nn.Embedding(c.max_seq, c.d_model)
        self.blocks = nn.ModuleList(Block(c.d_model, c.n_heads) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size)
        self.apply(_init)

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None
    ) -> tuple[torch.Tensor, KVCache]:
        start = 0 if cache is None else int(cache[0][0].shape[2])
        t = tokens.shape[1]
        if start + t > self.cfg.max_seq:
            raise ValueError(f"sequence of {start + t} tokens exceeds max_seq {self.cfg.max_seq}")
        pos = torch.arange(start, start + t, device=tokens.device)
        x = self.tok(tokens) + self.pos(pos)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            new_cache.append(kv)
        return self.head(self.ln_f(x)), new_cache


def _init(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    inner = getattr(module, "module", None)
    return inner if isinstance(inner, nn.Module) else module


@dataclass
class Generation:
    responses: torch.Tensor  # int64 [B, max_new], PAD after the stop token
    lengths: torch.Tensor  # int64 [B], tokens up to and including the stop token
    logprobs: torch.Tensor  # float32 [B, max_new], 0 after the response


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: torch.Tensor,
    *,
    max_new: int,
    temperature: float,
    eos: int,
    pad: int,
    generator: torch.Generator | None = None,
) -> Generation:
    """Sample one response per row of ``prompts`` (``[B, Lp]``, all the same length) with the
    KV cache: the prompt's forward fills it, then each step feeds only the newest token.
    Stops a row at ``eos``; stops early once every row has. ``temperature`` > 0."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b = prompts.shape[0]
    device = prompts.device
    out = torch.full((b, max_new), pad, dtype=torch.int64, device=device)
    logps = torch.zeros(b, max_new, device=device)
    lengths = torch.full((b,), max_new, dtype=torch.int64, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    logits, cache = model(prompts)
    for step in range(max_new):
        logp_all = torch.log_softmax(logits[:, -1].float() / temperature, dim=-1)
        token = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(1)
        token = torch.where(done, pad, token)
        out[:, step] = token
        logps[:, step] = torch.where(done, 0.0, logp_all.gather(1, token.unsqueeze(1)).squeeze(1))
        stopped = ~done & (token == eos)
        lengths = torch.where(stopped, step + 1, lengths)
        done = done | stopped
        if bool(done.all()) or step == max_new - 1:
            break
        logits, cache = model(token.unsqueeze(1), cache)
    return Generation(out, lengths, logps)


def response_logprobs(
    model: nn.Module, prompts: torch.Tensor, responses: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Log-probs ``[B, R]`` of each response token (``responses`` ``[B, R]``, padded) given its
    prompt and the tokens before it, at ``temperature``. Differentiable."""
    lp = prompts.shape[1]
    tokens = torch.cat((prompts, responses), dim=1)
    logits, _ = model(tokens[:, :-1])
    logits = logits[:, lp - 1 :].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def length_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, width]`` bool: True at the first ``lengths[b]`` positions of row ``b``."""
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def sft_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, mask: torch.Tensor
) -> float:
    """One cross-entropy step on demonstrations (``tokens`` ``[B, T]``; ``mask`` ``[B, T-1]``
    marks the positions whose next token is learned). Returns the loss."""
    logits, _ = model(tokens[:, :-1])
    loss_all = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none"
    ).view_as(mask)
    m = mask.to(loss_all.dtype)
    loss = (loss_all * m).sum() / m.sum().clamp(min=1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
