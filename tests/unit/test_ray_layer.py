"""``rayless.ray``'s pure parts: placement group planning, the error mapping, option checks,
the decorators' spellings (no cluster)."""

from __future__ import annotations

import builtins
import importlib
import importlib.util

import pytest

from rayless import ray
from rayless.actors.api.remote_errors import materialize
from rayless.errors import ActorDiedError as RaylessDied
from rayless.errors import PlacementError, RemoteError, Timeout
from rayless.ray import exceptions
from rayless.ray.options import ACTOR_OPTIONS, TASK_OPTIONS, check
from rayless.ray.util.placement_group import Bundle, plan


def _node(node_id: str, gpus: int, cpus: float = 8) -> dict[str, object]:
    return {
        "node_id": node_id,
        "alive": True,
        "cpus": cpus,
        "gpus": [{"index": i, "free": 1.0} for i in range(gpus)],
    }


NODES = [_node("a", 2), _node("b", 2)]
FREE = {"a": {0: 1.0, 1: 1.0}, "b": {0: 1.0, 1: 1.0}}


def test_pack_fills_one_node_first() -> None:
    got = plan([{"GPU": 1}, {"GPU": 1}, {"GPU": 1}], "PACK", NODES, FREE)
    assert got is not None
    assert [n for n, _ in got] == ["a", "a", "b"]


def test_spread_and_strict_spread() -> None:
    got = plan([{"CPU": 1}, {"CPU": 1}], "SPREAD", NODES, FREE)
    assert got is not None and {n for n, _ in got} == {"a", "b"}
    assert plan([{"CPU": 1}] * 3, "STRICT_SPREAD", NODES, FREE) is None


def test_strict_pack_needs_one_node() -> None:
    assert plan([{"GPU": 1}] * 3, "STRICT_PACK", NODES, FREE) is None
    got = plan([{"GPU": 1}] * 2, "STRICT_PACK", NODES, FREE)
    assert got is not None and len({n for n, _ in got}) == 1


def test_fractional_bundles_pack_onto_one_gpu() -> None:
    got = plan([{"GPU": 0.5}, {"GPU": 0.5}], "STRICT_PACK", NODES, FREE)
    assert got is not None and got[0][1] == got[1][1] and list(got[0][1].values()) == [0.5]
    assert plan([{"GPU": 1}], "PACK", NODES, {"a": {0: 0.4, 1: 0.0}, "b": {0: 0.0, 1: 0.9}}) is None


def test_a_bundle_shares_its_gpu_between_fractional_members() -> None:
    b = Bundle({"GPU": 1}, "a", {1: 1.0})
    assert b.take(0.5, 0) == (1,) and b.take(0.5, 0) == (1,)
    with pytest.raises(PlacementError, match="no room"):
        b.take(0.5, 0)
    b.give_back(0.5, (1,))
    assert b.take(0.25, 0) == (1,)


def test_errors_map_to_rays_and_keep_rayless_detail() -> None:
    died = RaylessDied("w", pid=1, exitcode=-9, cause="killed by SIGKILL")
    mapped = exceptions.map_error(died)
    assert isinstance(mapped, exceptions.ActorDiedError) and isinstance(mapped, RaylessDied)
    assert mapped.cause == "killed by SIGKILL" and "SIGKILL" in str(mapped)
    oom = exceptions.map_error(RaylessDied("w", cause="killed by the kernel's OOM killer"))
    assert isinstance(oom, exceptions.OutOfMemoryError)
    assert isinstance(exceptions.map_error(died, task=True), exceptions.WorkerCrashedError)
    timeout = exceptions.map_error(Timeout("late"))
    assert isinstance(timeout, exceptions.GetTimeoutError) and isinstance(timeout, TimeoutError)
    remote = exceptions.map_error(RemoteError("builtins.ValueError", "bad"))
    assert isinstance(remote, exceptions.RayTaskError) and type(remote).__name__.startswith(
        "RayTaskError("
    )
    plain = ValueError("x")
    assert exceptions.map_error(plain) is plain


def test_unsupported_options_are_named() -> None:
    with pytest.raises(ValueError, match="unknown or unsupported"):
        check({"num_tpus": 1}, ACTOR_OPTIONS, "actor")
    # a newcomer's typo names the option meant
    with pytest.raises(ValueError, match=r"\['num_gpu'\]; 'num_gpu' \(did you mean 'num_gpus'\?\)"):
        check({"num_gpu": 1}, TASK_OPTIONS, "task")
    with pytest.raises(ValueError, match=r"did you mean 'max_restarts'\?"):
        check({"max_restart": 2}, ACTOR_OPTIONS, "actor")
    with pytest.raises(ValueError, match="lifetime must be"):
        check({"lifetime": "forever"}, ACTOR_OPTIONS, "actor")
    assert check({"lifetime": "detached"}, ACTOR_OPTIONS, "actor")
    with pytest.raises(ValueError, match="custom resources"):
        check({"resources": {"TPU": 1}}, TASK_OPTIONS, "task")
    with pytest.raises(ValueError, match="pip"):
        check({"runtime_env": {"pip": ["x"]}}, TASK_OPTIONS, "task")
    assert check({"resources": {"node:10.0.0.1": 0.01}}, TASK_OPTIONS, "task")


def test_remote_spellings() -> None:
    @ray.remote
    def f() -> int:
        return 1

    @ray.remote(num_returns=2)
    def g() -> tuple[int, int]:
        return 1, 2

    assert isinstance(f, ray.RemoteFunction) and isinstance(g, ray.RemoteFunction)
    with pytest.raises(TypeError, match="directly"):
        f()
    with pytest.raises(TypeError):
        ray.remote(1, 2)
    assert f.options(num_returns="streaming")._options["num_returns"] == "streaming"
    with pytest.raises(ValueError, match="dynamic"):
        f.options(num_returns="dynamic")
    with pytest.raises(ValueError, match="unsupported"):
        ray.init(no_such_keyword=1)


def test_setup_and_teardown_of_a_ray_class_are_its_own_methods() -> None:
    # rayless runs a class's setup()/teardown() itself only for Cluster.spawn; a Ray class's
    # are plain methods (a Ray trainer's setup(config) was refused at decoration)
    class Worker:
        def setup(self, config: dict[str, int]) -> None:
            pass

        def teardown(self) -> None:
            pass

    actor_class = ray.remote(Worker)
    assert {"setup", "teardown"} <= actor_class._methods.keys()


class Outer:
    class Inner:
        pass


@ray.remote
class Decorated:
    pass


def test_a_decorated_class_is_shown_by_its_own_name() -> None:
    from rayless.actors.api.actor import class_name

    hidden = Decorated._ray_cls
    assert hidden.__qualname__ == "Decorated._ray_cls"  # what an actor process imports
    assert class_name(hidden) == "Decorated" == Decorated.__qualname__
    assert class_name(Outer.Inner) == "Outer.Inner" and class_name(Outer) == "Outer"


def test_a_queue_record_is_checked_and_travels_only_when_it_can() -> None:
    from rayless.actors import ActorHandle
    from rayless.ray.util import queue as rq
    from rayless.transport import codec
    from rayless.transport.errors import ProtocolError

    for bad in ([1], [1, "not a handle"], ["1", None], {"maxsize": 1}):
        with pytest.raises(ProtocolError):
            rq._from_state(bad)
    q = rq.Queue.__new__(rq.Queue)
    q.maxsize, q.actor = 3, None  # shut down
    with pytest.raises(TypeError, match="once its actor has started"):
        codec.encode(q)
    q.actor = ActorHandle("a1", "queue", "tcp://127.0.0.1:1", "_QueueActor")
    got = codec.decode(codec.encode([q]))[0]
    assert isinstance(got, rq.Queue) and got.maxsize == 3
    assert isinstance(got.actor, ray.actor.ActorHandle) and got.actor._inner.actor_id == "a1"


def test_actors_start_from_the_light_template_when_neither_torch_nor_numpy_is_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from rayless.actors import Template
    from rayless.ray.options import template_for

    for name in ("torch", "numpy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert template_for() is Template.LIGHT
    for name in ("torch", "numpy"):
        monkeypatch.setitem(sys.modules, name, sys)
        assert template_for() is Template.TORCH
        monkeypatch.delitem(sys.modules, name)


def test_collective_backends_and_calls_outside_an_actor() -> None:
    from rayless.ray.util import collective as col
    from rayless.ray.util.collective.types import Backend

    assert Backend("gloo") == Backend("torch_gloo") == Backend.GLOO == "GLOO"
    assert Backend("nccl") == Backend.NCCL
    with pytest.raises(ValueError, match="Unrecognized backend"):
        Backend("mpi")
    assert col.gloo_available()
    for call in (
        lambda: col.init_collective_group(2, 0, backend="gloo", group_name="g"),
        lambda: col.get_rank("g"),
        lambda: col.barrier("g"),
    ):
        with pytest.raises(RuntimeError, match="only used inside a Ray actor or task"):
            call()
    assert not col.is_group_initialized("g")


async def test_a_collective_groups_rendezvous_keys_live_in_its_meeting_actor() -> None:
    # the store gloo and NCCL meet through (no TCPStore port): set/get/wait, their deadlines,
    # and the counters and compare-and-set torch's helpers use
    import asyncio

    from rayless.ray.util.collective.collective import _CollectiveInfo

    info = _CollectiveInfo()
    waiting = asyncio.ensure_future(info.get_key("rank/1", 5))
    await asyncio.sleep(0)
    await info.set_key("rank/1", b"addr")
    assert await waiting == b"addr"
    with pytest.raises(TimeoutError, match="rank/2"):
        await info.wait_keys(["rank/1", "rank/2"], 0.05)
    assert await info.add_key("n", 2) == 2 and await info.add_key("n", 3) == 5
    assert await info.compare_set("c", b"", b"x") == b"x"
    assert await info.compare_set("c", b"y", b"z") == b"x"  # not the expected value: kept
    assert await info.compare_set("missing", b"y", b"z") == b"y"
    assert await info.check_keys(["c", "n"]) and not await info.check_keys(["nope"])
    assert await info.delete_key("c") and not await info.delete_key("c")
    assert await info.num_keys() == 2


_BUILTIN_ERRORS = sorted(
    (
        v
        for v in vars(builtins).values()
        if isinstance(v, type) and issubclass(v, Exception) and v.__module__ == "builtins"
    ),
    key=lambda t: t.__name__,
)


@pytest.mark.parametrize("kind", _BUILTIN_ERRORS, ids=lambda t: t.__name__)
def test_a_remote_error_of_every_builtin_type_maps_to_ray_task_error(kind: type) -> None:
    """Before: a task's MemoryError crashed ray.get with "MemoryError.__new__(RayTaskError(
    MemoryError)) is not safe" (its own __new__ refuses a class mixed with another base)."""
    remote = materialize(RemoteError(f"builtins.{kind.__name__}", "boom"))
    mapped = exceptions.map_error(remote)
    assert isinstance(mapped, exceptions.RayTaskError), kind
    assert "boom" in str(mapped)
    if isinstance(remote, kind):  # rebuilt as the original type: the Ray error is one too
        assert isinstance(mapped, kind) or type(mapped) is exceptions.RayTaskError, kind
    if kind is MemoryError:
        assert isinstance(mapped, MemoryError) and mapped.args == remote.args


def test_plain_remote_errors_keep_their_own_type_names() -> None:
    """Before: the first plain RemoteError's mixed class (cached by class alone) named every
    later one: a KeyboardInterrupt raised in a method showed as RayTaskError(StopAsyncIteration)."""
    names = [
        type(exceptions.map_error(RemoteError(f"builtins.{t}", "x"))).__name__
        for t in ("StopAsyncIteration", "KeyboardInterrupt", "ExceptionGroup", "KeyboardInterrupt")
    ]
    assert names == [
        "RayTaskError(StopAsyncIteration)",
        "RayTaskError(KeyboardInterrupt)",
        "RayTaskError(ExceptionGroup)",
        "RayTaskError(KeyboardInterrupt)",
    ]


# Ray 2.60's exception classes (python/ray/exceptions.py) and their bases, by name; the
# compiled-graph and channel ones are left out (rayless has no compiled graphs)
RAY_EXCEPTIONS = {
    "RayError": ("Exception",),
    "RaySystemError": ("RayError",),
    "RayTaskError": ("RayError",),
    "RayActorError": ("RayError",),
    "ActorDiedError": ("RayActorError",),
    "ActorUnavailableError": ("RayActorError",),
    "ActorUnschedulableError": ("RayError",),
    "TaskUnschedulableError": ("RayError",),
    "WorkerCrashedError": ("RayError",),
    "NodeDiedError": ("RayError",),
    "LocalRayletDiedError": ("RayError",),
    "RpcError": ("RayError",),
    "GetTimeoutError": ("RayError", "TimeoutError"),
    "TaskCancelledError": ("RayError",),
    "ObjectLostError": ("RayError",),
    "ObjectFetchTimedOutError": ("ObjectLostError",),
    "OwnerDiedError": ("ObjectLostError",),
    "ObjectFreedError": ("ObjectLostError",),
    "ObjectReconstructionFailedError": ("ObjectLostError",),
    "ReferenceCountingAssertionError": ("ObjectLostError", "AssertionError"),
    "ObjectStoreFullError": ("RayError",),
    "OutOfDiskError": ("RayError",),
    "OutOfMemoryError": ("RayError",),
    "RuntimeEnvSetupError": ("RayError",),
    "PendingCallsLimitExceeded": ("RayError",),
    "AsyncioActorExit": ("RayError",),
    "TaskPlacementGroupRemoved": ("RayError",),
    "ActorPlacementGroupRemoved": ("RayError",),
    "ActorAlreadyExistsError": ("ValueError", "RayError"),
    "ActorHandleNotFoundError": ("ValueError", "RayError"),
    "CrossLanguageError": ("RayError",),
    "PlasmaObjectNotAvailable": ("RayError",),
    "ObjectRefStreamEndOfStreamError": ("RayError",),
    "UnserializableException": ("RayError",),
    "UserCodeException": ("RayError",),
    "AuthenticationError": ("RayError",),
}


def test_every_ray_exception_class_is_there_with_rays_bases() -> None:
    """Code that names Ray's exceptions imports and runs (NeMo-RL's table of infrastructure
    errors lists a dozen at import time: ``ray.exceptions.NodeDiedError`` was an
    AttributeError); where Ray is installed, the table is checked against it."""
    for name, bases in RAY_EXCEPTIONS.items():
        cls = getattr(exceptions, name)
        assert tuple(b.__name__ for b in cls.__bases__) == bases, name
        assert name in exceptions.__all__ and getattr(ray.exceptions, name) is cls
    if importlib.util.find_spec("ray") is None:
        return  # (pip install -e '.[bench]' brings Ray)
    real = importlib.import_module("ray.exceptions")
    for name, bases in RAY_EXCEPTIONS.items():
        assert tuple(b.__name__ for b in getattr(real, name).__bases__) == bases, name
