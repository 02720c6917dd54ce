"""The GRPO demo's driver: plan, spawn, warm-start, then rollout -> reward -> reference ->
train -> weight sync per iteration, measured stage by stage.

1. Plan placement with the PPO demo's planner (:func:`rayless.demo.pipeline.plan`; rollout
   workers are its ``eval`` component, reward and reference workers its ``env`` groups),
   pack the workers into slots.
2. Start the store (one unit per buffer slot, rollout workers sharded onto units by the
   episode table, with node affinity) and the run's weight sync.
3. Spawn every worker on its slot; the train ranks form a torch.distributed group and run
   the supervised warm start (DDP); rank 0 publishes it as version 0, the reference worker
   keeps it, the held-out prompts are scored with it.
4. Iteration ``k``: every rollout worker samples its groups with a policy version >=
   ``k - max_staleness`` (``sync``: exactly the newest), puts them and has a reward worker
   (router: node affinity) add ``rewards``; the reference worker fetches the iteration's
   worth of new groups and adds ``ref_logprobs``; the train ranks read a global batch of
   whole groups whose every field is ready and step; rank 0 publishes version ``k + 1`` and
   (``sync``) every rollout worker pulls it. ``async`` keeps up to ``max_staleness``
   iterations of rollouts in flight ahead of training.

Each iteration's samples go through a partition of their own (``grpo-<k>``, as TransferQueue's
users keep a partition per global step): the reference worker and the train ranks of iteration
``k`` read only rollout ``k``'s groups, however the rollouts in flight interleave, so a step's
staleness is bounded by ``max_staleness``; the partition is dropped once trained on.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rayless.actors import ActorHandle, Cluster
from rayless.actors.ext import cluster_info, slots_of
from rayless.demo import grpo_task as task
from rayless.demo.grpo_config import GrpoConfig
from rayless.demo.grpo_trainer import GrpoTrainWorker
from rayless.demo.grpo_workers import (
    ReferenceWorker,
    RewardWorker,
    RolloutWorker,
    iteration_partition,
)
from rayless.demo.pipeline import plan
from rayless.demo.tasks import first_error
from rayless.placement import EpisodeTable
from rayless.store import Store
from rayless.weights import WeightSync

STAGES = ("rollout", "reward", "reference", "train", "weight_sync")
LANES = (*STAGES, "eval")  # the timeline also shows the held-out evaluations
PARTITION = "grpo"


@dataclass
class GrpoIteration:
    """What one iteration did (one row of metrics.json)."""

    iteration: int
    wall_s: float
    mean_reward: float  # of the responses trained on
    eval_reward: float | None  # held-out prompts, every eval_interval iterations
    response_length: float
    answer_length: float  # mean length of the right answers to the same prompts
    samples: int
    samples_per_s: float
    version: int  # the policy version after this iteration's step
    staleness: int  # this step's version minus the oldest version that sampled its batch
    loss: float
    kl: float
    groups: int = 0  # whole groups trained on (all ranks)
    rollouts: list[int] = field(default_factory=list)  # the iterations whose rollouts it read
    group_sizes: list[int] = field(default_factory=list)  # distinct sizes the ranks saw
    stage_s: dict[str, float] = field(default_factory=dict)
    # (stage, start, end) in seconds since the run started, for the timeline
    intervals: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass
class GrpoResult:
    solved: bool
    iterations: list[GrpoIteration]
    placement: list[dict[str, Any]]
    wall_s: float
    setup_s: float
    warm_start_s: float
    mode: str
    target_reward: float
    warm_reward: float
    final_reward: float
    best_reward: float
    totals: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None  # algo.model hf: the saved HF policy and tokenizer

    def to_dict(self) -> dict[str, Any]:
        """Plain values for metrics.json (per-iteration series at the top level too)."""
        out = asdict(self)
        its = self.iterations
        out["mean_reward"] = [it.mean_reward for it in its]
        out["eval_reward"] = [it.eval_reward for it in its]
        out["response_length"] = [it.response_length for it in its]
        out["answer_length"] = [it.answer_length for it in its]
        out["samples_per_s"] = [it.samples_per_s for it in its]
        out["stage_s"] = {s: [it.stage_s.get(s, 0.0) for it in its] for s in STAGES}
        return out


def _span(intervals: Iterable[dict[str, float] | None]) -> tuple[float, float] | None:
    """The hull ``(start, end)`` of some intervals (None entries skipped; None if none)."""
    got = [i for i in intervals if i]
    if not got:
        return None
    return min(i["start"] for i in got), max(i["end"] for i in got)


class GrpoPipeline:
    """One GRPO run on a cluster: ``await setup()``, ``await run()``, ``await aclose()``."""

    def __init__(
        self,
        cfg: GrpoConfig,
        cluster: Cluster,
        *,
        on_iteration: Callable[[GrpoIteration, GrpoConfig], Awaitable[None] | None] | None = None,
        checkpoint_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        # algo.model hf: the final policy and tokenizer are saved here (save_pretrained)
        self.checkpoint_dir = checkpoint_dir
        self.cluster = cluster
        self.on_iteration = on_iteration
        self.store: Store | None = None
        self.weights: WeightSync | None = None
        self.rollouts: list[ActorHandle] = []
        self.rewards: list[ActorHandle] = []
        self.reference: ActorHandle | None = None
        self.trains: list[ActorHandle] = []
        self.placement: list[dict[str, Any]] = []
        self.setup_s = 0.0
        self.warm_start_s = 0.0
        self.warm_reward = float("nan")
        self.rollout_shard: dict[int, int] = {}
        self.rollout_node: list[str] = []
        self._spawned: list[ActorHandle] = []
        self.reward_node: list[str] = []
        session = cluster.info.session[:8]
        self.store_name = f"grpo-store-{session}"
        self.weights_name = f"grpo-weights-{session}"
        gen = torch.Generator().manual_seed(10_000 + cfg.run.seed)
        a = cfg.algo
        self.held_out, _ = task.make_prompts(a.eval_prompts, a.min_len, a.max_len, gen)
        self._t0 = time.time()

    async def setup(self) -> None:
        """Plan, start the store and every worker, form the group, warm-start, score it."""
        t0 = time.perf_counter()
        cfg, algo = self.cfg, self.cfg.algo
        planner = plan(cfg.planning(), await cluster_info(self.cluster))
        packing = planner.pack()
        distribution = planner.get_component_distribution()
        buffers = slots_of(packing, "buffer")
        rollout_slots = slots_of(packing, "eval")
        env_slots = slots_of(packing, "env")
        reward_slots = [s for s in env_slots if s.group == 0]
        reference_slots = [s for s in env_slots if s.group == 1]
        train_slots = slots_of(packing, "train")
        # rollout workers are the episode table's env workers: each writes to one shard
        writers = {
            node: {k: v for k, v in comps.items() if k in ("train", "buffer")}
            | ({"env": comps["eval"]} if "eval" in comps else {})
            for node, comps in distribution.items()
        }
        table = EpisodeTable(
            num_storages=len(buffers),
            env_ids=[f"env-{s.worker_id}" for s in rollout_slots],
            num_train_workers=len(train_slots),
            component_distribution=writers,
            node_affinity_env=cfg.buffer.node_affinity_env,
            node_affinity_train=cfg.buffer.node_affinity_train,
        )
        self.rollout_shard = {
            s.worker_id: table.get_storage_idx_for_env(f"env-{s.worker_id}") for s in rollout_slots
        }
        self.store = await Store.create(
            self.cluster,
            num_units=len(buffers),
            nodes=[s.node_id for s in buffers],
            name=self.store_name,
            env_shards=table.get_env_to_storage(),
        )
        self.weights = await WeightSync.create(self.cluster, name=self.weights_name)
        algo_d, seed = asdict(algo), cfg.run.seed
        batch = cfg.responses_per_iteration
        self.rewards = await self._spawn_each(
            RewardWorker, reward_slots, "env", self.store_name, algo_d
        )
        # routing: rollout workers (as the router's "env") to reward workers (its "eval")
        reward_ids = {s.worker_id: i for i, s in enumerate(reward_slots)}
        routing: dict[str, Any] = {}
        for node, comps in distribution.items():
            ids = [reward_ids[w] for w in comps.get("env", {}).get("ids", []) if w in reward_ids]
            entry: dict[str, Any] = {}
            if ids:
                entry["eval"] = {"count": len(ids), "ids": ids}
            if "eval" in comps:
                entry["env"] = comps["eval"]
            routing[node] = entry
        references = await self.cluster.spawn_component(
            ReferenceWorker,
            reference_slots,
            "env",
            algo_d,
            self.store_name,
            self.weights_name,
            PARTITION,
            batch,
        )
        self._spawned += references
        (self.reference,) = references
        self.rollouts = await self._spawn_each(
            RolloutWorker,
            rollout_slots,
            "eval",
            algo_d,
            seed,
            self.store_name,
            self.weights_name,
            PARTITION,
            self.rewards,
            routing,
            cfg.policy.router_type,
        )
        self.trains = await self._spawn_each(
            GrpoTrainWorker,
            train_slots,
            "train",
            len(train_slots),
            algo_d,
            seed,
            self.store_name,
            self.weights_name,
            PARTITION,
            batch,
        )
        addr, port = await self.trains[0].free_port()
        await asyncio.gather(*(t.init_distributed(addr, port) for t in self.trains))
        names = {id(s): f"rollout-{i}" for i, s in enumerate(rollout_slots)}
        names |= {id(s): f"reward-{i}" for i, s in enumerate(reward_slots)}
        names |= {id(s): f"reference-{i}" for i, s in enumerate(reference_slots)}
        names |= {id(s): f"train-{i}" for i, s in enumerate(train_slots)}
        names |= {id(s): f"buffer-{i}" for i, s in enumerate(buffers)}
        self.placement = [
            {
                "component": s.component,
                "worker": names.get(id(s), f"{s.component}-{s.worker_id}"),
                "node": s.node_id,
                "gpus": s.cuda_visible_devices or "-",
                "gpu_share": s.gpu_fraction,
                "cpus": s.cpus,
            }
            for s in packing.slots
        ]
        self.rollout_node = [s.node_id for s in rollout_slots]
        self.reward_node = [s.node_id for s in reward_slots]
        self.setup_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        await asyncio.gather(*(t.warm_start() for t in self.trains))
        await self.trains[0].publish_weights(0)
        await asyncio.gather(self.reference.load(0), *(r.pull_weights(0) for r in self.rollouts))
        self.warm_start_s = time.perf_counter() - t1
        self.warm_reward = (await self.rollouts[0].evaluate(self.held_out, 0))["reward"]

    async def _spawn_each(
        self, cls: type, slots: list[Any], component: str, *args: Any
    ) -> list[ActorHandle]:
        """One ``cls(i, *args)`` per slot, on exactly that slot (``i``: its position)."""
        handles: list[ActorHandle] = []
        for i, slot in enumerate(slots):
            spawned = await self.cluster.spawn_component(cls, [slot], component, i, *args)
            self._spawned += spawned  # killed by aclose() even if a later spawn fails
            handles += spawned
        return handles

    async def run(self) -> GrpoResult:
        """GRPO until the held-out reward reaches the target, or the iteration/time limit."""
        cfg, algo = self.cfg, self.cfg.algo
        store = self.store
        if store is None:
            raise RuntimeError("GrpoPipeline.run() needs setup() first")
        ahead = algo.max_staleness if cfg.policy.rollout_mode == "async" else 0
        start = time.perf_counter()
        self._t0 = time.time()
        rollouts: dict[int, asyncio.Task[list[dict[str, Any]]]] = {}
        references: dict[int, asyncio.Task[dict[str, float]]] = {}
        stats: list[GrpoIteration] = []
        totals = dict.fromkeys(
            (
                "rollout_samples",
                "rewarded",
                "rewarded_on_node",  # by a reward worker on the rollout worker's node
                "referenced",
                "trained",
                "weight_syncs",
            ),
            0.0,
        )
        solved = False
        last_eval = self.warm_reward
        best = self.warm_reward
        try:
            for it in range(algo.iterations):
                for k in range(it, min(algo.iterations, it + ahead + 1)):
                    if k not in rollouts:
                        rollouts[k] = asyncio.ensure_future(self._rollout(k, max(0, k - ahead)))
                        references[k] = asyncio.ensure_future(self._reference(k))
                t_it = time.perf_counter()
                roll, ref, train = await first_error(
                    rollouts.pop(it),
                    references.pop(it),
                    asyncio.gather(*(t.train(it) for t in self.trains)),
                )
                await store.clear_partition(iteration_partition(PARTITION, it))
                version = it + 1
                publish = await self.trains[0].publish_weights(version)
                pulls: list[dict[str, float]] = []
                if ahead == 0:  # sync: every rollout worker takes the new version now
                    pulls = list(
                        await asyncio.gather(*(r.pull_weights(version) for r in self.rollouts))
                    )
                evaluated, eval_span = None, None
                if (it + 1) % algo.eval_interval == 0 or it + 1 == algo.iterations:
                    t_ev = time.time()
                    ev = await self.rollouts[0].evaluate(self.held_out, version)
                    eval_span = (t_ev - self._t0, time.time() - self._t0)
                    evaluated = last_eval = ev["reward"]
                    best = max(best, last_eval)
                wall = time.perf_counter() - t_it
                row = self._row(it, wall, version, roll, ref, train, publish, pulls, evaluated)
                if eval_span is not None:
                    row.intervals.append(("eval", *eval_span))
                totals["rollout_samples"] += sum(r["samples"] for r in roll)
                totals["rewarded"] += sum(r["reward"]["samples"] for r in roll)
                totals["rewarded_on_node"] += sum(
                    r["reward"]["samples"]
                    for r in roll
                    if self.reward_node[int(r["reward"]["worker"])]
                    == self.rollout_node[r["worker"]]
                )
                totals["referenced"] += ref["samples"]
                totals["trained"] += row.samples
                totals["weight_syncs"] += 1
                stats.append(row)
                if self.on_iteration is not None:
                    waited = self.on_iteration(row, cfg)
                    if inspect.isawaitable(waited):
                        await waited
                if evaluated is not None and evaluated >= algo.target_reward:
                    solved = True
                    break
                if time.perf_counter() - start > cfg.run.time_limit_s:
                    break
        finally:
            pending = [*rollouts.values(), *references.values()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        # buckets the rollout workers loaded through pull(into=...) (algo.model hf)
        totals["loaded_buckets"] = float(sum([await r.weight_loads() for r in self.rollouts]))
        checkpoint = None
        if self.checkpoint_dir is not None and algo.model == "hf":
            checkpoint = str(await self.save_checkpoint(self.checkpoint_dir))
        return GrpoResult(
            checkpoint=checkpoint,
            solved=solved,
            iterations=stats,
            placement=self.placement,
            wall_s=time.perf_counter() - start,
            setup_s=self.setup_s,
            warm_start_s=self.warm_start_s,
            mode=cfg.policy.rollout_mode,
            target_reward=algo.target_reward,
            warm_reward=self.warm_reward,
            final_reward=last_eval,
            best_reward=best,
            totals=totals,
        )

    async def save_checkpoint(self, path: Path) -> Path:
        """Pull the newest published policy into an HF model here and ``save_pretrained`` it
        with the tokenizer into ``path`` (``algo.model: hf``). Raises WeightSyncError."""
        from rayless.demo.grpo_hf import HfOps, save_checkpoint

        if self.weights is None:
            raise RuntimeError("GrpoPipeline.save_checkpoint() needs setup() first")
        ops = HfOps(self.cfg.algo)
        model = ops.build()
        latest = await self.weights.latest_version()
        await self.weights.pull(model, min_version=latest, timeout=60.0)
        return await asyncio.to_thread(save_checkpoint, model, ops.tokenizer, path)

    async def _rollout(self, iteration: int, min_version: int) -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(*(r.rollout(iteration, min_version) for r in self.rollouts))
        )

    async def _reference(self, iteration: int) -> dict[str, float]:
        if self.reference is None:
            raise RuntimeError("GrpoPipeline.run() needs setup() first")
        result: dict[str, float] = await self.reference.process(iteration)
        return result

    def _row(
        self,
        it: int,
        wall: float,
        version: int,
        roll: list[dict[str, Any]],
        ref: dict[str, float],
        train: list[dict[str, Any]],
        publish: dict[str, float],
        pulls: list[dict[str, float]],
        evaluated: float | None,
    ) -> GrpoIteration:
        spans: dict[str, tuple[float, float] | None] = {
            "rollout": _span(r["generate"] | {"end": r["put"]["end"]} for r in roll),
            "reward": _span(r["reward"] for r in roll),
            "reference": _span([ref]),
            "train": _span(t["step"] for t in train),
        }
        stage_s = {stage: (s[1] - s[0]) if s else 0.0 for stage, s in spans.items()}
        # weight sync: the publish, then every rollout worker's pull of a new version (right
        # after it in sync mode; at the start of its next rollout in async mode)
        syncs = [publish, *pulls, *(r["pull"] for r in roll if r["pull"])]
        got = [p["end"] - p["start"] for p in pulls] or [
            r["pull"]["end"] - r["pull"]["start"] for r in roll if r["pull"]
        ]
        stage_s["weight_sync"] = publish["end"] - publish["start"] + max(got, default=0.0)
        intervals = [
            (stage, s[0] - self._t0, s[1] - self._t0) for stage, s in spans.items() if s is not None
        ]
        intervals += [("weight_sync", p["start"] - self._t0, p["end"] - self._t0) for p in syncs]
        samples = sum(int(t["samples"]) for t in train)
        n = len(train)
        return GrpoIteration(
            iteration=it,
            wall_s=wall,
            mean_reward=sum(t["mean_reward"] * t["samples"] for t in train) / max(1, samples),
            eval_reward=evaluated,
            response_length=sum(t["mean_length"] * t["samples"] for t in train) / max(1, samples),
            answer_length=sum(t["answer_length"] * t["samples"] for t in train) / max(1, samples),
            samples=samples,
            samples_per_s=samples / wall if wall > 0 else 0.0,
            version=version,
            staleness=it - min(int(t["min_version"]) for t in train),
            loss=sum(float(t["loss"]) for t in train) / n,
            kl=sum(float(t["kl"]) for t in train) / n,
            groups=sum(int(t["groups"]) for t in train),
            rollouts=sorted({int(k) for t in train for k in t["rollouts"]}),
            group_sizes=sorted({int(g) for t in train for g in t["group_sizes"]}),
            stage_s=stage_s,
            intervals=intervals,
        )

    async def aclose(self) -> None:
        """Kill the workers, the store and the weight sync (the cluster stays)."""
        handles = list({h.actor_id: h for h in self._spawned}.values())
        await asyncio.gather(*(self.cluster.kill(h) for h in handles), return_exceptions=True)
        if self.store is not None:
            try:
                await self.store.shutdown()
            except Exception:
                pass
        if self.weights is not None:
            await self.weights.aclose()
