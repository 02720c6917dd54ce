"""The GRPO demo on a Hugging Face causal LM (``algo.model: hf``, ``rayless demo --config
grpo_hf``): a ``transformers`` Llama model built from a small config (random weights, tied
embeddings) and a ``tokenizers`` word-level tokenizer trained at start on the task's text,
wrapped as ``PreTrainedTokenizerFast`` with a chat template. Nothing is downloaded.

- :func:`train_tokenizer` — the tokenizer, the same in every process (its vocabulary is
  learned from a fixed corpus of the task's prompts and answers, then ordered).
- :class:`HfOps` — :class:`rayless.demo.grpo_policy.PolicyOps` for the HF model: prompts go
  through the chat template (left-padded), rollouts sample with ``model.generate`` (KV cache,
  temperature, the stop token ``<|im_end|>``, variable lengths), the trainer and the
  reference score with the same model class, rollout workers load new weights through
  ``WeightSync.pull(into=...)`` into the model's own loader (``load_state_dict(strict=False)``
  per bucket: where an inference engine's ``load_weights`` would stand).
- :func:`save_checkpoint` — ``save_pretrained`` of the policy and the tokenizer (what
  ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` load).

Imports transformers and tokenizers (the ``demo`` extra); the runtime never does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rayless.demo import grpo_task as task
from rayless.demo.grpo_model import Generation
from rayless.demo.grpo_policy import PolicyOps

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched from the hub, ever

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
INSTRUCTION = "sort"
# the chat template's tokens around a prompt's digits: <|im_start|> user sort ... <|im_end|>
# <|im_start|> assistant
TEMPLATE_TOKENS = 6


def task_corpus(num: int = 512, seed: int = 1234) -> list[str]:
    """The task's text: the chat's roles, prompts (``sort 3 1 4``) and answers (``1 3 4``)."""
    gen = torch.Generator().manual_seed(seed)
    prompts, _ = task.make_prompts(num, 1, 9, gen)
    out = ["user", "assistant"]
    for p in prompts:
        digits = task.prompt_digits(p)
        out.append(" ".join([INSTRUCTION, *map(str, digits)]))
        out.append(" ".join(map(str, sorted(digits))))
    return out


def train_tokenizer() -> Any:
    """A word-level tokenizer trained on :func:`task_corpus`, as ``PreTrainedTokenizerFast``
    with the chat template. Ids: the special tokens first, then the learned words in sorted
    order, so every process trains the same one."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, UNK, BOS, EOS]
    learner = Tokenizer(models.WordLevel(unk_token=UNK))
    learner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    learner.train_from_iterator(task_corpus(), trainers.WordLevelTrainer(special_tokens=specials))
    words = sorted(w for w in learner.get_vocab() if w not in specials)
    vocab = {w: i for i, w in enumerate([*specials, *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(algo: Any, tokenizer: Any) -> Any:
    """The policy's ``LlamaConfig``: ``algo.d_model`` wide, ``algo.n_layers`` deep, tied
    embeddings, the tokenizer's vocabulary and special ids."""
    from transformers import LlamaConfig

    seq = TEMPLATE_TOKENS + algo.max_len + task.max_new_tokens(algo.max_len)
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=algo.d_model,
        intermediate_size=4 * algo.d_model,
        num_hidden_layers=algo.n_layers,
        num_attention_heads=algo.n_heads,
        num_key_value_heads=max(1, algo.n_heads // 2),
        max_position_embeddings=max(64, seq),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


class HfOps(PolicyOps):
    """:class:`PolicyOps` for a ``transformers`` causal LM and its trained tokenizer."""

    kind = "hf"

    def __init__(self, algo: Any) -> None:
        super().__init__(algo)
        self.tokenizer = train_tokenizer()
        self.pad = int(self.tokenizer.pad_token_id)
        self.eos = int(self.tokenizer.eos_token_id)
        vocab = self.tokenizer.get_vocab()
        # task id -> token id (a response's digits, its stop token, padding)
        lut = torch.full((task.VOCAB_SIZE,), vocab[UNK], dtype=torch.int64)
        for d in range(task.NUM_DIGITS):
            lut[d] = vocab[str(d)]
        lut[task.EOS], lut[task.PAD] = self.eos, self.pad
        self.to_token = lut
        # token id -> task id (anything but a digit or the stop token is a wrong token: SEP)
        back = torch.full((len(self.tokenizer),), task.SEP, dtype=torch.int64)
        back[lut[: task.NUM_DIGITS]] = torch.arange(task.NUM_DIGITS)
        back[self.eos], back[self.pad] = task.EOS, task.PAD
        self.to_task = back
        self.loads = 0  # buckets loaded through pull(into=...)

    def build(self) -> nn.Module:
        """A fresh ``LlamaForCausalLM`` (random weights; the warm start trains them)."""
        from transformers import LlamaForCausalLM

        return LlamaForCausalLM(model_config(self.algo, self.tokenizer))

    def prompts(self, task_prompts: torch.Tensor) -> torch.Tensor:
        """Each prompt's digits as ``sort d d d`` through the chat template, left-padded to
        one length (``TEMPLATE_TOKENS + max_len``)."""
        chats = [
            [{"role": "user", "content": " ".join([INSTRUCTION, *map(str, task.prompt_digits(p))])}]
            for p in task_prompts
        ]
        texts = self.tokenizer.apply_chat_template(
            chats, add_generation_prompt=True, tokenize=False
        )
        enc = self.tokenizer(
            texts,
            padding="max_length",
            max_length=TEMPLATE_TOKENS + self.algo.max_len,
            return_tensors="pt",
            add_special_tokens=False,
        )
        return enc["input_ids"].to(torch.int64)

    def task_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids as task ids (digits, the stop token; any other token counts wrong)."""
        return self.to_task[tokens.cpu().clamp(0, len(self.to_task) - 1)]

    def generate(
        self,
        model: nn.Module,
        prompts: torch.Tensor,
        *,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Generation:
        """``model.generate``: temperature sampling (no top-k/top-p), KV cache, stops at
        ``<|im_end|>``; the sampled tokens' log-probs from the step logits. ``generate`` draws
        from torch's global generator (``generator`` is not used)."""
        from transformers import GenerationConfig

        max_new = task.max_new_tokens(self.algo.max_len)
        config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            eos_token_id=self.eos,
            pad_token_id=self.pad,
            use_cache=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with torch.no_grad():
            out = model.generate(  # type: ignore[operator]
                input_ids=prompts, attention_mask=(prompts != self.pad).long(),
                generation_config=config,
            )  # fmt: skip
        b, lp = prompts.shape
        new = out.sequences[:, lp:]
        steps = new.shape[1]
        logits = torch.stack(out.logits, dim=1).float() / temperature
        logps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        responses = torch.full((b, max_new), self.pad, dtype=torch.int64, device=prompts.device)
        stop = new == self.eos
        first = torch.where(stop.any(1), stop.int().argmax(1) + 1, max_new)
        keep = torch.arange(steps, device=prompts.device).unsqueeze(0) < first.unsqueeze(1)
        responses[:, :steps] = torch.where(keep, new, self.pad)
        lp_out = torch.zeros(b, max_new, device=prompts.device)
        lp_out[:, :steps] = torch.where(keep, logps, 0.0)
        return Generation(responses, first.to(torch.int64), lp_out)

    def logprobs(
        self, model: nn.Module, prompts: torch.Tensor, responses: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """Log-probs ``[B, R]`` of the response tokens under ``model`` (a forward over prompt
        and response with the prompt's padding masked and ``generate``'s position ids)."""
        lp = prompts.shape[1]
        tokens = torch.cat((prompts, responses), dim=1)
        mask = torch.cat((prompts != self.pad, torch.ones_like(responses, dtype=torch.bool)), 1)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        out = model(
            input_ids=tokens[:, :-1],
            attention_mask=mask[:, :-1].long(),
            position_ids=positions[:, :-1],
            use_cache=False,
        )
        logits = out.logits[:, lp - 1 :].float() / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    def sft_step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        tokens: torch.Tensor,
        mask: torch.Tensor,
    ) -> float:
        """One cross-entropy step on the demonstrations: their prompts through the chat
        template, their answers' tokens and stop token learned."""
        lp = task.prompt_length(self.algo.max_len)
        prompts = self.prompts(tokens[:, :lp].cpu()).to(tokens.device)
        responses = self.to_token.to(tokens.device)[tokens[:, lp:]]
        learn = mask[:, lp - 1 :].to(torch.float32)
        logp = self.logprobs(model, prompts, responses, 1.0)
        loss = -(logp * learn).sum() / learn.sum().clamp(min=1.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    def pull_target(self, model: nn.Module) -> dict[str, Any]:
        """Pull through the model's own loader, bucket by bucket, in fp32 (whatever the wire
        carries): ``pull(into=..., dtype=torch.float32)``."""

        def load_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            missing = model.load_state_dict(dict(weights), strict=False).unexpected_keys
            if missing:
                raise KeyError(f"the model has no tensors {missing}")
            self.loads += 1

        return {"into": load_weights, "dtype": torch.float32}


def save_checkpoint(model: nn.Module, tokenizer: Any, path: str | Path) -> Path:
    """``save_pretrained`` of ``model`` and ``tokenizer`` into ``path`` (safetensors)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)  # type: ignore[operator]
    tokenizer.save_pretrained(path)
    return path
