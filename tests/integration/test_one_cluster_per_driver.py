"""A driver that started its own cluster (``actors.Cluster.local_sync``, as a verl port with
worker groups does) and then calls ``ray.init()`` or ``tq.init()`` stays on that cluster.

A process belongs to one cluster at a time: ``ray.init()`` used to start a second local
cluster there, which took the process over, so the driver's own worker group then failed
(``ActorDiedError: unreachable (unknown actor ...)``) and TransferQueue's store lived in the
other cluster. Each driver runs in its own interpreter (a newcomer's script, no ``__main__``
guard).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drivers import run_driver

pytestmark = pytest.mark.integration


def test_ray_init_in_a_driver_with_its_own_cluster_joins_it(tmp_path: Path) -> None:
    out = run_driver(
        """
        from rayless import actors, ray

        class Counter:
            def __init__(self):
                self.n = 0
            def add(self, k):
                self.n += k
                return self.n

        with actors.Cluster.local_sync(nodes=2) as cluster:
            mine = cluster.spawn(Counter)
            context = ray.init()
            print("same address", context.address_info["address"] == cluster.address)
            print("nodes", sorted(n["NodeID"] for n in ray.nodes()))

            @ray.remote
            def double(x):
                return 2 * x

            print("task", ray.get(double.remote(21)))
            ray.shutdown()
            print("mine after shutdown", cluster.get(mine.add.remote(5)))
        """,
        tmp_path,
    )
    assert out == [
        "same address True",
        "nodes ['node-0', 'node-1']",
        "task 42",
        "mine after shutdown 5",
    ]


@pytest.mark.slow  # a driver, its cluster, a store and its readers: 20-25 s on 2 cores
def test_a_worker_group_reads_and_writes_the_drivers_transfer_queue(tmp_path: Path) -> None:
    # verl's v1 trainer: KVBatchMeta chunks dispatched to a worker group (DP_COMPUTE_PROTO),
    # each rank reads its keys and writes a new field; the results concatenated
    out = run_driver(
        """
        import torch
        from tensordict import TensorDict
        from rayless import actors
        import rayless.transfer_queue as tq
        from rayless.single_controller import (
            ClassWithInitArgs, Dispatch, ResourcePool, Worker, WorkerGroup, register,
        )

        class Actor(Worker):
            def __init__(self):
                super().__init__()
                tq.init()

            @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
            def compute_log_prob(self, meta):
                data = tq.kv_batch_get(
                    keys=meta.keys, partition_id=meta.partition_id, select_fields=["input_ids"]
                )
                logp = data["input_ids"].to_padded_tensor(0).float() + 100 * self.rank
                fields = TensorDict({"old_log_probs": logp}, batch_size=len(meta.keys))
                tq.kv_batch_put(keys=meta.keys, partition_id=meta.partition_id, fields=fields)
                meta.fields = [*meta.fields, "old_log_probs"]
                return meta

        with actors.Cluster.local_sync(nodes=1, gpus_per_node=2) as cluster:
            tq.init()
            keys = [f"k{i}" for i in range(6)]
            ids = torch.arange(6).reshape(6, 1)
            meta = tq.kv_batch_put(
                keys=keys, partition_id="step0", fields=TensorDict({"input_ids": ids}, batch_size=6)
            )
            pool = ResourcePool([2], use_gpu=True)
            wg = WorkerGroup(pool, ClassWithInitArgs(Actor), cluster=cluster)
            out = wg.compute_log_prob(meta)
            print(type(out).__name__, out.keys == keys, out.fields)
            got = tq.kv_batch_get(keys=keys, partition_id="step0", select_fields="old_log_probs")
            print(got["old_log_probs"].to_padded_tensor(0).flatten().tolist())
            tq.close()
        """,
        tmp_path,
    )
    assert out == [
        "KVBatchMeta True ['input_ids', 'old_log_probs']",
        "[0.0, 1.0, 2.0, 103.0, 104.0, 105.0]",
    ]


def test_a_driver_that_leaves_its_cluster_before_exit_ends_quietly(tmp_path: Path) -> None:
    # the session's task workers went with the driver's cluster: nothing to give back at
    # exit (it printed "coroutine 'TaskPools.aclose' was never awaited")
    err: list[str] = []
    out = run_driver(
        """
        from rayless import actors, ray

        with actors.Cluster.local_sync(nodes=1) as cluster:
            ray.init()

            @ray.remote
            def one():
                return 1

            print(ray.get(one.remote()))
        print("left")
        """,
        tmp_path,
        err,
    )
    assert out == ["1", "left"]
    assert not [line for line in err if "never awaited" in line or "Traceback" in line], err
