"""The end-to-end RL demo: vectorised CartPole, PPO, the pipeline config.

The modules here import only torch, tensordict, numpy, yaml and the standard library, so
that they can be tested (and tuned) without the runtime:

- :mod:`rayless.demo.env`: :class:`~rayless.demo.env.VecCartPole`, many CartPole-v1
  environments stepped as one batch of tensors, with auto-reset and episode statistics.
- :mod:`rayless.demo.ppo`: the actor-critic policy, action sampling, GAE and the PPO update;
  policy weights as a flat, versioned dict of tensors.
- :mod:`rayless.demo.rollout`: the transition TensorDict that the pipeline pushes through the
  store, advantages computed from it, and the single-process training loop.
- :mod:`rayless.demo.config`: the pipeline configuration (dataclasses, YAML, validation).

The GRPO demo (``rayless demo --config grpo``), in the same split:

- :mod:`rayless.demo.grpo_task`: the sorting task, its reward, the noisy demonstrations.
- :mod:`rayless.demo.grpo_model`: the small decoder-only transformer, KV-cached sampling.
- :mod:`rayless.demo.grpo_policy`: how every stage builds, samples, scores and warm-starts
  its policy (``algo.model``); :mod:`rayless.demo.grpo_hf` does it for a Hugging Face causal
  LM with a tokenizer trained at start (``--config grpo_hf``; imports transformers).
- :mod:`rayless.demo.grpo_algo`: advantages, the GRPO loss and step, the warm start, a
  single-process loop.
- :mod:`rayless.demo.grpo_config`: its configuration (GRPO's workers and keys).
- :mod:`rayless.demo.grpo_workers`, :mod:`rayless.demo.grpo_pipeline`,
  :mod:`rayless.demo.grpo_report`: the actors, the driver and the report (these use the
  runtime).
"""
