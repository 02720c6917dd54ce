"""The codec: exact round trips, zero copy, path-naming TypeErrors, pickle opt-in, hostile input."""

from __future__ import annotations

import gc
import threading
import warnings
from collections import OrderedDict
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
import zmq
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict

import rayless.transport as transport
from rayless.actors.errors import ActorDiedError
from rayless.store.errors import StoreError
from rayless.transport import _tensors
from rayless.transport.codec import decode, encode, register_extension
from rayless.transport.errors import LimitError, ProtocolError, RaylessError, RemoteError, Timeout
from rayless.transport.protocol import pickle_allowed
from tests.unit.test_codec_helpers import assert_same

ALL_DTYPES = sorted(_tensors.DTYPES.values(), key=str)


def rt(obj: Any, **kw: Any) -> Any:
    """Encode then decode through bytes copies, the way a socket delivers them."""
    frames = encode(obj)
    return decode([bytes(f) for f in frames], **kw)


def address(buf: Any) -> int:
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


def test_exports() -> None:
    assert transport.encode is encode and transport.decode is decode
    assert transport.register_extension is register_extension


@pytest.mark.parametrize(
    "value",
    [
        None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**200, -(2**200), 1.5,
        float("inf"), float("nan"), "", "héllo ✓", b"", b"\x00\xff", [], (), {},
        [1, [2, [3, ()]]], (1, (2, [3])), ((),), {"a": (1, 2), "b": [1, 2]},
        {1: "int", (1, "t"): "tuple", b"k": "bytes", None: 0, 2.5: "f", False: "b"},
        {(1, (2, 3)): {"x": ({}, [])}}, OrderedDict([("b", 1), ("a", 2)]),
        ("call", "ping", (1, 2), {"k": "v"}),
        [torch.float32, torch.bfloat16, torch.float8_e5m2, torch.device("cpu"),
         torch.device("cuda", 1), torch.Size([2, 0, 3])],
    ],
)  # fmt: skip
def test_plain_values_round_trip(value: Any) -> None:
    assert_same(value, rt(value))


def test_bytearray_and_memoryview_arrive_as_bytes() -> None:
    assert rt([bytearray(b"ab"), memoryview(b"cd")]) == [b"ab", b"cd"]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype(dtype: torch.dtype) -> None:
    high = 2 if dtype == torch.bool else 256  # a bool byte other than 0/1 is not a bool
    t = torch.randint(0, high, (3, 5 * dtype.itemsize), dtype=torch.uint8).view(dtype)
    for value in (t, t[0, 0], t[:0], t.reshape(-1)[::2]):  # dense, 0-dim, empty, strided
        assert_same(value, rt(value))


def test_views_and_flags() -> None:
    base = torch.arange(60, dtype=torch.float64).reshape(3, 4, 5)
    for view in (base.transpose(0, 2), base[:, 1:3, ::2], base.expand(2, 3, 4, 5)[1], base[1]):
        assert_same(view.contiguous(), rt(view))
    c = torch.randn(4, dtype=torch.complex64)
    assert_same(c.conj().resolve_conj(), rt(c.conj()))
    assert_same(torch.neg(c.conj()).resolve_conj().resolve_neg(), rt(torch.neg(c.conj())))
    nan = torch.tensor([float("nan"), 1.0, float("-inf")])
    assert_same(nan, rt(nan))


def test_requires_grad_kept_history_dropped() -> None:
    leaf = torch.randn(3, requires_grad=True)
    out = rt({"leaf": leaf, "derived": leaf * 2, "param": torch.nn.Parameter(torch.ones(2))})
    assert out["leaf"].requires_grad and out["leaf"].is_leaf
    assert out["derived"].requires_grad and out["derived"].grad_fn is None
    assert type(out["param"]) is torch.Tensor and out["param"].requires_grad


def test_numpy_arrays_and_scalars() -> None:
    arrays = [np.arange(12, dtype=d).reshape(3, 4) for d in ("i1", "u2", "<i4", ">i8", "f2")]
    arrays += [np.array([True, False]), np.zeros((0, 3), np.complex128), np.float64(2.5)]
    arrays += [np.arange(6.0).reshape(2, 3).T, np.array(7, dtype=np.uint64), np.int16(-3)]
    for a in arrays:
        out = rt(a)
        assert_same(np.asarray(a).copy() if isinstance(a, np.ndarray) else a, out)
    with pytest.raises(TypeError, match=r"obj\[0\]: cannot encode numpy array of dtype <U1"):
        encode([np.array(["a"])])


def _td() -> TensorDict:
    td = TensorDict(
        {
            "obs": torch.randn(3, 4, 2),
            "act": torch.arange(12).reshape(3, 4),
            "sub": TensorDict({"x": torch.zeros(3, 4, 5, dtype=torch.bfloat16)}, [3, 4, 5]),
            "empty": TensorDict({}, [3, 4]),
        },
        batch_size=[3, 4],
        device="cpu",
    )
    td.names = ["env", "time"]
    td["sub"].names = ["env", "time", "inner"]
    td["note"] = NonTensorData("hello", batch_size=[3, 4])
    td["strs"] = NonTensorStack.from_list([[f"s{i}{j}" for j in range(4)] for i in range(3)])
    td["dicts"] = NonTensorStack.from_list(
        [[{"k": i, "j": [j]} for j in range(4)] for i in range(3)]
    )
    return td


def test_tensordict_variants() -> None:
    td = _td()
    out = rt(td)
    assert_same(td, out)
    assert out["sub"].names == ["env", "time", "inner"]
    assert out.get("strs").tolist()[2][3] == "s23"
    plain = TensorDict({"a": torch.ones(2)}, batch_size=[2])  # device None, no names
    assert_same(plain, rt(plain))
    assert rt(plain).device is None
    nested_only = TensorDict({"a": {"b": {"c": torch.ones(())}}}, batch_size=[])
    assert_same(nested_only, rt(nested_only))
    assert_same([td, (td,)], rt([td, (td,)]))


def test_non_tensor_stack_of_lists_keeps_structure() -> None:
    stack = NonTensorStack(NonTensorData([1, 2]), NonTensorData([3]), stack_dim=0)
    out = rt(stack)
    assert_same(stack, out)
    assert out.tolist() == [[1, 2], [3]]


def test_nested_tensors() -> None:
    jagged = torch.nested.nested_tensor(
        [torch.randn(2, 4), torch.randn(5, 4), torch.randn(0, 4)], layout=torch.jagged
    )
    out = rt(jagged)
    assert_same(jagged, out)
    assert out._ragged_idx == jagged._ragged_idx and torch.equal(out.offsets(), jagged.offsets())
    holes = torch.nested.narrow(
        torch.randn(3, 6), 1, torch.tensor([0, 1, 2]), torch.tensor([2, 3, 1]), layout=torch.jagged
    )
    out = rt(holes)
    assert out.lengths() is not None
    assert [x.tolist() for x in out.unbind()] == [x.tolist() for x in holes.unbind()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        strided = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])
        empty = torch.nested.nested_tensor([], dtype=torch.int16)
    assert_same(strided, rt(strided))
    assert_same(empty, rt(empty))
    td = TensorDict({"seq": jagged}, batch_size=[3])
    assert_same(td, rt(td))


class _ErrA(StoreError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"missing {key}")


@pytest.mark.parametrize(
    "exc",
    [
        RaylessError("boom"),
        Timeout("late"),
        ProtocolError("bad frame"),
        ActorDiedError("worker", pid=42, exitcode=-9, node="n1", reason="oom"),
        RemoteError("ValueError", "bad value", "Traceback...\n", actor="w"),
        _ErrA("k1"),
    ],
)
def test_errors_round_trip(exc: RaylessError) -> None:
    out = rt({"error": exc})["error"]
    assert type(out) is type(exc) and str(out) == str(exc)
    assert_same(exc, out)


def test_actor_died_and_remote_attributes() -> None:
    died = rt(ActorDiedError("w", pid=7, exitcode=3, node="n"))
    assert (died.actor, died.pid, died.exitcode, died.node) == ("w", 7, 3, "n")
    remote = rt(RemoteError("KeyError", "'x'", "tb text", actor="a"))
    assert remote.remote_type == "KeyError" and remote.remote_traceback == "tb text"
    assert "Remote traceback" in str(remote)


@pytest.mark.parametrize(
    ("value", "root", "message"),
    [
        ([1, {"obs": TensorDict({"foo": NonTensorData(range(2))}, [])}], "args",
         "args[1]['obs'].foo: cannot encode range"),
        ((0, [1, {"k": object()}]), "obj", "obj[1][1]['k']: cannot encode object"),
        ({range(0): 1}, "kw", "kw[range(0, 0)]: cannot encode range (as a dict key)"),
        ({3: torch.zeros(2).to_sparse()}, "obj", "obj[3]: cannot encode tensor with layout"),
        (lambda: [torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)], "obj",
         "obj[0]: cannot encode tensor of dtype torch.qint8"),
        ([LazyStackedTensorDict(TensorDict({}, []), TensorDict({}, []))], "obj",
         "obj[0]: cannot encode LazyStackedTensorDict"),
        ({"s": "\udcff"}, "obj", "obj['s']: cannot encode str that is not valid UTF-8"),
        (lambda: [1.0, np.matrix([[1]])], "obj",
         "obj[1]: cannot encode numpy array subclass matrix"),
    ],
)  # fmt: skip
def test_type_error_names_path(value: Any, root: str, message: str) -> None:
    with pytest.raises(TypeError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encode(value() if callable(value) else value, root=root)
    assert str(info.value).startswith(message)


def test_a_cycle_is_named_as_one_and_a_deep_path_is_cut_short() -> None:
    # the path finder walked a cycle down to its depth bound: a 1,500-character path of
    # "[0]"s that said "nested deeper than 500 levels"
    loop: list[Any] = [1]
    loop.append({"again": loop})
    with pytest.raises(TypeError) as info:
        encode([loop], root="result")
    assert str(info.value) == "result[0][1]['again']: list contains itself (a cycle cannot be sent)"
    shared = [1, 2]
    assert decode(encode([shared, shared])) == [[1, 2], [1, 2]]  # met twice, not a cycle
    deep: list[Any] = []
    for _ in range(3000):
        deep = [deep]
    with pytest.raises(TypeError) as info:
        encode(deep, root="result")
    text = str(info.value)
    assert len(text) < 200 and "...(489 levels)..." in text and "nested deeper than" in text


class _Point:
    def __init__(self, x: int, y: int) -> None:
        self.x, self.y = x, y

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Point) and (self.x, self.y) == (other.x, other.y)


class _SubPoint(_Point):
    pass


def test_pickle_is_opt_in_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        TypeError, match=r"obj\['p'\]: cannot encode _Point .*RAYLESS_ALLOW_PICKLE=1"
    ):
        encode({"p": _Point(1, 2)})
    frames = encode({"p": _Point(1, 2)}, allow_pickle=True)
    with pytest.raises(ProtocolError, match=r"does not allow pickle .*RAYLESS_ALLOW_PICKLE=1"):
        decode(frames)
    assert decode(frames, allow_pickle=True) == {"p": _Point(1, 2)}
    # cloudpickle, as Ray: a lambda (or a class of the script) travels too
    (fn,) = decode(encode([lambda v: v + 1], allow_pickle=True), allow_pickle=True)
    assert fn(1) == 2
    with pytest.raises(TypeError, match=r"obj\[0\]: cannot pickle"):
        encode([threading.Lock()], allow_pickle=True)
    # the cluster-wide opt-in: Client and Server read it when not told
    assert not pickle_allowed()
    monkeypatch.setenv("RAYLESS_ALLOW_PICKLE", "1")
    assert pickle_allowed() and not pickle_allowed(False)


def test_extension_registry() -> None:
    register_extension(_Point, "test.point", lambda p: (p.x, p.y), lambda s: _Point(*s))
    register_extension(_Point, "test.point", lambda p: (p.x, p.y), lambda s: _Point(*s))
    assert rt([_Point(1, 2), {"p": _Point(3, 4)}]) == [_Point(1, 2), {"p": _Point(3, 4)}]
    with pytest.raises(TypeError, match=r"obj\[0\]: cannot encode _SubPoint"):
        encode([_SubPoint(1, 2)])  # subclasses never match silently
    with pytest.raises(ValueError, match="taken"):
        register_extension(_SubPoint, "test.point", lambda p: 0, lambda s: 0)
    with pytest.raises(ValueError, match="already encodes"):
        register_extension(tuple, "test.tuple", lambda p: 0, lambda s: 0)
    header = msgpack.packb([msgpack.ExtType(16, b""), "test.nope", 1])
    with pytest.raises(ProtocolError, match="unknown extension"):
        decode([header])


def test_encode_shares_memory_with_large_tensor() -> None:
    big = torch.randn(16 << 20)  # 64 MiB
    frames = encode({"w": big})
    assert len(frames) == 2 and address(frames[1]) == big.data_ptr()
    arr = np.ones((1024, 1024))
    assert address(encode(arr)[1]) == arr.ctypes.data


def test_decode_is_backed_by_the_received_buffer() -> None:
    big = torch.arange(16 << 20, dtype=torch.int32)
    header, payload = encode(big)
    for buf in (bytes(payload), bytearray(payload), zmq.Frame(bytes(payload))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no non-writable-buffer warning
            out = decode([header, buf])
        assert out.data_ptr() == address(buf)
        del buf
        gc.collect()
        assert torch.equal(out, big)
        out[0] = -1  # writable
        assert out[0] == -1
    arr = np.arange(1 << 16, dtype=np.float32)
    header, payload = encode(arr)
    owned = bytes(payload)
    out_arr = decode([header, owned])
    assert out_arr.ctypes.data == address(owned) and out_arr.flags.writeable
    del owned
    gc.collect()
    np.testing.assert_array_equal(out_arr, arr)


def test_misaligned_buffer_is_copied_and_correct() -> None:
    t = torch.randn(4096, dtype=torch.float64)
    header, payload = encode(t)
    backing = bytearray(len(payload) + 1)
    backing[1:] = bytes(payload)
    view = memoryview(backing)[1:]
    out = decode([header, view])
    assert torch.equal(out, t) and out.data_ptr() % 8 == 0


def test_device_argument() -> None:
    t = torch.ones(3)
    assert rt(t, device="cpu").device.type == "cpu"
    assert rt(t, device="cuda").device.type == "cpu"  # CPU tensors stay on the CPU
    with pytest.raises(ValueError):
        rt(t, device="meta")


# --- hostile input ---------------------------------------------------------------------------

E = msgpack.ExtType


def _hdr(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"\xc1"],  # never-used msgpack byte
        [b"\x92\x01"],  # truncated
        [b"\x01\x02"],  # extra data
        [_hdr(E(99, b""))],
        [_hdr(E(1, b"x"))],
        [_hdr([1, E(1, b"")])],  # marker outside a record
        [_hdr({E(1, b""): 1})],
        [_hdr([E(7, b""), "float32", [2], 5, None, False]), b"\0" * 8],  # buffer index
        [_hdr([E(7, b""), "float32", [2], 0, None, False]), b"\0" * 8],  # index 0 is the header
        [_hdr([E(7, b""), "float32", [3], 1, None, False]), b"\0" * 8],  # length mismatch
        [_hdr([E(7, b""), "float32", [-1], 1, None, False]), b""],
        [_hdr([E(7, b""), "float32", [2**40, 2**40], 1, None, False]), b""],
        [_hdr([E(7, b""), "float32", [1] * 65, 1, None, False]), b"\0" * 4],
        [_hdr([E(7, b""), "evil", [1], 1, None, False]), b"\0" * 4],
        [_hdr([E(7, b""), "float32", "2", 1, None, False]), b"\0" * 8],
        [_hdr([E(7, b""), "float32", [2], 1, "tpu:0", False]), b"\0" * 8],
        [_hdr([E(7, b""), "int64", [1], 1, None, True]), b"\0" * 8],  # int requires_grad
        [_hdr([E(7, b"")])],
        [_hdr([E(9, b""), "|O8", [1], 1, False]), b"\0" * 8],
        [_hdr([E(12, b""), {"a": 1}, [2], None, None])],  # bad TD value
        [_hdr([E(12, b""), {1: 1}, [], None, None])],
        [_hdr([E(12, b""), {}, [], None, [1]])],
        [_hdr([E(13, b""), "x", [-2], None])],
        [_hdr([E(14, b""), [1, 2], 0])],
        [_hdr([E(14, b""), [], 0])],
        [_hdr([E(15, b""), "not a dict"])],
        [_hdr([E(2, b""), "not bytes"])],
        [_hdr([E(4, b""), "no_such_dtype"])],
        [_hdr([E(5, b""), "tpu:0:x"])],
        [_hdr([E(8, b""), "float32", False, *[0] * 12])],  # CUDA IPC without CUDA
        [_hdr([E(10, b""), 1, 2, None, 1])],
        [_hdr([E(17, b""), b"\x80\x05N."])],  # pickle refused by default
        [_hdr([E(17, b""), b"\x80\x05N.", 1])],
        [b"\x91" * 2000 + b"\x90"],  # deeper than msgpack's stack
        [_hdr("x"), object()],
    ],
)
def test_hostile_frames_raise_protocol_error(frames: list[Any]) -> None:
    try:
        decode(frames)
    except ProtocolError:
        return
    except Exception as exc:
        pytest.fail(f"{type(exc).__name__} leaked: {exc}")
    pytest.fail("no ProtocolError")


def test_unhashable_key_and_object_frame() -> None:
    with pytest.raises(ProtocolError):
        decode([b"\x81\x91\x01\x01"])  # {[1]: 1}
    with pytest.raises(ProtocolError):
        decode([object()])


def test_header_limit_and_tensordict_depth() -> None:
    with pytest.raises(LimitError):
        decode([b"\xc0" * 100], max_header=10)
    inner: Any = [E(12, b""), {}, [], None, None]
    for _ in range(130):
        inner = [E(12, b""), {"k": inner}, [], None, None]
    with pytest.raises(ProtocolError, match="nested deeper"):
        decode([_hdr(inner)])


def test_a_small_message_is_one_frame_of_plain_msgpack() -> None:
    # a budget that holds on any machine (it was a per-call time: it failed under load)
    msg = ("call", "ping", (1, 2), {"k": "v"})
    frames = encode(msg)
    assert len(frames) == 1
    assert len(bytes(frames[0])) <= 32  # msgpack of the tuple and an ext marker, no padding
    assert decode(frames) == msg
