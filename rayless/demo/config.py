"""The demo pipeline's configuration: dataclasses, YAML loading and validation.

:func:`load_config` reads a YAML file, :func:`config_from_dict` a parsed mapping; both
return a validated :class:`PipelineConfig` or raise ``ValueError`` naming the offending key
(``algo.lr: must be > 0, got -1``). Unknown keys are errors, omitted keys take the defaults
below. Shipped configs: ``rayless/configs/default.yaml`` (embedded two-node local cluster
with fake GPUs, runs on a CPU machine) and ``rayless/configs/gpu_8.yaml`` (one 8-GPU node).
The GRPO demo's configs (``grpo.yaml``, ``grpo_gpu.yaml``) share these sections and add their
own workers and ``algo`` keys: see :mod:`rayless.demo.grpo_config`.

Config reference
----------------

``cluster:`` — the nodes, and the workers of each kind::

    cluster:
      num_nodes: 2            # nodes in the cluster (>= 1)
      embedded: true          # true: start every node as local processes on this machine
      fake_gpus_per_node: 2   # > 0: pretend each node has this many GPUs (no NVML, CPU
                              #   tensors); 0: discover the real GPUs
      cpus_per_node: null     # optional override of the discovered CPU count
      env_worker:    {worker_num: 2, num_gpus: 0, num_cpus: 0.25}  # vectorised envs
      eval_worker:   {worker_num: 2, num_gpus: 1, num_cpus: 0.25}  # inference (act)
      train_worker:  {worker_num: 2, num_gpus: 1, num_cpus: 0.25}  # PPO learners (DDP)
      buffer_worker: {worker_num: 2, num_gpus: 0, num_cpus: 0.25}  # hosts the store shards

A worker kind is ``{worker_num, num_gpus, num_cpus, node_list}``, the fields of
``placement.scheduling.Scheduling``: ``num_gpus`` per worker is a whole number or a fraction
in (0, 1) (workers sharing a GPU); ``node_list`` (optional, list or comma-separated string of
node ids) restricts where the workers go; ``buffer_worker.worker_num`` may be ``auto`` (one
per node holding train workers). ``env_worker`` may also be a list of such groups. GPU needs
are counted packing-aware as the planner does (3 workers of 0.5 GPU need 2 GPUs).

``placement:`` — how workers are packed onto nodes (the resource-pool planner's terms)::

    placement:
      mode: auto              # auto: plan pools from `strategy`; manual: use `resource_pool`
      strategy: disaggregate  # disaggregate: train pool and rollout pool on separate GPUs;
                              #   colocate: one global pool, train shares GPUs with rollout
      env_strategy: default   # default: env and eval get their own GPUs;
                              #   device-colocate: env workers share the eval workers' GPUs

``resource_pool:`` — only with ``placement.mode: manual``; a list of pools::

    resource_pool:
      - name: train_pool
        num_node: 1
        num_gpus: 8           # GPUs per node; a per-node list when node_ids is given
        node_ids: [node-0]    # optional: pin the pool to these nodes
        train: "0-3"          # component -> pool-global GPU indices ("0-3, 8-11" or an int)
        eval: "4-5"
        env: "6-7"

Components are ``train``, ``eval``, ``env`` and ``buffer``; indices count GPUs across the
pool's nodes in order (node 0 holds 0..num_gpus-1, node 1 the next num_gpus, ...).

``policy:`` — how env workers reach eval workers::

    policy:
      rollout_mode: sync      # sync: env workers wait for the newest weights each iteration;
                              #   async: rollouts may lag up to algo.max_staleness versions
      router_type: simple     # simple: least-loaded eval worker; node_affinity: prefer an
                              #   eval worker on the env worker's node

``buffer:`` — the sharded store the transitions go through::

    buffer:
      num_storages: 2          # storage shards: a multiple of buffer_worker.worker_num and a
                               #   divisor of train_worker.worker_num
      node_affinity_env: false # env workers write to a shard on their own node
      node_affinity_train: false  # train workers read shards on their own node

``algo:`` — PPO and the rollout shape (defaults are the tuned CartPole values)::

    algo:
      num_envs: 32            # environments per env worker
      rollout_steps: 32       # steps per env per iteration (T); batch = T * num_envs * workers
      iterations: 500         # upper bound on training iterations
      target_return: 195.0    # stop once the mean return reaches this
      return_window: 100      # mean over the last this many finished episodes
      gamma: 0.99
      gae_lambda: 0.95
      lr: 0.003
      epochs: 4               # passes over the batch per iteration
      num_minibatches: 2      # minibatches per epoch (per train worker)
      clip_coef: 0.2
      vf_coef: 0.5
      ent_coef: 0.0
      max_grad_norm: 0.5
      norm_adv: true          # normalise advantages per minibatch
      clip_vloss: false       # clip the value loss like the policy ratio
      hidden_sizes: [64, 64]  # tanh MLP trunk of actor and critic
      max_staleness: 1        # async only: max policy versions a rollout may lag

``run:``::

    run:
      output_dir: runs/demo   # metrics and logs
      device: cpu             # cpu or cuda (train, eval and env tensors)
      seed: 0
      time_limit_s: 300.0     # give up after this much wall time
      log_interval: 1         # log every this many iterations
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import yaml

from rayless.demo.config_sections import (
    build_section,
    check_choice,
    check_positive,
    parse_index_string,
)

COMPONENTS = ("train", "eval", "env", "buffer")
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


@dataclasses.dataclass
class WorkerConfig:
    """How many workers of one kind and what each needs (``placement``'s ``Scheduling``)."""

    worker_num: int | str = 1
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    node_list: list[str] | str | None = None

    @property
    def count(self) -> int:
        """``worker_num``, with ``"auto"`` read as 0 (resolved by the planner)."""
        return self.worker_num if isinstance(self.worker_num, int) else 0

    def gpus_needed(self) -> int:
        """Whole GPUs the workers occupy once packed (fractional workers share a GPU)."""
        g = self.num_gpus
        if g <= 0 or self.count == 0:
            return 0
        if g >= 1:
            return self.count * round(g)
        per_gpu = math.floor(1.0 / g + 1e-9)
        return -(-self.count // per_gpu)


@dataclasses.dataclass
class ClusterConfig:
    num_nodes: int = 1
    embedded: bool = True
    fake_gpus_per_node: int = 0
    cpus_per_node: int | None = None
    env_worker: list[WorkerConfig] = dataclasses.field(default_factory=lambda: [WorkerConfig()])
    eval_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)
    train_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)
    buffer_worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)


@dataclasses.dataclass
class PlacementConfig:
    mode: str = "auto"
    strategy: str = "disaggregate"
    env_strategy: str = "default"


@dataclasses.dataclass
class ResourcePoolConfig:
    """One manual pool: ``allocations`` maps a component to its GPU index string."""

    name: str
    num_node: int
    num_gpus: int | list[int]
    node_ids: list[str] | None = None
    allocations: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PolicyConfig:
    rollout_mode: str = "sync"
    router_type: str = "simple"


@dataclasses.dataclass
class BufferConfig:
    num_storages: int = 1
    node_affinity_env: bool = False
    node_affinity_train: bool = False


@dataclasses.dataclass
class AlgoConfig:
    """PPO hyper-parameters and the rollout shape; defaults solve CartPole fast."""

    num_envs: int = 32
    rollout_steps: int = 32
    iterations: int = 500
    target_return: float = 195.0
    return_window: int = 100
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 3e-3
    epochs: int = 4
    num_minibatches: int = 2
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    clip_vloss: bool = False
    hidden_sizes: list[int] = dataclasses.field(default_factory=lambda: [64, 64])
    max_staleness: int = 1


@dataclasses.dataclass
class RunConfig:
    output_dir: str = "runs/demo"
    device: str = "cpu"
    seed: int = 0
    time_limit_s: float = 300.0
    log_interval: int = 1


@dataclasses.dataclass
class PipelineConfig:
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    resource_pool: list[ResourcePoolConfig] | None = None
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    algo: AlgoConfig = dataclasses.field(default_factory=AlgoConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, Any]:
        """A plain mapping that :func:`config_from_dict` turns back into this config."""
        out = dataclasses.asdict(self)
        if self.resource_pool is not None:
            pools = []
            for pool in self.resource_pool:
                d = {k: v for k, v in dataclasses.asdict(pool).items() if k != "allocations"}
                if d["node_ids"] is None:
                    del d["node_ids"]
                d.update(pool.allocations)
                pools.append(d)
            out["resource_pool"] = pools
        return out

    def validate(self) -> None:
        """Check values and cross-section consistency; raise ``ValueError`` if wrong."""
        _validate(self)


def _build_pool(i: int, data: Any) -> ResourcePoolConfig:
    path = f"resource_pool[{i}]"
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping, got {data!r}")
    known = {"name", "num_node", "num_gpus", "node_ids"}
    fields = {k: v for k, v in data.items() if k in known}
    allocations: dict[str, str] = {}
    for key, value in data.items():
        if key in known:
            continue
        if key not in COMPONENTS:
            raise ValueError(
                f"{path}: unknown key {key!r} (known: {', '.join(sorted(known))}, "
                f"or a component: {', '.join(COMPONENTS)})"
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{path}.{key}: expected an index string like '0-3', got {value!r}")
        allocations[key] = str(value)
    for key in ("name", "num_node", "num_gpus"):
        if key not in fields:
            raise ValueError(f"{path}: missing required key {key!r}")
    pool = build_section(ResourcePoolConfig, path, fields)
    pool.allocations = allocations
    return pool


def config_from_dict(data: Any) -> PipelineConfig:
    """A validated :class:`PipelineConfig` from a parsed YAML mapping."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config: expected a mapping at the top level, got {data!r}")
    data = dict(data)
    pools = data.pop("resource_pool", None)
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and isinstance(cluster.get("env_worker"), dict):
        data["cluster"] = {**cluster, "env_worker": [cluster["env_worker"]]}
    cfg = build_section(PipelineConfig, "config", data)
    cfg.resource_pool = build_pools(pools)
    cfg.validate()
    return cfg


def build_pools(pools: Any) -> list[ResourcePoolConfig] | None:
    """The ``resource_pool:`` section (None when absent). Raises ValueError."""
    if pools is None:
        return None
    if not isinstance(pools, list) or not pools:
        raise ValueError(f"resource_pool: expected a non-empty list of pools, got {pools!r}")
    return [_build_pool(i, p) for i, p in enumerate(pools)]


def load_config(path: str | Path = DEFAULT_CONFIG) -> PipelineConfig:
    """Read and validate a YAML config file (the shipped default without ``path``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"config {path} is not valid YAML: {exc}") from exc
    try:
        return config_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _validate_pool(i: int, pool: ResourcePoolConfig, cfg: PipelineConfig) -> None:
    path = f"resource_pool[{i}]"
    check_positive(f"{path}.num_node", pool.num_node)
    if pool.node_ids is not None:
        if not isinstance(pool.num_gpus, list):
            raise ValueError(f"{path}.num_gpus: must be a per-node list when node_ids is given")
        if len(pool.node_ids) != pool.num_node or len(pool.num_gpus) != pool.num_node:
            raise ValueError(
                f"{path}: node_ids ({len(pool.node_ids)}) and num_gpus ({len(pool.num_gpus)}) "
                f"must both have num_node ({pool.num_node}) entries"
            )
    if isinstance(pool.num_gpus, list):
        per_node = pool.num_gpus
        if len(per_node) != pool.num_node:
            raise ValueError(
                f"{path}.num_gpus: expected {pool.num_node} entries, got {len(per_node)}"
            )
        for j, g in enumerate(per_node):
            check_positive(f"{path}.num_gpus[{j}]", g)
    else:
        check_positive(f"{path}.num_gpus", pool.num_gpus)
        per_node = [pool.num_gpus] * pool.num_node
    if pool.num_node > cfg.cluster.num_nodes:
        raise ValueError(
            f"{path}.num_node: {pool.num_node} exceeds cluster.num_nodes {cfg.cluster.num_nodes}"
        )
    if not pool.allocations:
        raise ValueError(f"{path}: allocates no component (give one of {', '.join(COMPONENTS)})")
    total = sum(per_node)
    for comp, spec in pool.allocations.items():
        for _start, end in parse_index_string(f"{path}.{comp}", spec):
            if end >= total:
                raise ValueError(
                    f"{path}.{comp}: GPU index {end} out of range for a pool of {total} GPUs"
                )


def _required_gpus(cfg: PipelineConfig) -> float:
    """GPUs the workers need under the placement strategy (the planner's rule)."""
    c = cfg.cluster

    train = c.train_worker.gpus_needed() + c.buffer_worker.gpus_needed()
    env = sum(w.gpus_needed() for w in c.env_worker)
    ev = c.eval_worker.gpus_needed()
    rollout = max(env, ev) if cfg.placement.env_strategy == "device-colocate" else env + ev
    return train + rollout if cfg.placement.strategy == "disaggregate" else max(train, rollout)


def _validate(cfg: PipelineConfig) -> None:
    c = cfg.cluster
    check_positive("cluster.num_nodes", c.num_nodes)
    check_positive("cluster.fake_gpus_per_node", c.fake_gpus_per_node, allow_zero=True)
    if c.cpus_per_node is not None:
        check_positive("cluster.cpus_per_node", c.cpus_per_node)
    if not c.env_worker:
        raise ValueError("cluster.env_worker: needs at least one group")
    kinds = [(f"cluster.env_worker[{i}]", w) for i, w in enumerate(c.env_worker)]
    if len(kinds) == 1:
        kinds = [("cluster.env_worker", c.env_worker[0])]
    kinds += [(f"cluster.{k}", getattr(c, k)) for k in ("eval_worker", "train_worker")]
    kinds.append(("cluster.buffer_worker", c.buffer_worker))
    for path, w in kinds:
        if isinstance(w.worker_num, str):
            if w.worker_num != "auto" or path != "cluster.buffer_worker":
                raise ValueError(
                    f"{path}.worker_num: expected an integer ('auto' only for buffer_worker), "
                    f"got {w.worker_num!r}"
                )
        else:
            check_positive(f"{path}.worker_num", w.worker_num)
        check_positive(f"{path}.num_gpus", w.num_gpus, allow_zero=True)
        if w.num_gpus > 1 and w.num_gpus != int(w.num_gpus):
            raise ValueError(
                f"{path}.num_gpus: must be a whole number or a fraction below 1, got {w.num_gpus}"
            )
        check_positive(f"{path}.num_cpus", w.num_cpus, allow_zero=True)
    if c.buffer_worker.num_gpus > 1:
        raise ValueError(
            f"cluster.buffer_worker.num_gpus: must be <= 1, got {c.buffer_worker.num_gpus}"
        )
    if c.cpus_per_node is not None:
        need_cpus = sum(w.count * w.num_cpus for _, w in kinds)
        if need_cpus > c.num_nodes * c.cpus_per_node:
            raise ValueError(
                f"cluster: the workers need {need_cpus:g} CPUs, but {c.num_nodes} nodes x "
                f"{c.cpus_per_node} CPUs = {c.num_nodes * c.cpus_per_node}"
            )

    p = cfg.placement
    check_choice("placement.mode", p.mode, ("auto", "manual"))
    check_choice("placement.strategy", p.strategy, ("disaggregate", "colocate"))
    check_choice("placement.env_strategy", p.env_strategy, ("default", "device-colocate"))
    if p.mode == "manual" and not cfg.resource_pool:
        raise ValueError("placement.mode is 'manual' but no resource_pool is given")
    if p.mode == "auto" and cfg.resource_pool:
        raise ValueError("resource_pool is given but placement.mode is 'auto' (set 'manual')")
    if cfg.resource_pool:
        names = [pool.name for pool in cfg.resource_pool]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"resource_pool: duplicate pool name {dup[0]!r}")
        for i, pool in enumerate(cfg.resource_pool):
            _validate_pool(i, pool, cfg)
    elif c.fake_gpus_per_node > 0:
        required, have = _required_gpus(cfg), c.num_nodes * c.fake_gpus_per_node
        if required > have:
            raise ValueError(
                f"cluster: the workers need {required:g} GPUs under placement.strategy "
                f"{p.strategy!r}, but {c.num_nodes} nodes x {c.fake_gpus_per_node} fake GPUs "
                f"= {have}"
            )

    check_choice("policy.rollout_mode", cfg.policy.rollout_mode, ("sync", "async"))
    check_choice("policy.router_type", cfg.policy.router_type, ("simple", "node_affinity"))

    b = cfg.buffer
    check_positive("buffer.num_storages", b.num_storages)
    if c.train_worker.count % b.num_storages:
        raise ValueError(
            f"cluster.train_worker.worker_num ({c.train_worker.count}) must be a "
            f"multiple of buffer.num_storages ({b.num_storages})"
        )
    if c.buffer_worker.count and b.num_storages % c.buffer_worker.count:
        raise ValueError(
            f"buffer.num_storages ({b.num_storages}) must be a multiple of "
            f"cluster.buffer_worker.worker_num ({c.buffer_worker.count})"
        )

    a = cfg.algo
    for name in ("num_envs", "rollout_steps", "iterations", "return_window", "epochs"):
        check_positive(f"algo.{name}", getattr(a, name))
    check_positive("algo.num_minibatches", a.num_minibatches)
    for name in ("lr", "clip_coef", "max_grad_norm"):
        check_positive(f"algo.{name}", getattr(a, name))
    for name in ("vf_coef", "ent_coef", "max_staleness"):
        check_positive(f"algo.{name}", getattr(a, name), allow_zero=True)
    for name in ("gamma", "gae_lambda"):
        value = getattr(a, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"algo.{name}: must be in [0, 1], got {value}")
    if not a.hidden_sizes:
        raise ValueError("algo.hidden_sizes: needs at least one layer")
    for i, h in enumerate(a.hidden_sizes):
        check_positive(f"algo.hidden_sizes[{i}]", h)
    env_workers = sum(w.count for w in c.env_worker)
    per_worker_batch = a.num_envs * a.rollout_steps * env_workers // c.train_worker.count
    if a.num_minibatches > per_worker_batch:
        raise ValueError(
            f"algo.num_minibatches ({a.num_minibatches}) exceeds the transitions per train "
            f"worker per iteration ({per_worker_batch})"
        )

    r = cfg.run
    if not r.output_dir:
        raise ValueError("run.output_dir: must not be empty")
    if r.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", r.device):
        raise ValueError(f"run.device: must be 'cpu' or 'cuda', got {r.device!r}")
    check_positive("run.time_limit_s", r.time_limit_s)
    check_positive("run.log_interval", r.log_interval)
