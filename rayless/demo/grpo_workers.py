"""The GRPO demo's actors: rollout, reward, reference and train workers.

Every sample is one response; the stages add its fields column-wise to the same samples of
its iteration's store partition (:func:`iteration_partition`):

=============  =========================  ===============================================
field          written by                 what
=============  =========================  ===============================================
prompts        rollout (new samples)      int64 ``[Lp]``: the prompt, padded
responses      rollout                    jagged int64: the sampled tokens, ``EOS`` last
logprobs       rollout                    jagged float32: their log-probs when sampled
lengths        rollout                    int64: tokens in the response
version        rollout                    int64: the policy version that sampled it
rewards        reward worker              float32: :func:`grpo_task.sort_reward`
ref_logprobs   reference worker           jagged float32: log-probs under the warm start
=============  =========================  ===============================================

The ``G`` responses of one prompt are one group (the put's ``group_ids``; also
``custom_meta["group"]``, with ``custom_meta["total_lengths"]`` for the seqlen sampler).

* :class:`RolloutWorker` pulls the newest weights, samples ``G`` responses per prompt (KV
  cache, temperature, stop token), puts them as new samples and hands their meta to a
  reward worker chosen by the router (node affinity: one on its own node).
* :class:`RewardWorker` reads the samples of the meta it is given, scores them and puts
  ``rewards`` onto them.
* :class:`ReferenceWorker` fetches the samples new to its task ``reference`` (whole groups)
  and puts ``ref_logprobs`` onto them.

The train ranks are :class:`rayless.demo.grpo_trainer.GrpoTrainWorker`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch
from tensordict import TensorDict

from rayless.actors import Actor, ActorHandle
from rayless.actors.ext import apply_torch_threads, torch_threads
from rayless.demo import grpo_task as task
from rayless.demo.grpo_algo import evaluate, policy_ops
from rayless.demo.grpo_config import GrpoAlgoConfig
from rayless.demo.grpo_policy import PolicyOps
from rayless.demo.workers import worker_device
from rayless.transport.errors import RaylessError


def iteration_partition(base: str, iteration: int) -> str:
    """The store partition that holds iteration ``iteration``'s samples (``base-k``)."""
    return f"{base}-{iteration}"


FETCH_TIMEOUT = 300.0  # a stage waiting longer than this for its samples gives up
PULL_TIMEOUT = 300.0


def algo_of(params: dict[str, Any]) -> GrpoAlgoConfig:
    """The ``algo`` section back from the plain dict the driver sends to an actor."""
    return GrpoAlgoConfig(**params)


def policy_of(algo: GrpoAlgoConfig) -> tuple[PolicyOps, torch.nn.Module]:
    """The policy's operations (``algo.model``) and a fresh policy of the configured shape
    (weights come from the warm start)."""
    ops = policy_ops(algo)
    return ops, ops.build()


def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    """Per-sample 1-D tensors as one jagged nested tensor (the store keeps it ragged)."""
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def padded(value: torch.Tensor, fill: float) -> torch.Tensor:
    """A jagged batch as a dense ``[B, max_len]`` tensor."""
    return torch.nested.to_padded_tensor(value, fill)


async def in_thread(fn: Any, *args: Any) -> Any:
    """Run blocking torch work off the actor's loop (with the actor's torch thread count)."""

    def call() -> Any:
        apply_torch_threads(torch_threads())
        return fn(*args)

    return await asyncio.get_running_loop().run_in_executor(None, call)


class RolloutWorker(Actor):
    """Samples groups of responses with the current policy and puts them into the store."""

    def __init__(
        self,
        index: int,
        algo: dict[str, Any],
        seed: int,
        store_name: str,
        weights_name: str,
        partition: str,
        rewards: list[ActorHandle],
        routing: dict[str, Any],
        router_type: str,
    ) -> None:
        torch.set_num_threads(1)
        self.index = index
        self.algo = algo_of(algo)
        self.seed = seed
        self.env_id = f"env-{index}"  # the name the router and the episode table know
        self.device = worker_device()
        torch.manual_seed(seed * 1000 + index)  # HF generate samples from the global generator
        self.ops, policy = policy_of(self.algo)
        self.policy = policy.to(self.device).eval()
        self.generator = torch.Generator().manual_seed(seed * 1000 + index)
        self.eval_generator = torch.Generator().manual_seed(seed * 1000 + 500 + index)
        self.store_name = store_name
        self.weights_name = weights_name
        self.partition = partition
        self.rewards = rewards
        self.routing = routing
        self.router_type = router_type
        self.version = -1
        self.lock = asyncio.Lock()  # one generation (or weight pull) at a time
        self.store: Any = None
        self.weights: Any = None
        self.router: Any = None

    async def setup(self) -> None:
        from rayless.placement import create_router
        from rayless.store import Store
        from rayless.weights import WeightSync

        self.store = await Store.connect(self.store_name)
        self.weights = await WeightSync.connect(self.weights_name, cuda_ipc=False)
        self.router = create_router(
            "sync",
            self.router_type,
            self.rewards,
            component_distribution=self.routing,
            strict=False,
        )

    async def teardown(self) -> None:
        if self.weights is not None:
            await self.weights.aclose()

    async def pull_weights(self, min_version: int) -> dict[str, float]:
        """Load the newest published version >= ``min_version`` (in place); its interval."""
        async with self.lock:
            return await self._pull(min_version)

    async def _pull(self, min_version: int) -> dict[str, float]:
        t0 = time.time()
        target = self.ops.pull_target(self.policy)  # a module in place, or an engine's loader
        self.version = int(
            await self.weights.pull(min_version=min_version, timeout=PULL_TIMEOUT, **target)
        )
        return {"start": t0, "end": time.time(), "version": float(self.version)}

    def weight_loads(self) -> int:
        """Buckets this worker loaded through ``pull(into=...)`` (0: pulled in place)."""
        return int(getattr(self.ops, "loads", 0))

    async def rollout(self, iteration: int, min_version: int) -> dict[str, Any]:
        """Sample ``prompts_per_rollout`` groups with a policy version >= ``min_version`` (the
        newest there is), put them and have a reward worker score them; timings back."""
        a = self.algo
        async with self.lock:
            pull = None
            if self.version < min_version or self.version < await self.weights.latest_version():
                pull = await self._pull(min_version)
            version = self.version
            t_gen = time.time()
            prompts, _ = task.make_prompts(
                a.prompts_per_rollout, a.min_len, a.max_len, self.generator
            )
            prompts = self.ops.prompts(prompts.repeat_interleave(a.group_size, dim=0))
            gen = await in_thread(self._generate, prompts)
        t_put = time.time()
        n = prompts.shape[0]
        lengths = gen.lengths.cpu()
        td = TensorDict(
            {
                "prompts": prompts,
                "responses": jagged([gen.responses[i, : lengths[i]].cpu() for i in range(n)]),
                "logprobs": jagged([gen.logprobs[i, : lengths[i]].cpu() for i in range(n)]),
                "lengths": lengths,
                "version": torch.full((n,), version, dtype=torch.int64),
            },
            batch_size=[n],
        )
        groups = [f"r{self.index}-i{iteration}-p{i // a.group_size}" for i in range(n)]
        custom = [
            {
                "group": g,
                "iteration": iteration,
                "total_lengths": int(prompts.shape[1] + lengths[i]),
            }
            for i, g in enumerate(groups)
        ]
        meta = await self.store.put(
            td,
            iteration_partition(self.partition, iteration),
            env_ids=[self.env_id] * n,
            group_ids=groups,
            custom_meta=custom,
        )
        t_route = time.time()
        scorer = await self.router.aselect_policy(self.env_id)
        scored = await scorer.score(meta)
        return {
            "iteration": iteration,
            "worker": self.index,
            "version": version,
            "samples": n,
            "pull": pull,
            "generate": {"start": t_gen, "end": t_put},
            "put": {"start": t_put, "end": t_route},
            "reward": scored,
            "mean_length": float(lengths.float().mean()),
        }

    def _generate(self, prompts: torch.Tensor) -> Any:
        return self.ops.generate(
            self.policy,
            prompts.to(self.device),
            temperature=self.algo.temperature,
            generator=self.generator if self.device.type == "cpu" else None,
        )

    async def evaluate(self, prompts: torch.Tensor, min_version: int) -> dict[str, float]:
        """Mean reward and length of one sample per held-out prompt, with a version >=
        ``min_version``."""
        async with self.lock:
            if self.version < min_version:
                await self._pull(min_version)
            a = self.algo

            def run() -> tuple[float, float]:
                return evaluate(
                    self.policy,
                    prompts.to(self.device),
                    max_len=a.max_len,
                    temperature=a.temperature,
                    generator=self.eval_generator,
                    ops=self.ops,
                )

            reward, length = await in_thread(run)
            return {"reward": reward, "length": length, "version": float(self.version)}


class RewardWorker(Actor):
    """Scores responses with the task's verifier and adds ``rewards`` to their samples."""

    def __init__(self, index: int, store_name: str, algo: dict[str, Any] | None = None) -> None:
        torch.set_num_threads(1)
        self.index = index
        self.ops = policy_ops(algo_of(algo)) if algo is not None else None
        self.store_name = store_name
        self.store: Any = None
        self.scored = 0

    async def setup(self) -> None:
        from rayless.store import Store

        self.store = await Store.connect(self.store_name)

    async def score(self, meta: Any) -> dict[str, float]:
        """Read ``meta``'s prompts and responses, put their rewards; interval and mean."""
        t0 = time.time()
        td = await self.store.get(meta, ["prompts", "responses"])
        responses = list(td["responses"].unbind(0))
        prompts = td["prompts"]
        if self.ops is not None:  # the model's tokens as the task's (the verifier's) ids
            prompts = self.ops.task_ids(prompts)
            responses = [self.ops.task_ids(r) for r in responses]
        rewards = task.rewards_for(prompts, responses)
        await self.store.put(
            TensorDict({"rewards": rewards}, batch_size=[len(responses)]), meta=meta
        )
        self.scored += len(responses)
        return {
            "start": t0,
            "end": time.time(),
            "mean": float(rewards.mean()),
            "samples": float(len(responses)),
            "worker": float(self.index),
        }


class ReferenceWorker(Actor):
    """The frozen warm-start policy: adds ``ref_logprobs`` to the samples new to its task."""

    def __init__(
        self,
        algo: dict[str, Any],
        store_name: str,
        weights_name: str,
        partition: str,
        batch_size: int,
    ) -> None:
        torch.set_num_threads(1)
        self.algo = algo_of(algo)
        self.device = worker_device()
        self.ops, policy = policy_of(self.algo)
        self.policy = policy.to(self.device).eval()
        self.store_name = store_name
        self.weights_name = weights_name
        self.partition = partition
        self.batch_size = batch_size
        self.store: Any = None
        self.weights: Any = None

    async def setup(self) -> None:
        from rayless.store import Store
        from rayless.weights import WeightSync

        self.store = await Store.connect(self.store_name)
        self.weights = await WeightSync.connect(self.weights_name, cuda_ipc=False)

    async def teardown(self) -> None:
        if self.weights is not None:
            await self.weights.aclose()

    async def load(self, version: int) -> int:
        """Load exactly the weights of ``version`` (the warm start) and keep them."""
        got = int(await self.weights.pull(self.policy, version, PULL_TIMEOUT))
        if got != version:
            raise RaylessError(f"the reference needs version {version}, got {got}")
        return got

    async def process(self, iteration: int) -> dict[str, float]:
        """Fetch one iteration's worth of new samples (whole groups), put their reference
        log-probs; the interval."""
        meta = await self.store.get_meta(
            iteration_partition(self.partition, iteration),
            ["prompts", "responses", "lengths"],
            self.batch_size,
            task="reference",
            sampler={"name": "grouped", "n": self.algo.group_size},
            timeout=FETCH_TIMEOUT,
        )
        t0 = time.time()
        td = await self.store.get(meta)
        lengths = td["lengths"]
        responses = padded(td["responses"], float(self.ops.pad)).long()

        def run() -> torch.Tensor:
            with torch.no_grad():
                return self.ops.logprobs(
                    self.policy,
                    td["prompts"].to(self.device),
                    responses.to(self.device),
                    self.algo.temperature,
                ).cpu()

        ref = await in_thread(run)
        rows = [ref[i, : lengths[i]] for i in range(meta.size)]
        await self.store.put(TensorDict({"ref_logprobs": jagged(rows)}, [meta.size]), meta=meta)
        return {
            "start": t0,
            "end": time.time(),
            "samples": float(meta.size),
            "iteration": iteration,
        }
