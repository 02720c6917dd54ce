"""The GRPO demo's configuration: the PPO demo's YAML shape with GRPO's workers and keys.

:func:`load_grpo_config` reads a YAML file, :func:`grpo_config_from_dict` a parsed mapping;
both return a validated :class:`GrpoConfig` or raise ``ValueError`` naming the key. The
sections ``placement``, ``resource_pool``, ``policy``, ``buffer`` and ``run`` are the PPO
demo's (see :mod:`rayless.demo.config`); ``cluster`` names GRPO's workers and ``algo`` holds
GRPO's keys. Shipped: ``rayless/configs/grpo.yaml`` (embedded 2-node cluster, fake GPUs, CPU)
and ``rayless/configs/grpo_gpu.yaml`` (one real GPU).

Config reference (what differs from the PPO demo)
-------------------------------------------------

``cluster:`` — GRPO's workers, each ``{worker_num, num_gpus, num_cpus, node_list}``, and the
planner's component each is placed as::

    cluster:
      num_nodes: 2
      embedded: true
      fake_gpus_per_node: 2
      rollout_worker:   {worker_num: 2, num_gpus: 1, num_cpus: 0.25}  # planner: eval
      reward_worker:    {worker_num: 2, num_gpus: 0, num_cpus: 0.25}  # planner: env group 0
      reference_worker: {worker_num: 1, num_gpus: 0, num_cpus: 0.25}  # planner: env group 1
      train_worker:     {worker_num: 2, num_gpus: 1, num_cpus: 0.25}  # planner: train (DDP)
      buffer_worker:    {worker_num: auto, num_gpus: 0, num_cpus: 0.25}  # store shards

So a manual ``resource_pool`` names them ``eval``, ``env`` and ``train``, as in the PPO demo;
``placement.env_strategy: device-colocate`` puts reward and reference workers on the rollout
workers' GPUs. ``reference_worker.worker_num`` must be 1 (one frozen copy of the warm start).

``policy.router_type`` routes each rollout worker's groups to a reward worker:
``node_affinity`` prefers a reward worker on the rollout worker's node; ``policy.rollout_mode``
``sync`` has every rollout use the newest weights, ``async`` lets rollouts run up to
``algo.max_staleness`` policy versions ahead of training.

``buffer.node_affinity_env`` makes rollout workers write to a store shard on their own node.

``algo:`` — the task, the policy, the warm start and GRPO::

    algo:
      group_size: 8            # G: responses sampled per prompt
      prompts_per_rollout: 8   # prompts per rollout worker per iteration
      min_len: 2               # prompts hold min_len..max_len digits to sort
      max_len: 6
      temperature: 1.0         # sampling temperature (also of every log-prob)
      iterations: 300          # upper bound on GRPO iterations (one optimiser pass each)
      target_reward: 0.85      # SOLVED once the held-out mean reward reaches this
      eval_prompts: 128        # held-out prompts (never trained on), one sample each
      eval_interval: 5         # evaluate every this many iterations (and before the first)
      lr: 0.002                # Adam
      epochs: 1                # optimiser steps per batch (> 1: the clip matters)
      clip_coef: 0.2           # PPO-style ratio clip
      kl_coef: 0.02            # beta of the KL(pi || reference) term
      max_grad_norm: 1.0
      max_staleness: 1         # async only: versions a rollout may lag behind training
      sampler: grouped         # trainer fetch: grouped (whole groups) or seqlen_balanced
                               #   (whole groups, ranks balanced in tokens)
      d_model: 64              # the transformer: width, layers, heads
      n_layers: 2
      n_heads: 4
      sft_steps: 1200          # warm start: supervised steps at the start of the run
      sft_batch_size: 64       # demonstrations per step (all ranks together)
      sft_lr: 0.003
      sft_noise: 0.75          # share of the demonstrations' digits replaced at random
      model: tiny              # tiny: the demo's own transformer; hf: a transformers Llama
                               #   causal LM and a trained tokenizer (rayless.demo.grpo_hf)
      wire_dtype: float32      # what the trainer publishes (bfloat16: half the bytes; the
                               #   rollout workers load fp32 either way)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from rayless.demo.config import (
    AlgoConfig,
    BufferConfig,
    ClusterConfig,
    PipelineConfig,
    PlacementConfig,
    PolicyConfig,
    ResourcePoolConfig,
    RunConfig,
    WorkerConfig,
    build_pools,
)
from rayless.demo.config_sections import build_section, check_choice, check_positive

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GRPO_CONFIG = CONFIG_DIR / "grpo.yaml"


@dataclasses.dataclass
class GrpoClusterConfig:
    num_nodes: int = 1
    embedded: bool = True
    fake_gpus_per_node: int = 0
    cpus_per_node: int | None = None
    rollout_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)
    reward_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)
    reference_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)
    train_worker: WorkerConfig = dataclasses.field(default_factory=lambda: WorkerConfig(2))
    buffer_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)


@dataclasses.dataclass
class GrpoAlgoConfig:
    """GRPO hyper-parameters, the task's shape and the warm start (tuned for this task)."""

    group_size: int = 8
    prompts_per_rollout: int = 8
    min_len: int = 2
    max_len: int = 6
    temperature: float = 1.0
    iterations: int = 300
    target_reward: float = 0.85
    eval_prompts: int = 128
    eval_interval: int = 5
    lr: float = 2e-3
    epochs: int = 1
    clip_coef: float = 0.2
    kl_coef: float = 0.02
    max_grad_norm: float = 1.0
    max_staleness: int = 1
    sampler: str = "grouped"
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    sft_steps: int = 1200
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    sft_noise: float = 0.75
    model: str = "tiny"
    wire_dtype: str = "float32"


@dataclasses.dataclass
class GrpoConfig:
    cluster: GrpoClusterConfig = dataclasses.field(default_factory=GrpoClusterConfig)
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    resource_pool: list[ResourcePoolConfig] | None = None
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    algo: GrpoAlgoConfig = dataclasses.field(default_factory=GrpoAlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(output_dir="runs"))

    def planning(self) -> PipelineConfig:
        """The same cluster in the planner's components (rollout -> eval, reward and
        reference -> env groups 0 and 1), for :func:`rayless.demo.pipeline.plan`."""
        c = self.cluster
        cluster = ClusterConfig(
            num_nodes=c.num_nodes,
            embedded=c.embedded,
            fake_gpus_per_node=c.fake_gpus_per_node,
            cpus_per_node=c.cpus_per_node,
            env_worker=[c.reward_worker, c.reference_worker],
            eval_worker=c.rollout_worker,
            train_worker=c.train_worker,
            buffer_worker=c.buffer_worker,
        )
        return PipelineConfig(
            cluster=cluster,
            placement=self.placement,
            resource_pool=self.resource_pool,
            policy=self.policy,
            buffer=self.buffer,
            algo=AlgoConfig(num_minibatches=1),
            run=self.run,
        )

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping that :func:`grpo_config_from_dict` turns back into this config."""
        out = dataclasses.asdict(self)
        if self.resource_pool is not None:
            out["resource_pool"] = self.planning().to_dict()["resource_pool"]
        return out

    @property
    def responses_per_iteration(self) -> int:
        """Samples one iteration produces and trains on (all rollout workers)."""
        a = self.algo
        return self.cluster.rollout_worker.count * a.prompts_per_rollout * a.group_size

    def validate(self) -> None:
        """Check values and cross-section consistency; raise ``ValueError`` if wrong."""
        _validate(self)


def grpo_config_from_dict(data: Any) -> GrpoConfig:
    """A validated :class:`GrpoConfig` from a parsed YAML mapping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config: expected a mapping at the top level, got {data!r}")
    data = dict(data)
    pools = data.pop("resource_pool", None)
    cfg = build_section(GrpoConfig, "config", data)
    cfg.resource_pool = build_pools(pools)
    cfg.validate()
    return cfg


def load_grpo_config(path: str | Path = GRPO_CONFIG) -> GrpoConfig:
    """Read and validate a GRPO YAML config file (the shipped ``grpo.yaml`` by default)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"config {path} is not valid YAML: {exc}") from exc
    try:
        return grpo_config_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


GRPO_WORKERS = ("rollout_worker", "reward_worker", "reference_worker")


def is_grpo_config(path: str | Path) -> bool:
    """True if the YAML at ``path`` describes the GRPO demo: its cluster names one of GRPO's
    workers, or its algo section GRPO's ``group_size``. Unreadable files are not (the PPO
    loader reports them)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    if not isinstance(data, dict):
        return False
    cluster, algo = data.get("cluster"), data.get("algo")
    if isinstance(cluster, dict) and any(k in cluster for k in GRPO_WORKERS):
        return True
    return isinstance(algo, dict) and "group_size" in algo


def _validate(cfg: GrpoConfig) -> None:
    c, a = cfg.cluster, cfg.algo
    for name in ("rollout_worker", "reward_worker", "reference_worker", "train_worker"):
        w: WorkerConfig = getattr(c, name)
        if not isinstance(w.worker_num, int):
            raise ValueError(
                f"cluster.{name}.worker_num: expected an integer, got {w.worker_num!r}"
            )
    if c.reference_worker.count != 1:
        raise ValueError(
            f"cluster.reference_worker.worker_num: must be 1, got {c.reference_worker.count}"
        )
    try:
        cfg.planning().validate()
    except ValueError as exc:  # name GRPO's workers, not the planner's components
        msg = str(exc)
        for old, new in (
            ("cluster.env_worker[0]", "cluster.reward_worker"),
            ("cluster.env_worker[1]", "cluster.reference_worker"),
            ("cluster.eval_worker", "cluster.rollout_worker"),
        ):
            msg = msg.replace(old, new)
        raise ValueError(msg) from exc
    for name in (
        "group_size",
        "prompts_per_rollout",
        "min_len",
        "max_len",
        "iterations",
        "eval_prompts",
        "eval_interval",
        "epochs",
        "d_model",
        "n_layers",
        "n_heads",
        "sft_batch_size",
    ):
        check_positive(f"algo.{name}", getattr(a, name))
    for name in ("temperature", "lr", "clip_coef", "max_grad_norm", "sft_lr"):
        check_positive(f"algo.{name}", getattr(a, name))
    for name in ("kl_coef", "max_staleness", "sft_steps"):
        check_positive(f"algo.{name}", getattr(a, name), allow_zero=True)
    if a.group_size < 2:
        raise ValueError(
            f"algo.group_size: must be >= 2 (advantages compare a group), got {a.group_size}"
        )
    if a.min_len > a.max_len:
        raise ValueError(f"algo.min_len ({a.min_len}) exceeds algo.max_len ({a.max_len})")
    if a.max_len > 9:
        raise ValueError(f"algo.max_len: at most 9 digits, got {a.max_len}")
    if not 0.0 <= a.target_reward <= 1.0:
        raise ValueError(f"algo.target_reward: must be in [0, 1], got {a.target_reward}")
    if not 0.0 <= a.sft_noise <= 1.0:
        raise ValueError(f"algo.sft_noise: must be in [0, 1], got {a.sft_noise}")
    if a.d_model % a.n_heads:
        raise ValueError(
            f"algo.d_model ({a.d_model}) must be a multiple of algo.n_heads ({a.n_heads})"
        )
    check_choice("algo.sampler", a.sampler, ("grouped", "seqlen_balanced"))
    check_choice("algo.model", a.model, ("tiny", "hf"))
    check_choice("algo.wire_dtype", a.wire_dtype, ("float32", "bfloat16"))
    ranks = c.train_worker.count
    groups = c.rollout_worker.count * a.prompts_per_rollout
    if groups % ranks:
        raise ValueError(
            f"the {groups} groups of an iteration (rollout_worker.worker_num x "
            f"algo.prompts_per_rollout) do not split over the {ranks} train ranks"
        )
    if a.sft_batch_size % ranks:
        raise ValueError(
            f"algo.sft_batch_size ({a.sft_batch_size}) must be a multiple of the "
            f"{ranks} train ranks"
        )
