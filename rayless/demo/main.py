"""``rayless demo`` / ``scripts/rl_pipeline.py``: the RL pipeline on an embedded or joined cluster.

Without RAYLESS_ADDRESS in the environment it starts the embedded local cluster described by
the config (``cluster.num_nodes`` nodes, fake GPUs unless real ones suffice); under
``scripts/launch.py`` it joins the launched cluster instead, unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rayless.actors import ActorDiedError, Cluster, RaylessError, connect
from rayless.actors.api.context import ENV_ADDRESS
from rayless.demo.config import DEFAULT_CONFIG, PipelineConfig, load_config
from rayless.demo.pipeline import Pipeline
from rayless.demo.report import default_out_dir, print_progress, summary_text, write_report
from rayless.transport import loop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rayless demo``."""
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="pipeline YAML config")
    parser.add_argument("--iterations", type=int, default=None, help="override algo.iterations")
    parser.add_argument(
        "--mode", choices=["sync", "async"], default=None, help="override policy.rollout_mode"
    )
    parser.add_argument("--output-dir", default=None, help="where metrics.json/report.png go")
    parser.add_argument("--time-limit", type=float, default=None, help="override run.time_limit_s")


async def _main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.iterations is not None:
        cfg.algo.iterations = args.iterations
    if args.mode is not None:
        cfg.policy.rollout_mode = args.mode
    if args.time_limit is not None:
        cfg.run.time_limit_s = args.time_limit
    cfg.validate()
    out_dir = Path(args.output_dir) if args.output_dir else default_out_dir(cfg)
    if os.environ.get(ENV_ADDRESS):
        cluster = await connect()
        print(f"joined the cluster at {cluster.address}")
        return await _run(cfg, cluster, out_dir)
    fake = cfg.cluster.fake_gpus_per_node
    print(
        f"starting an embedded cluster: {cfg.cluster.num_nodes} nodes"
        + (f" x {fake} fake GPUs" if fake else ""),
        flush=True,
    )
    async with Cluster.local(nodes=cfg.cluster.num_nodes, gpus_per_node=fake) as cluster:
        return await _run(cfg, cluster, out_dir)


async def _run(cfg: PipelineConfig, cluster: Cluster, out_dir: Path) -> int:
    pipeline = Pipeline(cfg, cluster, on_iteration=print_progress)
    try:
        await pipeline.setup()
        print(
            f"placed {len(pipeline.placement)} workers in {pipeline.setup_s:.1f} s; "
            f"training ({cfg.policy.rollout_mode} mode)",
            flush=True,
        )
        result = await pipeline.run()
    except ActorDiedError as exc:
        print(f"\na worker died: {exc}", file=sys.stderr)
        return 1
    finally:
        await pipeline.aclose()
    print(summary_text(result))
    paths = write_report(result, out_dir, cfg)
    print("\nreport: " + ", ".join(str(p) for p in paths.values()))
    return 0 if result.solved else 2


def run(args: argparse.Namespace) -> int:
    """Entry point of ``rayless demo``; Ctrl-C stops the run and the cluster cleanly."""
    try:
        return loop.run(_main(args))
    except KeyboardInterrupt:
        print("\ninterrupted: the cluster was shut down", file=sys.stderr)
        return 130
    except (RaylessError, ValueError) as exc:
        print(f"rayless demo: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """``python scripts/rl_pipeline.py [options]``."""
    parser = argparse.ArgumentParser(prog="rl_pipeline", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
