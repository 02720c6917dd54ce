"""A PPO-style verl driver on rayless: actor and reference groups colocated on one pool, a
fused critic+reward group on another, DP_COMPUTE_PROTO calls, on a 2-node local cluster with
fake GPUs; and store-aware dispatch (ranks fetch their part of a BatchMeta themselves)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from tensordict import TensorDict

from rayless import store
from rayless.actors import Cluster
from rayless.actors.api.sync import SyncCluster
from rayless.single_controller import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerGroup,
    create_colocated_worker_cls,
)
from tests.integration.single_controller_classes import (
    OBS,
    PPOActor,
    PPOCritic,
    PPOReward,
    StoreWorker,
)

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def cluster() -> Iterator[SyncCluster]:
    with Cluster.local_sync(nodes=2, gpus_per_node=4) as c:
        yield c


def test_ppo_driver_on_shared_pools_with_a_fused_group(cluster: SyncCluster) -> None:
    actor_pool = ResourcePool([2, 2], max_colocate_count=2)  # actor + reference share GPUs
    critic_pool = ResourcePool([2, 2], max_colocate_count=1)
    groups: list[WorkerGroup] = []
    try:
        actor = WorkerGroup(actor_pool, ClassWithInitArgs(PPOActor), cluster=cluster)
        ref = WorkerGroup(actor_pool, ClassWithInitArgs(PPOActor, trainable=False), cluster=cluster)
        fused = WorkerGroup(
            critic_pool,
            create_colocated_worker_cls(
                {"critic": ClassWithInitArgs(PPOCritic), "reward": ClassWithInitArgs(PPOReward)}
            ),
            cluster=cluster,
        )
        groups += [actor, ref, fused]
        roles = fused.spawn(prefix_set={"critic", "reward"})
        critic, reward = roles["critic"], roles["reward"]
        actor.init_model()
        critic.init_model()
        # placement: actor and ref ranks share their GPUs, the critic has its own
        actor_places = [(h.node_id, g) for h, g in zip(actor.workers, _gpus(actor), strict=True)]
        assert actor_places == [
            (h.node_id, g) for h, g in zip(ref.workers, _gpus(ref), strict=True)
        ]
        assert len(set(actor_places)) == 4
        assert not set(actor_places) & {
            (h.node_id, g) for h, g in zip(fused.workers, _gpus(critic), strict=True)
        }

        gen = torch.Generator().manual_seed(7)
        rewards = []
        for _ in range(6):
            prompts = TensorDict({"obs": torch.randn(32, OBS, generator=gen)}, batch_size=[32])
            batch = actor.generate_sequences(prompts)
            batch.update(ref.compute_log_prob(batch))
            batch.update(critic.compute_values(batch))
            batch.update(reward.compute_rewards(batch))
            batch["returns"] = batch["rewards"]
            batch["advantages"] = batch["rewards"] - batch["values"]
            vf = critic.update_critic(batch)
            metrics = actor.update_actor(batch)
            assert [m["rank"] for m in metrics] == [0.0, 1.0, 2.0, 3.0] and len(vf) == 4
            rewards.append(float(batch["rewards"].mean()))
        weights = actor.weights()
        assert all(w == pytest.approx(weights[0]) for w in weights)  # DP ranks stayed in step
        assert weights[0] != pytest.approx(ref.weights()[0])  # the reference did not move
        assert len(rewards) == 6 and all(0.0 <= r <= 1.0 for r in rewards)
    finally:
        for wg in groups:
            for h in wg.workers:
                cluster.kill(h)
        actor_pool.release()
        critic_pool.release()


def _gpus(wg: WorkerGroup) -> list[str]:
    return wg.execute_all_sync("get_cuda_visible_devices")


def test_store_aware_dispatch_ranks_fetch_their_own_part(cluster: SyncCluster) -> None:
    """A registered method takes a BatchMeta: the group splits the meta by rank and each rank
    reads its part from the store; the controller never carries the tensors."""

    async def body() -> tuple[list[int], list[int], list[int]]:
        st = await store.Store.create(cluster.cluster, num_units=2, name="sc-store")
        pool = ResourcePool([2, 2], use_gpu=False)
        wg = None
        try:
            meta = await st.put(
                TensorDict({"x": torch.arange(8)}, batch_size=[8]), partition="train"
            )
            wg = await WorkerGroup.create(
                pool, ClassWithInitArgs(StoreWorker, "sc-store"), cluster=cluster.cluster
            )
            out_meta = await wg.double.aio(meta)
            assert isinstance(out_meta, type(meta)) and "y" in out_meta.field_names
            data = await st.get(out_meta, fields=["x", "y", "rank"])
            with pytest.raises(ValueError, match="6 rows does not split evenly over 4"):
                await wg.double.aio(meta.select(range(6)))
            return data["x"].tolist(), data["y"].tolist(), data["rank"].tolist()
        finally:
            if wg is not None:
                for h in wg.workers:
                    await cluster.cluster.kill(h)
            pool.release()
            await st.aclose()

    x, y, ranks = cluster.run(body(), timeout=240)
    assert x == list(range(8)) and y == [2 * v for v in x]
    assert ranks == [0, 0, 1, 1, 2, 2, 3, 3]
