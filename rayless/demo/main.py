"""``rayless demo`` / ``scripts/rl_pipeline.py``: the RL pipeline on an embedded or joined cluster.

Without RAYLESS_ADDRESS in the environment it starts the embedded local cluster described by
the config (``cluster.num_nodes`` nodes, fake GPUs unless real ones suffice); under
``scripts/launch.py`` it joins the launched cluster instead, unchanged.

``--config`` takes a YAML path or the name of a shipped config (``default``, ``gpu_8``,
``grpo``, ``grpo_gpu``, ``grpo_hf``: ``rayless/configs/NAME.yaml``). A config whose
``cluster`` names ``rollout_worker`` runs the GRPO demo (:mod:`rayless.demo.grpo_pipeline`),
any other the PPO demo (:mod:`rayless.demo.pipeline`); both exit 0 when solved, 2 when not,
1 on a bad config or a dead worker (named), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rayless.actors import ActorDiedError, Cluster, RaylessError, connect
from rayless.actors.ext import ENV_ADDRESS, timeline
from rayless.demo.config import DEFAULT_CONFIG, load_config
from rayless.demo.grpo_config import CONFIG_DIR, GrpoConfig, is_grpo_config, load_grpo_config
from rayless.transport import loop

# The pipelines and reports import torch and tensordict (seconds on a loaded machine): they are
# imported once the config is valid, so a bad config is reported at once.


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``rayless demo``."""
    parser.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG),
        help="pipeline YAML config: a path, or a shipped config's name (default, gpu_8, grpo, ...)",
    )
    parser.add_argument("--iterations", type=int, default=None, help="override algo.iterations")
    parser.add_argument(
        "--mode", choices=["sync", "async"], default=None, help="override policy.rollout_mode"
    )
    parser.add_argument("--output-dir", default=None, help="where metrics.json/report.png go")
    parser.add_argument("--time-limit", type=float, default=None, help="override run.time_limit_s")
    parser.add_argument(
        "--api",
        choices=["rayless", "ray"],
        default="rayless",
        help="ray: the PPO demo written against Ray's API only (from rayless import ray)",
    )


def resolve_config(name: str) -> Path:
    """``name`` as a path if it exists (or looks like one), else the shipped
    ``rayless/configs/NAME.yaml``. Raises ValueError for an unknown name."""
    path = Path(name)
    if path.exists() or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path
    shipped = CONFIG_DIR / f"{name}.yaml"
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise ValueError(f"no config file {name!r} and no shipped config of that name ({known})")


async def _main(args: argparse.Namespace) -> int:
    path = resolve_config(args.config)
    cfg: Any = load_grpo_config(path) if is_grpo_config(path) else load_config(path)
    if args.iterations is not None:
        cfg.algo.iterations = args.iterations
    if args.mode is not None:
        cfg.policy.rollout_mode = args.mode
    if args.time_limit is not None:
        cfg.run.time_limit_s = args.time_limit
    cfg.validate()
    if isinstance(cfg, GrpoConfig) and cfg.algo.model == "hf":
        # the demo extra's HF packages, before any cluster starts (a missing one: the CLI's
        # hint names the extra); never the hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    from rayless.demo.report import default_out_dir

    out_dir = Path(args.output_dir) if args.output_dir else default_out_dir(cfg)
    if os.environ.get(ENV_ADDRESS):
        cluster = await connect()
        print(f"joined the cluster at {cluster.address}")
        return await _run(cfg, cluster, out_dir)
    # the demo records its timeline (timeline.json beside report.png) unless told not to
    # (RAYLESS_TIMELINE=0), as every process does
    fake = cfg.cluster.fake_gpus_per_node
    print(
        f"starting an embedded cluster: {cfg.cluster.num_nodes} nodes"
        + (f" x {fake} fake GPUs" if fake else ""),
        flush=True,
    )
    async with Cluster.local(nodes=cfg.cluster.num_nodes, gpus_per_node=fake) as cluster:
        return await _run(cfg, cluster, out_dir)


async def _run(cfg: Any, cluster: Cluster, out_dir: Path) -> int:
    if isinstance(cfg, GrpoConfig):
        return await _run_grpo(cfg, cluster, out_dir)
    from rayless.demo.pipeline import Pipeline
    from rayless.demo.report import print_progress, summary_text, write_report

    pipeline = Pipeline(cfg, cluster, on_iteration=print_progress)

    def started() -> str:
        return (
            f"placed {len(pipeline.placement)} workers in {pipeline.setup_s:.1f} s; "
            f"training ({cfg.policy.rollout_mode} mode)"
        )

    return await _drive(pipeline, None, started, summary_text, write_report, cfg, out_dir, cluster)


async def _run_grpo(cfg: GrpoConfig, cluster: Cluster, out_dir: Path) -> int:
    from rayless.demo.grpo_pipeline import GrpoPipeline
    from rayless.demo.grpo_report import grpo_summary_text, print_grpo_progress, write_grpo_report

    checkpoint = out_dir / "hf_policy" if cfg.algo.model == "hf" else None
    pipeline = GrpoPipeline(
        cfg, cluster, on_iteration=print_grpo_progress, checkpoint_dir=checkpoint
    )

    def started() -> str:
        return (
            f"placed {len(pipeline.placement)} workers in {pipeline.setup_s:.1f} s; warm start "
            f"{pipeline.warm_start_s:.1f} s: held-out mean reward {pipeline.warm_reward:.3f}; "
            f"GRPO ({cfg.policy.rollout_mode} mode)"
        )

    first = "planning, spawning, warm start (supervised) ..."
    return await _drive(
        pipeline, first, started, grpo_summary_text, write_grpo_report, cfg, out_dir, cluster
    )


async def _drive(
    pipeline: Any,
    first: str | None,
    started: Callable[[], str],
    summary: Callable[[Any], str],
    write: Callable[[Any, Path, Any], dict[str, Path]],
    cfg: Any,
    out_dir: Path,
    cluster: Cluster,
) -> int:
    """Set up and run either demo's pipeline, always closing it; print the summary and write
    the report (and timeline.json, gathered before the workers stop, when the cluster
    records one). Exit codes: 0 solved, 2 not solved, 1 a worker died (named)."""
    trace: Path | None = None
    try:
        if first:
            print(first, flush=True)
        await pipeline.setup()
        print(started(), flush=True)
        result = await pipeline.run()
        trace = await _write_timeline(cluster, out_dir)
    except ActorDiedError as exc:
        print(f"\na worker died: {exc}", file=sys.stderr)
        return 1
    finally:
        await pipeline.aclose()
    print(summary(result))
    paths = write(result, out_dir, cfg)
    if trace is not None:
        paths["timeline"] = trace
    print("\nreport: " + ", ".join(str(p) for p in paths.values()))
    return 0 if result.solved else 2


async def _write_timeline(cluster: Cluster, out_dir: Path) -> Path | None:
    """Write ``out_dir/timeline.json`` when this process records a timeline; a failure is
    reported, never fatal."""
    if not timeline.enabled():
        return None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        return Path(await cluster.timeline(out_dir / "timeline.json"))
    except (RaylessError, OSError) as exc:
        print(f"rayless demo: no timeline.json ({type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def _run_ray_api(args: argparse.Namespace) -> int:
    """``--api ray``: the PPO demo on ``rayless.ray`` (:mod:`rayless.demo.ray_ppo`)."""
    path = resolve_config(args.config)
    if is_grpo_config(path):
        raise ValueError("--api ray runs the PPO demo only (a PPO config, e.g. default)")
    cfg = load_config(path)
    if args.iterations is not None:
        cfg.algo.iterations = args.iterations
    if args.time_limit is not None:
        cfg.run.time_limit_s = args.time_limit
    cfg.validate()
    from rayless.demo import ray_ppo

    print("PPO on Ray's API (from rayless import ray)", flush=True)
    result = ray_ppo.run(cfg, log=lambda line: print(line, flush=True))
    outcome = "solved" if result["solved"] else "not solved"
    print(
        f"{outcome}: mean return {result['final_return']:.1f} after {result['iterations']} "
        f"iterations, {result['seconds']:.1f} s"
    )
    return 0 if result["solved"] else 2


def run(args: argparse.Namespace) -> int:
    """Entry point of ``rayless demo``; Ctrl-C stops the run and the cluster cleanly."""
    try:
        if getattr(args, "api", "rayless") == "ray":
            return _run_ray_api(args)
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
