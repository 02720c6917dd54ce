"""The GRPO demo's train ranks: warm start (SFT) and GRPO steps under DDP.

:class:`GrpoTrainWorker` is one rank of a torch.distributed group (gloo on CPU, nccl on
CUDA) around a DDP-wrapped policy. ``warm_start`` runs the supervised phase on noisy
demonstrations; ``train`` reads this rank's part of the next global batch through the store's
streaming loader (the controller's shared fetch of whole groups whose every field is ready:
prompts, responses, log-probs, rewards, reference log-probs), checks that every group is
whole, computes the group-normalised advantages and takes the GRPO step(s); rank 0 publishes
the weights (``publish_weights``) for the rollout workers.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rayless.actors import Actor
from rayless.demo import grpo_task as task
from rayless.demo.grpo_algo import group_advantages, grpo_step, warm_start
from rayless.demo.grpo_model import unwrap
from rayless.demo.grpo_workers import (
    FETCH_TIMEOUT,
    algo_of,
    in_thread,
    iteration_partition,
    padded,
    policy_of,
)
from rayless.demo.workers import free_port, join_process_group, worker_device

TRAIN_FIELDS = [
    "prompts",
    "responses",
    "logprobs",
    "lengths",
    "version",
    "rewards",
    "ref_logprobs",
]


def cast_floats(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``state`` with its floating tensors in ``dtype``; tied tensors stay one tensor."""
    done: dict[int, torch.Tensor] = {}
    out = {}
    for name, t in state.items():
        if not t.is_floating_point():
            out[name] = t
            continue
        key = t.data_ptr()
        if key not in done or done[key].shape != t.shape:
            done[key] = t.to(dtype)
        out[name] = done[key]
    return out


class GroupSplitError(RuntimeError):
    """A trainer batch held part of a group (the grouped fetch must return whole groups).
    The demo's own check, not part of the runtime's error tree (``rayless.errors``)."""


class GrpoTrainWorker(Actor):
    """One GRPO rank; ``init_distributed`` on every rank at once, ``warm_start``, ``train``."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        algo: dict[str, Any],
        seed: int,
        store_name: str,
        weights_name: str,
        partition: str,
        batch_size: int,
    ) -> None:
        torch.set_num_threads(1)
        self.rank = rank
        self.world_size = world_size
        self.algo = algo_of(algo)
        self.seed = seed
        self.store_name = store_name
        self.weights_name = weights_name
        self.partition = partition
        self.batch_size = batch_size  # the global batch of one iteration (all ranks)
        self.device = worker_device()
        self.ops: Any = None
        self.model: Any = None
        self.optimizer: Any = None
        self.store: Any = None
        self.weights: Any = None
        self.sampler: dict[str, Any] = {}

    def free_port(self) -> tuple[str, int]:
        """An address of this node and a free TCP port on it (for MASTER_ADDR/PORT)."""
        return free_port()

    def init_distributed(self, master_addr: str, master_port: int) -> str:
        """Join the process group and wrap a fresh policy in DDP (blocks until all join)."""
        from torch.nn.parallel import DistributedDataParallel

        backend = join_process_group(
            self.rank, self.world_size, master_addr, master_port, self.device
        )
        torch.manual_seed(self.seed)  # every rank starts from the same weights
        self.ops, policy = policy_of(self.algo)
        policy = policy.to(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.model = DistributedDataParallel(policy, device_ids=ids)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.algo.lr)
        return backend

    async def setup(self) -> None:
        from rayless.store import Store
        from rayless.weights import WeightSync

        self.store = await Store.connect(self.store_name)
        a = self.algo
        self.sampler = {"name": "grouped", "n": a.group_size}
        if a.sampler == "seqlen_balanced":
            self.sampler = {
                "name": "seqlen_balanced",
                "dp_size": self.world_size,
                "n": a.group_size,
            }
        if self.rank == 0:
            self.weights = await WeightSync.connect(self.weights_name, cuda_ipc=False)

    async def warm_start(self) -> dict[str, float]:
        """The supervised warm start on noisy demonstrations (DDP: the ranks' gradients are
        averaged); its interval and last loss."""
        a = self.algo
        gen = torch.Generator().manual_seed(self.seed * 7919 + self.rank)
        t0 = time.time()

        def run() -> float:
            return warm_start(
                self.model,
                steps=a.sft_steps,
                batch_size=a.sft_batch_size // self.world_size,
                lr=a.sft_lr,
                min_len=a.min_len,
                max_len=a.max_len,
                noise=a.sft_noise,
                generator=gen,
                ops=self.ops,
            )

        loss = await in_thread(run)
        return {"start": t0, "end": time.time(), "loss": float(loss)}

    async def publish_weights(self, version: int) -> dict[str, float]:
        """Publish the current weights as ``version`` (rank 0); the interval."""
        t0 = time.time()
        state = unwrap(self.model).state_dict()
        if self.algo.wire_dtype != "float32":
            state = cast_floats(state, getattr(torch, self.algo.wire_dtype))
        await self.weights.publish(state, version)
        return {"start": t0, "end": time.time()}

    async def train(self, iteration: int) -> dict[str, Any]:
        """Read this rank's part of the next global batch and take the GRPO step(s)."""
        from rayless.store.client.loader import StreamingLoader

        t0 = time.time()
        loader = StreamingLoader(  # the iteration's own partition: its rollout's groups only
            self.store,
            iteration_partition(self.partition, iteration),
            TRAIN_FIELDS,
            self.batch_size // self.world_size,
            task="train",
            dp_rank=self.rank,
            dp_size=self.world_size,
            sampler=self.sampler,
            start_step=iteration,
            timeout=FETCH_TIMEOUT,
        )
        td, meta = await loader.__anext__()
        t1 = time.time()
        groups = [str(c["group"]) for c in meta.custom_meta]
        sizes: dict[str, int] = {}
        for g in groups:
            sizes[g] = sizes.get(g, 0) + 1
        split = {g: n for g, n in sizes.items() if n != self.algo.group_size}
        if split:
            raise GroupSplitError(
                f"rank {self.rank} got part of groups {split} (iteration {iteration})"
            )
        batch = {
            "prompts": td["prompts"].to(self.device),
            "responses": padded(td["responses"], float(self.ops.pad)).long().to(self.device),
            "logprobs": padded(td["logprobs"], 0.0).to(self.device),
            "ref_logprobs": padded(td["ref_logprobs"], 0.0).to(self.device),
            "lengths": td["lengths"].to(self.device),
            "rewards": td["rewards"].to(self.device),
        }
        advantages = group_advantages(batch["rewards"], group_ids=groups)
        a = self.algo

        def run() -> dict[str, float]:
            stats: dict[str, float] = {}
            for _ in range(a.epochs):
                stats = grpo_step(
                    self.model,
                    self.optimizer,
                    batch,
                    group_size=a.group_size,
                    temperature=a.temperature,
                    clip=a.clip_coef,
                    beta=a.kl_coef,
                    max_grad_norm=a.max_grad_norm,
                    advantages=advantages,
                    ops=self.ops,
                )
            return stats

        stats = await in_thread(run)
        t2 = time.time()
        await self.store.clear(meta)
        versions = td["version"]
        return {
            **stats,
            "rank": self.rank,
            "samples": meta.size,
            "groups": len(sizes),
            "group_sizes": sorted(set(sizes.values())),
            "mean_reward": float(td["rewards"].mean()),
            "mean_length": float(td["lengths"].float().mean()),
            # the right answers' length: the prompt's digits and the stop token
            "answer_length": float(
                ((self.ops.task_ids(td["prompts"]) < task.NUM_DIGITS).sum(1) + 1).float().mean()
            ),
            "rollouts": sorted({int(c["iteration"]) for c in meta.custom_meta}),
            "min_version": int(versions.min()),
            "max_version": int(versions.max()),
            "fetch": {"start": t0, "end": t1},
            "step": {"start": t1, "end": t2},
        }

    async def teardown(self) -> None:
        import torch.distributed as dist

        if self.weights is not None:
            await self.weights.aclose()
        self.model = None  # DDP's reducer goes before the group (a later GC can hang in it)
        if dist.is_initialized():
            dist.destroy_process_group()
