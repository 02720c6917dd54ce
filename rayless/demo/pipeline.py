"""The demo RL pipeline's driver: plan, spawn on the planned slots, run PPO, measure.

1. Plan placement with ``placement`` (pools from the config's strategy or its manual
   ``resource_pool``), pack workers into slots.
2. Start the store with one unit per buffer slot; shard by the episode table (env → storage
   shard with node affinity; storage shard → train ranks).
3. Spawn eval, env and train workers on exactly their slots (``spawn_component``); the train
   ranks form a torch.distributed group (gloo on CPU, nccl on GPU).
4. Iterate: env workers roll out through eval workers (router) into the store; train ranks
   fetch their shard's samples and update; rank 0 publishes its weights with a version to
   the run's weight sync (``rayless.weights.WeightSync``: shared memory on a host, a relay per
   other host) and every eval worker pulls them in place. ``sync`` mode waits for the new
   weights before the next rollout; ``async`` keeps up to ``algo.max_staleness`` rollouts
   ahead of training.

Each iteration's samples go to their own partitions (``it{k}-shard{s}``), so a train rank
always reads exactly its share of that iteration from its storage shard.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rayless.actors import ActorDiedError, ActorHandle, Cluster
from rayless.actors.ext import cluster_info, slots_of
from rayless.demo.config import PipelineConfig, WorkerConfig
from rayless.demo.rollout import ReturnTracker
from rayless.demo.tasks import first_error
from rayless.demo.workers import EnvWorker, EvalWorker, TrainWorker
from rayless.placement import ComponentScheduling, EpisodeTable, ResourcePoolPlanner, Scheduling
from rayless.store import Store
from rayless.weights import WeightSync


@dataclass
class IterationStats:
    """What one iteration did (one row of the JSON report)."""

    iteration: int
    wall_s: float
    mean_return: float
    episodes: int
    samples: int
    samples_per_s: float
    version: int
    staleness: int
    loss: float
    weight_sync_s: float = 0.0  # publish until every eval worker pulled the new version


@dataclass
class RunResult:
    """The whole run: per-iteration stats, stage throughput, placement, outcome."""

    solved: bool
    iterations: list[IterationStats]
    stages: dict[str, float]
    placement: list[dict[str, Any]]
    wall_s: float
    setup_s: float
    mode: str
    target_return: float
    final_return: float
    totals: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the JSON report."""
        out = asdict(self)
        out["mean_return"] = [it.mean_return for it in self.iterations]
        out["samples_per_s"] = [it.samples_per_s for it in self.iterations]
        out["weight_sync_s"] = [it.weight_sync_s for it in self.iterations]
        return out


def _scheduling(w: WorkerConfig) -> Scheduling:
    if isinstance(w.worker_num, int):
        return Scheduling(w.worker_num, w.num_cpus, w.num_gpus, w.node_list)
    return Scheduling("auto", w.num_cpus, w.num_gpus, w.node_list)


def plan(cfg: PipelineConfig, info: dict[str, Any]) -> ResourcePoolPlanner:
    """The planner for ``cfg`` over the cluster ``info``, with its pools planned.

    Raises:
        PlacementError / ValueError: the cluster cannot hold the configured workers.
    """
    c = cfg.cluster
    scheduling = ComponentScheduling(
        env_worker=[_scheduling(w) for w in c.env_worker],
        train_worker=_scheduling(c.train_worker),
        eval_worker=_scheduling(c.eval_worker),
        buffer_worker=_scheduling(c.buffer_worker),
    )
    planner = ResourcePoolPlanner(scheduling, info)
    if cfg.placement.mode == "manual" and cfg.resource_pool:
        planner.load_manual_resource_pools(cfg.to_dict()["resource_pool"])
    else:
        planner.plan_resource_pools(cfg.placement.strategy, cfg.placement.env_strategy)
    return planner


class Pipeline:
    """One run of the pipeline on a cluster. ``await setup()``, ``await run()``, ``aclose()``.

    ``max_restarts`` (default 0) is given to the env and eval workers: a worker that dies is
    restarted that many times, and a rollout or weight broadcast that failed with
    ``ActorDiedError`` is retried as often (a restarted env worker starts fresh episodes; a
    restarted eval worker gets the current weights again). Train ranks and the store are not
    restarted: their loss ends the run with their error (``UnitLostError`` names the unit).
    """

    def __init__(
        self,
        cfg: PipelineConfig,
        cluster: Cluster,
        *,
        on_iteration: Callable[[IterationStats, PipelineConfig], Awaitable[None] | None]
        | None = None,
        max_restarts: int = 0,
    ) -> None:
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
        self.cfg = cfg
        self.max_restarts = max_restarts
        self.cluster = cluster
        self.on_iteration = on_iteration
        self.store: Store | None = None
        self.evals: list[ActorHandle] = []
        self.envs: list[ActorHandle] = []
        self.trains: list[ActorHandle] = []
        self.placement: list[dict[str, Any]] = []
        self.env_shard: dict[int, int] = {}
        self.rank_shard: dict[int, int] = {}
        self.ranks_per_shard: dict[int, int] = {}
        self.setup_s = 0.0
        self.store_name = f"demo-store-{cluster.info.session[:8]}"
        self.weights_name = f"demo-weights-{cluster.info.session[:8]}"
        self.weights: WeightSync | None = None
        self._version = -1  # the newest version published
        self.sync_s: list[float] = []  # seconds per weight sync, setup's first

    async def setup(self) -> None:
        """Plan, start the store and every worker, form the process group, sync weights."""
        t0 = time.perf_counter()
        cfg, algo = self.cfg, self.cfg.algo
        planner = plan(cfg, await cluster_info(self.cluster))
        packing = planner.pack()
        distribution = planner.get_component_distribution()
        buffers = slots_of(packing, "buffer")
        n_env = len(slots_of(packing, "env"))
        n_train = len(slots_of(packing, "train"))
        table = EpisodeTable(
            num_storages=len(buffers),
            env_ids=[f"env-{i}" for i in range(n_env)],
            num_train_workers=n_train,
            component_distribution=distribution,
            node_affinity_env=cfg.buffer.node_affinity_env,
            node_affinity_train=cfg.buffer.node_affinity_train,
        )
        self.env_shard = {i: table.get_storage_idx_for_env(f"env-{i}") for i in range(n_env)}
        for shard, ranks in table.get_storage_to_train_workers().items():
            self.ranks_per_shard[shard] = len(ranks)
            for r in ranks:
                self.rank_shard[r] = shard
        samples_per_shard = {s: 0 for s in range(len(buffers))}
        for i in range(n_env):
            samples_per_shard[self.env_shard[i]] += algo.num_envs * algo.rollout_steps
        self.store = await Store.create(
            self.cluster,
            num_units=len(buffers),
            nodes=[s.node_id for s in buffers],
            name=self.store_name,
            env_shards=table.get_env_to_storage(),
        )
        algo_d = asdict(algo)
        seed = cfg.run.seed
        self.weights = await WeightSync.create(self.cluster, name=self.weights_name)
        self.evals = await self.cluster.spawn_component(
            EvalWorker,
            packing,
            "eval",
            algo_d,
            seed,
            self.weights_name,
            max_restarts=self.max_restarts,
        )
        self.trains = []
        for r in range(n_train):
            shard = self.rank_shard[r]
            per_rank = samples_per_shard[shard] // self.ranks_per_shard[shard]
            self.trains += await self.cluster.spawn_component(
                TrainWorker,
                [slots_of(packing, "train")[r]],
                "train",
                r,
                algo_d,
                seed,
                self.store_name,
                f"shard{shard}",
                per_rank,
                self.weights_name,
            )
        self.envs = await self._spawn_envs(packing, algo_d, seed, distribution)
        addr, port = await self.trains[0].free_port()
        await asyncio.gather(*(t.init_distributed(addr, port, n_train) for t in self.trains))
        await self._broadcast_weights(0)
        self.placement = [
            {
                "component": s.component,
                "worker": f"{s.component}-{s.worker_id}",
                "node": s.node_id,
                "gpus": s.cuda_visible_devices or "-",
                "gpu_share": s.gpu_fraction,
                "cpus": s.cpus,
            }
            for s in packing.slots
        ]
        self.setup_s = time.perf_counter() - t0

    async def _spawn_envs(
        self, packing: Any, algo_d: dict[str, Any], seed: int, distribution: Any
    ) -> list[ActorHandle]:
        envs = []
        for slot in slots_of(packing, "env"):
            i = slot.worker_id
            envs += await self.cluster.spawn_component(
                EnvWorker,
                [slot],
                "env",
                i,
                algo_d,
                seed,
                self.evals,
                distribution,
                self.cfg.policy.router_type,
                self.store_name,
                f"shard{self.env_shard[i]}",
                max_restarts=self.max_restarts,
            )
        return envs

    async def _broadcast_weights(self, version: int) -> float:
        """Rank 0 publishes ``version``; every eval worker pulls it. The seconds it took."""
        t0 = time.perf_counter()
        await self.trains[0].publish_weights(version)
        self._version = version
        await self._retrying(
            lambda: first_error(*(e.pull_weights(version) for e in self.evals)), resync=False
        )
        took = time.perf_counter() - t0
        self.sync_s.append(took)
        return took

    async def _retrying(self, call: Callable[[], Any], *, resync: bool = True) -> Any:
        """``await call()``, retried up to ``max_restarts`` times after an ActorDiedError of a
        restartable worker (the worker comes back behind the same handle)."""
        for attempt in range(self.max_restarts + 1):
            try:
                return await call()
            except ActorDiedError:
                if attempt >= self.max_restarts:
                    raise
            await asyncio.sleep(0.2)
            if resync and self._version >= 0:  # a restarted eval worker has old weights
                version = self._version
                await asyncio.gather(
                    *(e.pull_weights(version) for e in self.evals), return_exceptions=True
                )
        raise AssertionError("unreachable")  # the loop returns or raises

    async def run(self) -> RunResult:
        """Train until the target return, the iteration limit or the time limit."""
        cfg, algo = self.cfg, self.cfg.algo
        tracker = ReturnTracker(algo.return_window)
        ahead = algo.max_staleness if cfg.policy.rollout_mode == "async" else 0
        stats: list[IterationStats] = []
        totals: dict[str, float] = {
            k: 0.0
            for k in (
                "env_steps",
                "env_s",
                "infer_calls",
                "infer_s",
                "put_bytes",
                "put_s",
                "get_bytes",
                "get_s",
                "train_samples",
                "train_s",
            )
        }
        start = time.perf_counter()
        pending: dict[int, asyncio.Task[list[dict[str, Any]]]] = {}
        version = 0
        solved = False
        try:
            for it in range(algo.iterations):
                for k in range(it, min(algo.iterations, it + ahead + 1)):
                    if k not in pending:
                        pending[k] = asyncio.ensure_future(self._rollout_into(k))
                t_it = time.perf_counter()
                env_stats = await pending.pop(it)
                train_stats = await first_error(*(t.train(it) for t in self.trains))
                version = it + 1
                sync_s = await self._broadcast_weights(version)
                for s in env_stats:
                    tracker.add(torch.tensor(s["returns"], dtype=torch.float32))
                    totals["env_steps"] += s["env_steps"]
                    totals["env_s"] += s["env_s"]
                    totals["infer_calls"] += s["infer_calls"]
                    totals["infer_s"] += s["infer_s"]
                    totals["put_bytes"] += s["put_bytes"]
                    totals["put_s"] += s["put_s"]
                for s in train_stats:
                    totals["get_bytes"] += s["get_bytes"]
                    totals["get_s"] += s["get_s"]
                    totals["train_samples"] += s["samples"]
                    totals["train_s"] += s["train_s"]
                wall = time.perf_counter() - t_it
                samples = sum(s["samples"] for s in train_stats)
                row = IterationStats(
                    iteration=it,
                    wall_s=wall,
                    mean_return=tracker.mean(),
                    episodes=sum(len(s["returns"]) for s in env_stats),
                    samples=samples,
                    samples_per_s=samples / wall if wall > 0 else 0.0,
                    version=version,
                    staleness=it - min(s["min_version"] for s in train_stats),
                    loss=sum(s.get("loss", 0.0) for s in train_stats) / len(train_stats),
                    weight_sync_s=sync_s,
                )
                stats.append(row)
                if self.on_iteration is not None:
                    waited = self.on_iteration(row, cfg)
                    if inspect.isawaitable(waited):  # a hook may hold the run (tests do)
                        await waited
                if tracker.full and tracker.mean() >= algo.target_return:
                    solved = True
                    break
                if time.perf_counter() - start > cfg.run.time_limit_s:
                    break
        finally:
            for task in pending.values():
                task.cancel()
            await asyncio.gather(*pending.values(), return_exceptions=True)
        syncs = [r.weight_sync_s for r in stats]
        totals["weight_syncs"] = float(len(syncs))
        totals["weight_sync_s"] = float(sum(syncs))
        n_env, n_train = max(1, len(self.envs)), max(1, len(self.trains))
        stages = {
            "env_steps_per_s": totals["env_steps"] / max(1e-9, totals["env_s"] / n_env),
            "inference_per_s": totals["infer_calls"] / max(1e-9, totals["infer_s"] / n_env),
            "store_put_mb_s": totals["put_bytes"] / 1e6 / max(1e-9, totals["put_s"] / n_env),
            "store_get_mb_s": totals["get_bytes"] / 1e6 / max(1e-9, totals["get_s"] / n_train),
            "train_samples_per_s": totals["train_samples"] / max(1e-9, totals["train_s"] / n_train),
        }
        return RunResult(
            solved=solved,
            iterations=stats,
            stages=stages,
            placement=self.placement,
            wall_s=time.perf_counter() - start,
            setup_s=self.setup_s,
            mode=cfg.policy.rollout_mode,
            target_return=algo.target_return,
            final_return=tracker.mean(),
            totals=totals,
        )

    async def _rollout_into(self, iteration: int) -> list[dict[str, Any]]:
        async def one(env: ActorHandle) -> dict[str, Any]:
            result: dict[str, Any] = await self._retrying(lambda: env.rollout(iteration))
            return result

        return await first_error(*(one(e) for e in self.envs))

    async def aclose(self) -> None:
        """Kill the workers and the store (the cluster stays)."""
        handles = [*self.envs, *self.evals, *self.trains]
        await asyncio.gather(*(self.cluster.kill(h) for h in handles), return_exceptions=True)
        if self.store is not None:
            try:
                await self.store.shutdown()
            except Exception:
                pass
        if self.weights is not None:
            await self.weights.aclose()
