"""verl's single-controller scenarios on a real local cluster (2 nodes, fake GPUs): worker
group basics, dispatch over ranks, rank env, an uneven split, driver functions to workers,
split resource pools, colocated groups on shared GPUs, fused roles, detached workers."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import ActorDiedError, Cluster
from rayless.actors.api.sync import SyncCluster
from rayless.placement import PlacementError
from rayless.single_controller import (
    ClassWithInitArgs,
    ResourcePool,
    WorkerGroup,
    create_colocated_worker_cls,
    split_resource_pool,
)
from rayless.transport import Timeout
from tests.integration.single_controller_classes import (
    ActorRole,
    CriticRole,
    DataWorker,
    Driver,
    TestActor,
    add_one,
    scale_by_rank,
)

pytestmark = pytest.mark.integration


class Groups:
    """The groups and pools of one test, torn down after it."""

    def __init__(self, cluster: SyncCluster) -> None:
        self.cluster = cluster
        self.pools: list[ResourcePool] = []
        self.groups: list[WorkerGroup] = []

    def pool(self, *args: Any, **kwargs: Any) -> ResourcePool:
        pool = ResourcePool(*args, **kwargs)
        self.pools.append(pool)
        return pool

    def group(self, pool: ResourcePool, cia: ClassWithInitArgs, **kwargs: Any) -> WorkerGroup:
        wg = WorkerGroup(pool, cia, cluster=self.cluster, **kwargs)
        self.groups.append(wg)
        return wg

    def close(self) -> None:
        for wg in self.groups:
            for handle in wg.workers:
                self.cluster.kill(handle)
        for pool in self.pools:
            pool.release()


@pytest.fixture(scope="module")
def cluster() -> Iterator[SyncCluster]:
    with Cluster.local_sync(nodes=2, gpus_per_node=4) as c:
        yield c


@pytest.fixture
def groups(cluster: SyncCluster) -> Iterator[Groups]:
    g = Groups(cluster)
    try:
        yield g
    finally:
        g.close()


def td(n: int) -> TensorDict:
    return TensorDict({"a": torch.zeros(n, dtype=torch.long)}, batch_size=[n])


def test_worker_group_basics(groups: Groups) -> None:
    """verl's test_basics, re-expressed: execute_all_sync/async, the four modes, a driver
    function on rank zero."""
    wg = groups.group(groups.pool([4]), ClassWithInitArgs(TestActor, x=2), name_prefix="basic")
    assert wg.world_size == 4
    assert wg.worker_names == [f"basic-{r}" for r in range(4)]
    assert wg.execute_all_sync("foo", y=3) == [5, 5, 5, 5]
    futures = wg.execute_all_async("foo", y=4)
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    assert groups.cluster.get(futures, timeout=60) == [6, 6, 6, 6]
    one_to_all = wg.foo_one_to_all(x=1, y=2)  # blocking=False: a future
    assert isinstance(one_to_all, concurrent.futures.Future)
    assert groups.cluster.get(one_to_all, timeout=60) == [5, 5, 5, 5]
    all_to_all = wg.foo_all_to_all(x=[1, 2, 3, 4], y=[5, 6, 7, 8])
    assert groups.cluster.get(all_to_all, timeout=60) == [8, 10, 12, 14]
    assert wg.foo_custom(x=[1, 2], y=[5, 6]) == [8, 10, 8, 10]
    assert wg.foo_rank_zero(x=1, y=2) == 5
    assert groups.cluster.get(wg.execute_rank_zero("foo", 1), timeout=60) == 3
    assert wg.execute_rank_zero_sync("foo", 2) == 4
    out = wg.execute_func_rank_zero(add_one, torch.ones(2, 2))
    torch.testing.assert_close(out, torch.ones(2, 2) + 1)
    with pytest.raises(AttributeError, match="no group method 'foo'"):
        wg.foo  # noqa: B018  (not registered: execute_all_sync("foo") only)
    with pytest.raises(ValueError, match="rank 2 refuses"):  # a rank's error, as itself
        wg.fail_on(2)


def test_call_timeout_bounds_every_rank_call(groups: Groups) -> None:
    wg = groups.group(
        groups.pool([2], use_gpu=False), ClassWithInitArgs(TestActor, x=0), call_timeout=2.0
    )
    assert wg.nap(0) == [0, 1]
    with pytest.raises(Timeout):
        wg.nap(600)
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        WorkerGroup(None, None, worker_handles=wg.workers, colour="red")
    WorkerGroup(None, None, worker_handles=wg.workers, device_name="cuda")  # verl's, accepted


@pytest.mark.parametrize("face", ["call", "execute_all_sync", "get"])
def test_a_dead_rank_fails_a_blocking_call_at_once(groups: Groups, face: str) -> None:
    """The others block for 60 s (in a real collective: forever); the blocking call waited
    for every rank before it reported the dead one (``.aio`` failed at once)."""
    wg = groups.group(groups.pool([3], use_gpu=False), ClassWithInitArgs(TestActor, x=0))
    calls = {
        "call": lambda: wg.collective(1, 60.0),
        "execute_all_sync": lambda: wg.execute_all_sync("collective", 1, 60.0),
        "get": lambda: groups.cluster.get(wg.execute_all_async("collective", 1, 60.0)),
    }
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        blocking = pool.submit(calls[face])
        with pytest.raises(ActorDiedError) as info:
            blocking.result(timeout=20)  # a TimeoutError here: it waited for the others
    assert info.value.exitcode == 3


def test_ranks_get_their_env_and_one_gpu_each_over_two_nodes(groups: Groups) -> None:
    wg = groups.group(groups.pool([2, 2], max_colocate_count=1), ClassWithInitArgs(TestActor, x=0))
    places = wg.place()
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    assert {p["world_size"] for p in places} == {4}
    assert [p["LOCAL_RANK"] for p in places] == ["0", "1", "0", "1"]
    assert len({p["node"] for p in places[:2]}) == 1 and places[0]["node"] != places[2]["node"]
    assert len({(p["node"], p["gpus"]) for p in places}) == 4  # one GPU per rank
    assert all(p["gpus"] for p in places)
    assert {p["MASTER_PORT"] for p in places} != {None}
    assert {p["WG_PREFIX"] for p in places} == {wg.name_prefix}


def test_dispatch_over_ranks_uneven_split_padding_metrics_and_futures(groups: Groups) -> None:
    wg = groups.group(groups.pool([2, 2]), ClassWithInitArgs(DataWorker, worker_id=10))
    out = wg.add(td(8))
    assert out["a"].tolist() == [10, 10, 11, 11, 12, 12, 13, 13]
    with pytest.raises(ValueError, match="batch of 10 rows does not split evenly over 4 ranks"):
        wg.add(td(10))
    padded = wg.add_padded(td(10))  # 12 rows sent, the 2 padded ones dropped again
    assert padded["a"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert wg.metrics(td(8)) == [{"rank": float(r), "rows": 2.0} for r in range(4)]
    later = wg.add_later(td(4))
    assert isinstance(later, concurrent.futures.Future)
    # a future of one group call is an argument of the next
    assert wg.add(later)["a"].tolist() == [11, 12, 13, 14]
    chained = wg.execute_with_func_generator(scale_by_rank, out)
    assert chained["a"].tolist() == [100, 100, 111, 111, 122, 122, 133, 133]
    assert wg.all_reduce(1.5) == [6.0] * 4  # torch.distributed over the group's env


def test_two_groups_on_one_pool_share_gpus_but_never_within_a_group(groups: Groups) -> None:
    """The issue's bug: two gpus=0.5 groups put ranks 0 and 1 of the same group on one GPU."""
    pool = groups.pool([2], max_colocate_count=2)
    a = groups.group(pool, ClassWithInitArgs(TestActor, x=0))
    b = groups.group(pool, ClassWithInitArgs(TestActor, x=0))
    pa, pb = a.place(), b.place()
    assert len({p["gpus"] for p in pa}) == 2 and len({p["gpus"] for p in pb}) == 2
    assert [(p["node"], p["gpus"]) for p in pa] == [(p["node"], p["gpus"]) for p in pb]
    with pytest.raises(PlacementError, match="not enough free GPUs"):
        groups.group(pool, ClassWithInitArgs(TestActor, x=0))  # a third: over max_colocate_count
    nodes = {n["node_id"]: n for n in groups.cluster.nodes()}
    assert sum(4 - n["gpus_free"] for n in nodes.values()) == 2  # the failed group left nothing


def test_split_resource_pool(groups: Groups) -> None:
    """verl's test_split_resource_pool on a [4, 4] pool."""
    whole = groups.pool([4, 4])
    actor_pool, critic_pool = split_resource_pool(whole, 4)
    w1 = groups.group(actor_pool, ClassWithInitArgs(DataWorker, worker_id=0))
    w2 = groups.group(actor_pool, ClassWithInitArgs(DataWorker, worker_id=100))
    critic = groups.group(critic_pool, ClassWithInitArgs(TestActor, x=0))
    assert w1.world_size == w2.world_size == critic.world_size == 4
    assert w1.add(td(8))["a"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert w2.add(td(8))["a"].tolist() == [100, 100, 101, 101, 102, 102, 103, 103]
    nodes_1 = {h.node_id for h in w1.workers}
    nodes_c = {p["node"] for p in critic.place()}
    assert len(nodes_1) == 1 and len(nodes_c) == 1 and nodes_1 != nodes_c


def test_a_pool_larger_than_the_cluster_fails_clearly(groups: Groups) -> None:
    with pytest.raises(PlacementError, match="no free live node for 5 GPU bundles"):
        groups.group(groups.pool([5]), ClassWithInitArgs(TestActor, x=0))


def test_a_failing_constructor_kills_the_other_ranks(groups: Groups) -> None:
    with pytest.raises(TypeError, match="'x'"):  # the constructor's own error, as itself
        groups.group(groups.pool([2]), ClassWithInitArgs(TestActor), name_prefix="broken")
    nodes = groups.cluster.nodes()
    alive = [a["name"] for n in nodes for a in n["actors"] if a["state"] == "alive"]
    assert not [name for name in alive if name.startswith("broken")]
    assert sum(4 - n["gpus_free"] for n in nodes) == 0


def test_fused_roles_run_in_the_same_processes(groups: Groups) -> None:
    """verl's test_colocated_workers(_fused): actor and critic in one process per rank."""
    fused_cls = create_colocated_worker_cls(
        {
            "actor": ClassWithInitArgs(ActorRole, lr=0.1),
            "critic": ClassWithInitArgs(CriticRole, scale=3),
        }
    )
    wg = groups.group(groups.pool([2]), fused_cls)
    roles = wg.spawn(prefix_set={"actor", "critic"})
    actor, critic = roles["actor"], roles["critic"]
    a, c = actor.whoami(), critic.whoami()
    assert [x["role"] for x in a] == ["actor", "actor"] and c[0]["scale"] == 3
    assert [x["pid"] for x in a] == [x["pid"] for x in c]  # same processes
    assert [x["rank"] for x in c] == [0, 1]
    assert wg.actor_whoami()[0]["lr"] == 0.1  # verl's prefixed names on the fused group
    values = critic.compute_values(TensorDict({"a": torch.arange(4)}, batch_size=[4]))
    assert values["v"].tolist() == [0.0, 3.0, 6.0, 9.0]
    assert actor.update_actor(td(4))["a"].tolist() == [1, 1, 1, 1]
    assert actor.peer_steps() == [1, 1]  # the critic's state, read in-process
    with pytest.raises(AttributeError, match="no group method 'compute_values'"):
        actor.compute_values  # noqa: B018
    assert critic.execute_all_sync("whoami")[0]["role"] == "critic"


def test_from_detached_in_another_actor_and_here(groups: Groups) -> None:
    """verl's detached-worker and remote_call_wg scenarios."""
    wg = groups.group(groups.pool([2], use_gpu=False), ClassWithInitArgs(TestActor, x=2))
    driver = groups.cluster.spawn(Driver)
    try:
        result = driver.drive.call(wg.worker_names, timeout=120)
        assert result == {
            "names": wg.worker_names,
            "custom": [8, 10],
            "rank_zero": 5,
            "all": [3, 3],
        }
        assert driver.drive_sync.call(wg.workers, timeout=120) == [12, 12]
    finally:
        groups.cluster.kill(driver)
    here = WorkerGroup.from_detached(
        worker_names=wg.worker_names,
        ray_cls_with_init=ClassWithInitArgs(TestActor, x=2),
        cluster=groups.cluster,
    )
    assert here.foo_rank_zero(x=0, y=1) == 3


def test_from_detached_takes_every_verl_spelling(groups: Groups) -> None:
    """``cls_with_init=`` was refused (TypeError); verl's older positional order too."""
    wg = groups.group(groups.pool([2], use_gpu=False), ClassWithInitArgs(TestActor, x=2))
    cia = ClassWithInitArgs(TestActor, x=2)
    names, c = wg.worker_names, groups.cluster
    spelled = [
        WorkerGroup.from_detached(worker_names=names, cls_with_init=cia, cluster=c),
        WorkerGroup.from_detached(worker_names=names, ray_cls_with_init=cia, cluster=c),
        WorkerGroup.from_detached(names, cia, cluster=c),  # older verl: (worker_names, cia)
        WorkerGroup.from_detached("p", None, wg.workers, None, cls_with_init=cia, device_name="x"),
        c.run(WorkerGroup.afrom_detached(names, cls_with_init=cia, cluster=c.cluster)),
    ]
    for group in spelled:
        assert group.worker_names == names and group.foo_rank_zero(x=0, y=1) == 3
    with pytest.raises(TypeError, match="not two different"):
        WorkerGroup.from_detached(
            worker_handles=wg.workers,
            ray_cls_with_init=cia,
            cls_with_init=ClassWithInitArgs(TestActor, x=1),
        )
    with pytest.raises(TypeError, match="unexpected keyword"):
        WorkerGroup.from_detached(worker_handles=wg.workers, cls_with_init=cia, colour="red")


def test_the_awaitable_face(cluster: SyncCluster, groups: Groups) -> None:
    async def body() -> list[Any]:
        pool = groups.pool([2])
        wg = await WorkerGroup.create(pool, ClassWithInitArgs(DataWorker), cluster=cluster.cluster)
        groups.groups.append(wg)
        with pytest.raises(RuntimeError, match="aio"):
            wg.add(td(2))  # the blocking face inside a loop
        out = await wg.add.aio(td(4))
        fut = wg.metrics.submit(td(2))
        return [out["a"].tolist(), await fut, await wg.aexecute_rank_zero("get_node_id")]

    got = cluster.run(body(), timeout=120)
    assert got[0] == [0, 0, 1, 1] and [m["rank"] for m in got[1]] == [0.0, 1.0]
    assert got[2].startswith("node-")
