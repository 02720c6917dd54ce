"""Single-process PPO on VecCartPole: return per iteration and time to the target return.

Runs the loop the distributed pipeline splits across workers (collect, GAE, PPO update) in
one process on one thread, for the ``algo:`` section of a config plus overrides::

    python scripts/tune_ppo.py --seeds 0 1 2
    python scripts/tune_ppo.py --config rayless/configs/default.yaml --set lr=0.001 epochs=8
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import torch
import yaml

from rayless.demo.config import DEFAULT_CONFIG, load_config
from rayless.demo.rollout import train_single_process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="algo overrides")
    parser.add_argument(
        "--env-workers",
        type=int,
        default=None,
        help="multiply num_envs by this (default: the env workers of the config)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--quiet", action="store_true", help="print only the per-seed summary")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    algo = dataclasses.replace(cfg.algo, **overrides)
    workers = args.env_workers or sum(w.count for w in cfg.cluster.env_worker)
    print(f"algo: {dataclasses.asdict(algo)}  env workers: {workers}", flush=True)

    times = []
    for seed in args.seeds:

        def log(row: dict[str, float], seed: int = seed) -> None:
            if not args.quiet:
                print(
                    f"seed {seed} it {int(row['iteration']):4d} steps {int(row['env_steps']):7d} "
                    f"t {row['seconds']:6.2f}s return {row['mean_return']:6.1f} "
                    f"kl {row['approx_kl']:.4f} ent {row['entropy']:.3f}",
                    flush=True,
                )

        res = train_single_process(
            algo, seed=seed, num_env_workers=workers, time_limit_s=args.time_limit, log=log
        )
        status = f"{res.time_to_target_s:.2f}s" if res.solved else "NOT SOLVED"
        print(
            f"seed {seed}: target {algo.target_return} -> {status} after {res.iterations} "
            f"iterations, {res.env_steps} env steps",
            flush=True,
        )
        if res.time_to_target_s is not None:
            times.append(res.time_to_target_s)
    if times:
        print(
            f"solved {len(times)}/{len(args.seeds)}; time to target: mean "
            f"{statistics.mean(times):.2f}s, max {max(times):.2f}s"
        )
    return 0 if len(times) == len(args.seeds) else 1


if __name__ == "__main__":
    sys.exit(main())
