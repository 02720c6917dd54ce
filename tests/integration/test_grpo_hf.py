"""``rayless demo --config grpo_hf``, shortened: the pipeline runs on a transformers causal LM,
rollout workers load weights through ``WeightSync.pull(into=...)``, and the run folder holds a
checkpoint that ``AutoModelForCausalLM.from_pretrained`` loads back and samples from. (The
learning run itself, <= 5 min, is the demo's figures in the README, not a suite test.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the demo extra (transformers) is not installed")

from rayless.demo.grpo_config import GRPO_CONFIG, load_grpo_config

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]
TRAINING = pytest.mark.xdist_group("training")  # CPU-bound: beside the other demo runs


@TRAINING
def test_grpo_hf_runs_loads_through_the_engine_path_and_saves_a_loadable_model(
    tmp_path: Path,
) -> None:
    import yaml
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shipped = load_grpo_config(GRPO_CONFIG.with_name("grpo_hf.yaml")).to_dict()
    assert shipped["algo"]["model"] == "hf"
    shipped["algo"].update(
        sft_steps=10, eval_prompts=16, eval_interval=2, target_reward=1.0, n_layers=2,
        prompts_per_rollout=4,
    )  # fmt: skip
    # one worker of each kind but the 2 DDP ranks: each worker imports transformers itself
    for kind in ("rollout_worker", "reward_worker"):
        shipped["cluster"][kind]["worker_num"] = 1
    config = tmp_path / "short.yaml"
    config.write_text(yaml.safe_dump(shipped))
    out_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "rayless.cli", "demo", "--config", str(config),
         "--iterations", "2", "--output-dir", str(out_dir)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]  # ran, not solved
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert len(metrics["iterations"]) == 2
    assert (out_dir / "report.png").stat().st_size > 0
    # the rollout worker pulled versions 0, 1 and 2 through its model's loader
    assert metrics["totals"]["loaded_buckets"] >= 3
    assert metrics["totals"]["trained"] == 2 * load_grpo_config(config).responses_per_iteration

    checkpoint = Path(metrics["checkpoint"])
    assert checkpoint == out_dir / "hf_policy"
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "sort 3 1 2"}], add_generation_prompt=True, tokenize=False
    )
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    assert tokenizer.unk_token_id not in enc["input_ids"][0].tolist()
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=8, do_sample=True, top_k=0)
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert tokenizer.unk_token not in tokenizer.decode(out[0])
