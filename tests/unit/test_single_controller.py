"""rayless.single_controller without processes: register, the dispatch modes, splitting and
padding of batches, pools' bundles, group-method binding (verl's decorator and auto padding
tests, re-expressed)."""

from __future__ import annotations

import functools
import pickle
import threading
import uuid

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import ActorHandle, GpuView, NodeView
from rayless.placement import PlacementError
from rayless.single_controller import (
    MAGIC_ATTR,
    ClassWithInitArgs,
    Dispatch,
    Execute,
    FunctionRef,
    ResourcePool,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
    get_predefined_dispatch_fn,
    register,
    register_dispatch_mode,
    split_resource_pool,
)
from rayless.single_controller.decorator import (
    PADDING_SIZE_KEY,
    collect_rank_zero,
    concat,
    method_attrs,
    split_batches,
    trim,
)
from rayless.transport import decode, encode
from rayless.transport.errors import ProtocolError


class FakeGroup:
    """What the dispatch functions read of a group: its world size."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size


def td(n: int) -> TensorDict:
    return TensorDict({"a": torch.arange(n), "b": torch.arange(n).float() * 2}, batch_size=[n])


class DecoratedWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def dp_compute(self, data: TensorDict) -> TensorDict:
        return data

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
    def rank_zero(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, auto_padding=True)
    async def padded(self, data: TensorDict) -> TensorDict:
        return data

    @register(Dispatch.RANK_ZERO)
    def leader(self) -> int:
        return self.rank

    def plain(self) -> int:
        return 1


def test_register_records_verl_attributes_and_keeps_the_function() -> None:
    attrs = method_attrs(DecoratedWorker)
    assert attrs["dp_compute"].dispatch_mode is Dispatch.DP_COMPUTE_PROTO
    assert attrs["dp_compute"].execute_mode is Execute.ALL and attrs["dp_compute"].blocking
    assert attrs["rank_zero"].execute_mode is Execute.RANK_ZERO
    assert attrs["rank_zero"].blocking is False
    assert attrs["padded"].auto_padding is True
    assert "plain" not in attrs  # not registered: no group method
    # the inherited verl helpers are group methods too
    assert attrs["execute_func_rank_zero"].execute_mode is Execute.RANK_ZERO
    assert attrs["execute_with_func_generator"].dispatch_mode is Dispatch.DP_COMPUTE_PROTO_WITH_FUNC
    assert hasattr(DecoratedWorker.dp_compute, MAGIC_ATTR)
    w = DecoratedWorker()  # outside a group: rank 0 of 1; the method still works locally
    assert (w.rank, w.world_size) == (0, 1)
    assert w.rank_zero() == 0
    assert DecoratedWorker.dp_compute.__name__ == "dp_compute"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dispatch_mode": "DP_COMPUTE"}, TypeError),
        ({"dispatch_mode": {"dispatch_fn": len}}, TypeError),
        ({"dispatch_mode": {"dispatch_fn": len, "collect_fn": 3}}, TypeError),
        ({"execute_mode": "ALL"}, TypeError),
    ],
)
def test_register_refuses_malformed_modes(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        register(**kwargs)


def test_modes_are_verls_and_survive_pickling() -> None:
    names = [m.name for m in Dispatch.members()]
    for name in (
        "RANK_ZERO",
        "ONE_TO_ALL",
        "ALL_TO_ALL",
        "DP_COMPUTE",
        "DP_COMPUTE_PROTO",
        "DP_COMPUTE_PROTO_WITH_FUNC",
        "DP_COMPUTE_METRIC",
    ):
        assert name in names
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE_PROTO)) is Dispatch.DP_COMPUTE_PROTO
    assert Dispatch.register("DP_COMPUTE") is Dispatch.DP_COMPUTE
    with pytest.raises(ValueError):
        Dispatch.register("not a name")


def test_register_dispatch_mode_adds_a_named_mode_once() -> None:
    def dispatch(wg, *args, **kwargs):
        return args, kwargs

    def collect(wg, out):
        return sum(out)

    name = f"SUM_ALL_{uuid.uuid4().hex}"
    mode = register_dispatch_mode(name, dispatch, collect)
    assert getattr(Dispatch, name) is mode and mode.name == name
    assert get_predefined_dispatch_fn(mode)["collect_fn"] is collect
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode(name, dispatch, collect)


def test_one_to_all_and_dp_compute() -> None:
    wg = FakeGroup(3)
    fns = get_predefined_dispatch_fn(Dispatch.ONE_TO_ALL)
    args, kwargs = fns["dispatch_fn"](wg, 1, y=2)
    assert args == [[1, 1, 1]] and kwargs == {"y": [2, 2, 2]}
    dp = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE)
    assert dp["dispatch_fn"](wg, [1, 2, 3])[0] == ([1, 2, 3],)
    with pytest.raises(ValueError, match=r"one item per rank \(3\); argument 0 is a list of 2"):
        dp["dispatch_fn"](wg, [1, 2])
    with pytest.raises(ValueError, match="expected 3 outputs"):
        dp["collect_fn"](wg, [1])


def test_dp_compute_proto_splits_a_tensordict_and_concatenates_in_rank_order() -> None:
    wg = FakeGroup(4)
    fns = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO)
    args, kwargs = fns["dispatch_fn"](wg, td(8), other=td(8))
    assert [c.batch_size[0] for c in args[0]] == [2, 2, 2, 2]
    assert args[0][1]["a"].tolist() == [2, 3]
    assert kwargs["other"][3]["a"].tolist() == [6, 7]
    joined = fns["collect_fn"](wg, args[0])
    assert joined["a"].tolist() == list(range(8))
    assert joined["b"].dtype == torch.float32


def test_an_uneven_batch_raises_naming_the_sizes() -> None:
    """The issue's bug: 10 rows over 4 ranks were split 3/3/3/1 without a word."""
    with pytest.raises(ValueError, match=r"batch of 10 rows does not split evenly over 4 ranks"):
        split_batches(4, [td(10)], {})
    with pytest.raises(ValueError, match="one size"):
        split_batches(2, [td(4)], {"x": td(6)})
    with pytest.raises(TypeError, match="got int"):
        split_batches(2, [3], {})


def test_auto_padding_pads_with_the_first_rows_and_trims_the_result() -> None:
    """verl's test_auto_padding: an uneven batch is padded, the padding is removed again."""
    args, kwargs = split_batches(4, [td(10)], {}, auto_padding=True)
    assert kwargs[PADDING_SIZE_KEY] == 2
    assert [c.batch_size[0] for c in args[0]] == [3, 3, 3, 3]
    assert args[0][3]["a"].tolist() == [9, 0, 1]
    out = trim(concat(args[0]), kwargs[PADDING_SIZE_KEY])
    assert out["a"].tolist() == list(range(10))
    # a batch shorter than the ranks cycles its rows
    args, kwargs = split_batches(4, [td(1)], {}, auto_padding=True)
    assert [c["a"].tolist() for c in args[0]] == [[0], [0], [0], [0]]
    assert trim(concat(args[0]), kwargs[PADDING_SIZE_KEY])["a"].tolist() == [0]
    assert trim([1, 2, 3, 4], 1) == [1, 2, 3]


class Proto:
    """A verl DataProto-shaped batch: len, chunk, concat, padding, select_idxs."""

    def __init__(self, rows: list[int], padding: bool = False) -> None:
        self.rows = rows
        self._padding = padding

    def __len__(self) -> int:
        return len(self.rows)

    def chunk(self, chunks: int) -> list[Proto]:
        size = len(self.rows) // chunks
        return [Proto(self.rows[i * size : (i + 1) * size]) for i in range(chunks)]

    @staticmethod
    def concat(parts: list[Proto]) -> Proto:
        return Proto([r for p in parts for r in p.rows])

    def is_padding_enabled(self) -> bool:
        return self._padding

    def padding(self, padding_size: int) -> None:
        self.rows = self.rows + self.rows[:padding_size]

    def select_idxs(self, idxs: list[int]) -> Proto:
        return Proto([self.rows[i] for i in idxs])


def test_dataproto_shaped_batches_split_concat_and_pad_as_verl() -> None:
    wg = FakeGroup(2)
    fns = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO)
    args, _ = fns["dispatch_fn"](wg, Proto([1, 2, 3, 4]))
    assert [p.rows for p in args[0]] == [[1, 2], [3, 4]]
    assert fns["collect_fn"](wg, args[0]).rows == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="3 rows"):
        fns["dispatch_fn"](wg, Proto([1, 2, 3]))
    args, kwargs = fns["dispatch_fn"](wg, Proto([1, 2, 3], padding=True))  # verl's auto padding
    assert [p.rows for p in args[0]] == [[1, 2], [3, 1]]
    assert trim(fns["collect_fn"](wg, args[0]), kwargs[PADDING_SIZE_KEY]).rows == [1, 2, 3]


def module_level_add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_importable_functions_travel_by_name_others_by_value() -> None:
    """A lambda, a closure and a nested function were refused (TypeError): verl's tests and
    users define them locally. They travel by value now; module-level ones still by name."""
    ref = FunctionRef.of(module_level_add_one)
    back = decode(encode(ref))
    assert back == ref and back.pickled is None and back.load() is module_level_add_one
    offset = 10

    def nested(x: int) -> int:
        return x + offset

    for fn, arg, want in ((lambda x: x * 3, 2, 6), (nested, 1, 11)):
        shipped = decode(encode(FunctionRef.of(fn)))
        assert isinstance(shipped.pickled, bytes) and shipped.load()(arg) == want
    partial = decode(encode(FunctionRef.of(functools.partial(pow, 2))))
    assert partial.load()(5) == 32
    lock = threading.Lock()
    with pytest.raises(TypeError, match="uses_lock cannot travel to the workers"):

        def uses_lock() -> bool:
            return lock.locked()

        FunctionRef.of(uses_lock)
    fns = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    args, _ = fns["dispatch_fn"](FakeGroup(2), module_level_add_one, td(4))
    assert args[0] == [ref, ref] and args[1][1]["a"].tolist() == [2, 3]
    with pytest.raises(TypeError, match="function as its first argument"):
        fns["dispatch_fn"](FakeGroup(2), td(4))


def test_a_registered_method_gets_a_function_back_from_its_reference() -> None:
    scale = 4
    worker = DecoratedWorker()
    ref = decode(encode(FunctionRef.of(lambda w, x: x * scale)))
    assert worker.execute_with_func_generator(ref, 2) == 8
    assert worker.execute_func_rank_zero(FunctionRef.of(lambda: scale + 1)) == 5


def test_a_role_class_of_main_or_a_function_is_fused_by_value() -> None:
    """Such role classes were refused (TypeError: must be importable)."""
    Main = type("Main", (DecoratedWorker,), {"__module__": "__main__"})

    class Local(DecoratedWorker):
        def tag(self) -> str:
            return "local"

    cia = create_colocated_worker_cls(
        {"main": ClassWithInitArgs(Main), "local": ClassWithInitArgs(Local), "plain":
         ClassWithInitArgs(DecoratedWorker)}
    )  # fmt: skip
    specs = decode(encode(cia.args[0]))
    assert [s.pickled is not None for s in specs] == [True, True, False]
    loaded = [s.load() for s in specs]
    assert loaded[2] is DecoratedWorker and loaded[1]().tag() == "local"
    assert loaded[0].__qualname__ == "Main" and issubclass(loaded[0], DecoratedWorker)
    assert cia.raw_cls_dict["main"] is Main and cia.raw_cls_dict["local"] is Local
    lock = threading.Lock()

    class Unpicklable(DecoratedWorker):
        held = lock

    with pytest.raises(TypeError, match=r"role 'bad': .*Unpicklable.*cannot be pickled"):
        create_colocated_worker_cls({"bad": ClassWithInitArgs(Unpicklable)})


def local_dispatch_group() -> WorkerGroup:
    def two_to_all(wg: object, *args: object, **kwargs: object) -> tuple:
        return args, kwargs

    class Custom(Worker):
        @register(dispatch_mode={"dispatch_fn": two_to_all, "collect_fn": collect_rank_zero})
        def custom(self) -> int:
            return 1

    return WorkerGroup.from_detached(
        worker_handles=fake_handles(2), ray_cls_with_init=ClassWithInitArgs(Custom)
    )


def test_a_worker_group_travels_with_its_handles_and_dispatch() -> None:
    """A WorkerGroup was refused by the codec (cannot encode WorkerGroup)."""
    handles = [h.with_timeout(5.0) for h in fake_handles(2)]
    wg = WorkerGroup.from_detached(
        name_prefix="pp",
        worker_handles=handles,
        ray_cls_with_init=ClassWithInitArgs(DecoratedWorker),
    )
    back = decode(encode({"wg": wg}))["wg"]
    assert isinstance(back, WorkerGroup) and back.name_prefix == "pp"
    assert back.worker_names == wg.worker_names and back.world_size == 2
    assert back.method_names == wg.method_names
    assert [h.call_timeout for h in back.workers] == [5.0, 5.0]
    for name in wg.method_names:
        ours, theirs = getattr(wg, name), getattr(back, name)
        assert theirs.attrs == ours.attrs and theirs.role == ours.role
        d_ours, d_theirs = ours.dispatch_fn, theirs.dispatch_fn  # padded: a partial
        assert getattr(d_theirs, "func", d_theirs) is getattr(d_ours, "func", d_ours)
        assert theirs.collect_fn is ours.collect_fn
    out = back.dp_compute.dispatch_fn(back, td(4))
    assert [a["a"].tolist() for a in out[0][0]] == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match=r"obj: .*'custom' uses .*two_to_all.*from_detached"):
        encode(local_dispatch_group())


def test_a_bad_worker_group_record_is_a_protocol_error() -> None:
    from rayless.single_controller.worker_group import _group_from_state

    good = decode(encode(WorkerGroup.from_detached(worker_handles=fake_handles(1))))
    assert good.world_size == 1 and good.method_names == []
    for state in (
        [],
        {"prefix": "p"},
        {"prefix": "p", "workers": ["x"], "fused": 0, "sub_cls_name": "", "role": None,
         "methods": []},
        {"prefix": "p", "workers": [], "fused": 0, "sub_cls_name": "", "role": None,
         "methods": [["_x", "m", None, "ALL_TO_ALL", None, None, "ALL", True, False]]},
    ):  # fmt: skip
        with pytest.raises(ProtocolError):
            _group_from_state(state)


def fake_handles(n: int) -> list[ActorHandle]:
    return [
        ActorHandle(f"id{i}", f"w-{i}", "tcp://127.0.0.1:1", "DecoratedWorker") for i in range(n)
    ]


def test_a_group_binds_only_registered_methods() -> None:
    wg = WorkerGroup.from_detached(
        worker_handles=fake_handles(2), ray_cls_with_init=ClassWithInitArgs(DecoratedWorker)
    )
    assert wg.world_size == 2 and wg.worker_names == ["w-0", "w-1"]
    assert "dp_compute" in wg.method_names and "execute_func_rank_zero" in wg.method_names
    with pytest.raises(AttributeError, match=r"no group method 'plain'.*dp_compute"):
        wg.plain  # noqa: B018
    # verl's per-rank rule: lists of one item per rank are split, anything else broadcast
    calls = wg._per_rank(([1, 2],), {"y": [3, 4]})
    assert [(a, k) for _, a, k in calls] == [((1,), {"y": 3}), ((2,), {"y": 4})]
    calls = wg._per_rank(([1, 2, 3],), {})
    assert [a for _, a, _ in calls] == [([1, 2, 3],), ([1, 2, 3],)]
    plan, padding = wg._plan(wg.dp_compute, (td(4),), {})
    assert [a[0]["a"].tolist() for _, a, _ in plan] == [[0, 1], [2, 3]] and padding == 0
    plan, _ = wg._plan(wg.rank_zero, (), {})
    assert [h.name for h, _, _ in plan] == ["w-0"]
    plan, _ = wg._plan(wg.leader, (), {})  # Dispatch.RANK_ZERO: rank 0 only, its result
    assert [h.name for h, _, _ in plan] == ["w-0"] and wg._finish(wg.leader, [7], 0) == 7
    with pytest.raises(ValueError, match="5 rows does not split evenly over 2"):
        wg._plan(wg.dp_compute, (td(5),), {})
    plan, padding = wg._plan(wg.padded, (td(5),), {})
    assert padding == 1 and [a[0].batch_size[0] for _, a, _ in plan] == [3, 3]


def test_a_group_needs_a_sync_cluster_to_spawn() -> None:
    with pytest.raises(TypeError, match="SyncCluster"):
        WorkerGroup(ResourcePool([1]), ClassWithInitArgs(DecoratedWorker))
    with pytest.raises(TypeError, match="resource_pool, worker_handles or worker_names"):
        WorkerGroup()


def nodes(n: int, gpus: int, busy: set[tuple[str, int]] = frozenset()) -> list[NodeView]:
    def gpu(i: int, g: int) -> GpuView:
        return GpuView(g, f"GPU-{g}", "fake", 0, "", 0.0 if (f"node-{i}", g) in busy else 1.0)

    return [
        NodeView(
            f"node-{i}",
            None,
            None,
            None,
            True,
            8.0,
            0.0,
            tuple(gpu(i, g) for g in range(gpus)),
            gpus,
            gpus,
            True,
            0,
        )
        for i in range(n)
    ]


def test_pool_bundles_one_gpu_per_rank_on_distinct_nodes() -> None:
    pool = ResourcePool([2, 2], max_colocate_count=2)
    assert pool.world_size == 4 and pool.local_rank_list() == [0, 1, 0, 1]
    assert pool.local_world_size_list() == [2, 2, 2, 2]
    try:
        bundles = pool.choose("addr-a", nodes(2, 2))
        assert [(b.node_id, b.gpu_index) for b in bundles] == [
            ("node-0", 0),
            ("node-0", 1),
            ("node-1", 0),
            ("node-1", 1),
        ]
        slots = pool.slots("actor")
        assert [s.gpu_fraction for s in slots] == [0.5] * 4
        assert len({(s.node_id, s.gpu_indices) for s in slots}) == 4  # never 2 ranks per GPU
        # another pool of this process does not get the held GPUs
        with pytest.raises(PlacementError, match="no free live node"):
            ResourcePool([1]).choose("addr-a", nodes(2, 2))
        other = ResourcePool([1])
        assert other.choose("addr-b", nodes(1, 1))[0].gpu_index == 0  # another cluster
        other.release()
    finally:
        pool.release()
    again = ResourcePool([2])
    assert [b.gpu_index for b in again.choose("addr-a", nodes(1, 3, busy={("node-0", 0)}))] == [
        1,
        2,
    ]
    again.release()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([0],), "positive ints"),
        (([2.5],), "positive ints"),
        (([1], True, "", 0), "max_colocate_count"),
    ],
)
def test_pool_refuses_bad_input(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ResourcePool(*args)


def test_split_resource_pool_slices_the_bundles() -> None:
    pool = ResourcePool([4, 4], max_colocate_count=3)
    a, b = pool.split(4)
    c, d, e = split_resource_pool(pool, [2, 4, 2])
    assert (c.store, e.store) == ([2], [2])
    assert (a.world_size, b.world_size, d.store) == (4, 4, [2, 2])
    try:
        pool.choose("addr-s", nodes(2, 4))
        assert [(x.node_id, x.gpu_index) for x in b.bundles()] == [("node-1", i) for i in range(4)]
        assert [(x.node_id, x.gpu_index) for x in d.bundles()] == [
            ("node-0", 2),
            ("node-0", 3),
            ("node-1", 0),
            ("node-1", 1),
        ]
        assert a.max_colocate_count == 3
    finally:
        pool.release()
    with pytest.raises(ValueError, match="add up to 7"):
        split_resource_pool(pool, [3, 4])
    with pytest.raises(ValueError, match="parts of 3"):
        pool.split(3)


def test_a_process_that_never_imported_the_single_controller_decodes_a_group() -> None:
    """An actor process whose code never imported rayless.single_controller: the codec
    imports it for its records (a fixed list of names), so a group passed to it arrives."""
    import subprocess
    import sys

    wg = WorkerGroup.from_detached(
        worker_handles=fake_handles(2), ray_cls_with_init=ClassWithInitArgs(DecoratedWorker)
    )
    code = (
        "import sys, pickle\n"
        "import rayless.actors  # as in every actor process\n"
        "from rayless.transport import decode\n"
        "assert 'rayless.single_controller' not in sys.modules\n"
        "wg = decode(pickle.loads(sys.stdin.buffer.read()))\n"
        "print(type(wg).__name__, wg.world_size, wg.method_names)\n"
    )
    frames = [bytes(f) for f in encode(wg)]
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(frames), capture_output=True, check=True
    )
    assert out.stdout.decode().startswith("WorkerGroup 2 [")
    assert "dp_compute" in out.stdout.decode()
