"""The GRPO demo's Hugging Face policy (rayless.demo.grpo_hf): the trained tokenizer, generate's
log-probs against the trainer's, the warm start's step, the weights' wire cast."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the demo extra (transformers) is not installed")

from rayless.demo import grpo_task as task
from rayless.demo.grpo_config import GrpoAlgoConfig
from rayless.demo.grpo_hf import HfOps, train_tokenizer
from rayless.demo.grpo_trainer import cast_floats


@pytest.fixture(scope="module")
def ops() -> HfOps:
    return HfOps(GrpoAlgoConfig(model="hf", d_model=32, n_heads=4))


def test_the_tokenizer_is_trained_the_same_every_time_and_speaks_the_chat_template() -> None:
    a, b = train_tokenizer(), train_tokenizer()
    assert a.get_vocab() == b.get_vocab()
    assert {str(d) for d in range(10)} | {"sort", "user", "assistant"} <= set(a.get_vocab())
    text = a.apply_chat_template(
        [{"role": "user", "content": "sort 3 1 2"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nsort 3 1 2<|im_end|>\n<|im_start|>assistant\n"
    ids = a(text + "1 2 3<|im_end|>", add_special_tokens=False)["input_ids"]
    assert a.unk_token_id not in ids
    assert a.decode(ids[-4:]) == "1 2 3 <|im_end|>"


def test_prompts_go_through_the_template_and_rewards_read_the_tokens_back(ops: HfOps) -> None:
    gen = torch.Generator().manual_seed(0)
    task_prompts, _ = task.make_prompts(4, 2, 6, gen)
    prompts = ops.prompts(task_prompts)
    assert prompts.shape == (4, 6 + 6)  # template tokens + max_len digits, left-padded
    assert (prompts[:, -1] == ops.tokenizer.convert_tokens_to_ids("assistant")).all()
    answer = torch.tensor([task.answer(p) for p in task_prompts[:1]])
    tokens = ops.to_token[answer]
    assert ops.tokenizer.decode(tokens[0]).endswith("<|im_end|>")
    assert task.sort_reward(task_prompts[0], ops.task_ids(tokens[0])) == 1.0
    # the prompt's digits survive the round trip (what the reward worker reads)
    assert task.prompt_digits(ops.task_ids(prompts[0])) == task.prompt_digits(task_prompts[0])


def test_generate_samples_to_the_stop_token_with_the_trainers_log_probs(ops: HfOps) -> None:
    torch.manual_seed(0)
    model = ops.build().eval()
    task_prompts, _ = task.make_prompts(16, 2, 6, torch.Generator().manual_seed(1))
    prompts = ops.prompts(task_prompts)
    g = ops.generate(model, prompts, temperature=1.0, generator=None)
    assert g.responses.shape == (16, task.max_new_tokens(6))
    for row, n in zip(g.responses, g.lengths.tolist(), strict=True):
        assert (row[n:] == ops.pad).all()  # padding after the response
        stops = (row[:n] == ops.eos).nonzero().flatten().tolist()
        assert stops in ([n - 1], [])  # the stop token ends it, or the budget did
    with torch.no_grad():
        again = ops.logprobs(model, prompts, g.responses, 1.0)
    mask = torch.arange(g.responses.shape[1]) < g.lengths.unsqueeze(1)
    assert torch.allclose(again[mask], g.logprobs[mask], atol=1e-4)
    assert (g.logprobs[~mask] == 0).all()


@pytest.mark.slow
def test_the_warm_start_step_lowers_the_demonstrations_loss(ops: HfOps) -> None:
    torch.manual_seed(0)
    model = ops.build()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(2)
    tokens, mask = task.sft_batch(32, 2, 6, 0.0, gen)
    first = ops.sft_step(model, opt, tokens, mask)
    for _ in range(30):
        last = ops.sft_step(model, opt, tokens, mask)
    assert last < first * 0.7, (first, last)


def test_the_wire_cast_keeps_tied_weights_one_tensor(ops: HfOps) -> None:
    model = ops.build()
    state = cast_floats(model.state_dict(), torch.bfloat16)
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert state["lm_head.weight"].dtype == torch.bfloat16
