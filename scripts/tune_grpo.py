"""Single-process GRPO on the sorting task: held-out reward per evaluation, per seed.

Runs what the GRPO demo splits across actors (warm start, sampling, reward, reference,
GRPO step) in one process on one thread, for the ``algo:`` section of a config plus
overrides, so the task and hyper-parameters can be tuned without a cluster::

    python scripts/tune_grpo.py --seeds 0 1
    python scripts/tune_grpo.py --set sft_noise=0.7 lr=0.001 --iterations 150
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
import yaml

from rayless.demo.grpo_algo import train_single_process
from rayless.demo.grpo_config import GRPO_CONFIG, load_grpo_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(GRPO_CONFIG))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="algo overrides")
    parser.add_argument("--iterations", type=int, default=100)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    cfg = load_grpo_config(args.config)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    algo = dataclasses.replace(cfg.algo, **overrides)
    # one step here trains on what one iteration of the demo produces (all rollout workers)
    prompts = cfg.cluster.rollout_worker.count * algo.prompts_per_rollout
    print(f"algo: {dataclasses.asdict(algo)}  prompts per step: {prompts}", flush=True)
    for seed in args.seeds:
        rows = train_single_process(
            algo, seed=seed, iterations=args.iterations, prompts_per_step=prompts
        )
        curve = [(int(r["iteration"]), r["eval_reward"]) for r in rows if "eval_reward" in r]
        warm, last = curve[0][1], curve[-1][1]
        hit = next((i for i, r in curve if r >= algo.target_reward), None)
        print(
            f"seed {seed}: held-out {warm:.3f} -> {last:.3f} after {curve[-1][0]} steps "
            f"({rows[-1]['s']:.1f} s); target {algo.target_reward:g} "
            + (f"at step {hit}" if hit is not None else "not reached"),
            flush=True,
        )
        print("  " + " ".join(f"{i}:{r:.2f}" for i, r in curve), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
