"""verl users' habits on a real local cluster: a verl DataProto crosses to the workers and
back, locally defined functions and classes travel as code, a WorkerGroup is passed to an
actor. ``verl.protocol`` is the stand-in of tests/fake_verl (verl is not installed); the
actors find it through the driver's sys.path, which spawn passes on."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.actors.api.sync import SyncCluster
from rayless.single_controller import (
    ClassWithInitArgs,
    Dispatch,
    ResourcePool,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
    register,
)
from tests.integration.single_controller_classes import (
    ActorRole,
    GroupUser,
    ProtoWorker,
    TestActor,
)

FAKE_VERL = str(Path(__file__).resolve().parents[1] / "fake_verl")
if FAKE_VERL not in sys.path:
    sys.path.append(FAKE_VERL)

from verl.protocol import DataProto, DataProtoConfig  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[SyncCluster]:
    with Cluster.local_sync(nodes=1, gpus_per_node=2) as c:
        yield c


@pytest.fixture
def make_group(cluster: SyncCluster) -> Iterator:
    made: list[tuple[ResourcePool, WorkerGroup]] = []

    def make(cia: ClassWithInitArgs) -> WorkerGroup:
        pool = ResourcePool([2], use_gpu=False)
        wg = WorkerGroup(pool, cia, cluster=cluster)
        made.append((pool, wg))
        return wg

    yield make
    for pool, wg in made:
        for handle in wg.workers:
            cluster.kill(handle)
        pool.release()


def proto(n: int, padding: bool = False) -> DataProto:
    meta = {"step": 7, DataProtoConfig.auto_padding_key: True} if padding else {"step": 7}
    return DataProto.from_dict(
        tensors={"obs": torch.arange(n * 2).reshape(n, 2)},
        non_tensors={
            "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
            "extra": np.array([{"i": i, "tags": ["a", None]} for i in range(n)], dtype=object),
        },
        meta_info=meta,
    )


def test_a_verl_dataproto_crosses_to_the_workers_and_back(make_group) -> None:
    """It was refused (TypeError: cannot encode DataProto)."""
    wg = make_group(ClassWithInitArgs(ProtoWorker))
    out = wg.tag(proto(4))
    assert type(out) is DataProto and len(out) == 4
    assert out.batch["obs"].tolist() == (torch.arange(8).reshape(4, 2) + 1).tolist()
    assert list(out.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3"]
    assert list(out.non_tensor_batch["rank"]) == [0, 0, 1, 1]
    assert out.non_tensor_batch["extra"][3] == {"i": 3, "tags": ["a", None]}
    assert out.meta_info["seen_as"] == "verl.protocol.DataProto" and out.meta_info["step"] == 7
    padded = wg.tag(proto(3, padding=True))  # verl's auto padding: padded, then trimmed
    assert len(padded) == 3 and list(padded.non_tensor_batch["uid"]) == ["u0", "u1", "u2"]
    assert list(padded.non_tensor_batch["rank"]) == [0, 0, 1]


def test_local_functions_travel_as_code(make_group) -> None:
    """A local function, a lambda and a closure were refused (TypeError: functions go by name)."""
    wg = make_group(ClassWithInitArgs(TestActor, x=2))
    base = 100

    def local_add(a: int, b: int) -> int:
        return a + b + base

    assert wg.execute_func_rank_zero(local_add, 1, 2) == 103
    assert wg.execute_func_rank_zero(lambda: base * 2) == 200
    out = wg.execute_with_func_generator(
        lambda worker, data: TensorDict(
            {"a": data["a"] + base * worker.rank}, batch_size=data.batch_size
        ),
        TensorDict({"a": torch.arange(4)}, batch_size=[4]),
    )
    assert out["a"].tolist() == [0, 1, 102, 103]


def test_a_class_defined_in_a_test_is_fused(make_group) -> None:
    """A role class defined inside a function was refused (TypeError: must be importable)."""

    class LocalRole(Worker):
        def __init__(self, k: int) -> None:
            super().__init__()
            self.k = k

        @register(Dispatch.ONE_TO_ALL)
        def scaled(self, x: int) -> int:
            return x * self.k + len(self.fused_worker_dict)  # type: ignore[attr-defined]

        @register(Dispatch.ONE_TO_ALL)
        def actor_lr(self) -> float:
            return float(self.fused_worker_dict["actor"].lr)  # type: ignore[attr-defined]

    cia = create_colocated_worker_cls(
        {"actor": ClassWithInitArgs(ActorRole, lr=0.5), "local": ClassWithInitArgs(LocalRole, 3)}
    )
    wg = make_group(cia)
    assert wg.local_scaled(2) == [8, 8]
    views = wg.spawn(prefix_set={"actor", "local"})
    assert views["local"].actor_lr() == [0.5, 0.5]
    assert [w["lr"] for w in views["actor"].whoami()] == [0.5, 0.5]


def test_a_worker_group_is_passed_to_an_actor(cluster: SyncCluster, make_group) -> None:
    """It was refused (TypeError: cannot encode WorkerGroup)."""
    wg = make_group(ClassWithInitArgs(TestActor, x=2))
    protos = make_group(ClassWithInitArgs(ProtoWorker))
    user = cluster.spawn(GroupUser)
    try:
        assert user.call_sync.call(wg, 3, timeout=120) == {
            "names": wg.worker_names,
            "rank_zero": 6,
            "all": [5, 5],
            "one_to_all": [6, 6],
        }
        out = user.call_async.call(protos, proto(2), timeout=120)
        assert type(out) is DataProto and list(out.non_tensor_batch["rank"]) == [0, 1]
    finally:
        cluster.kill(user)
