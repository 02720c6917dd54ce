"""numpy object arrays and verl's DataProto travel without pickle (``transport._foreign``).

``verl.protocol`` here is the stand-in of tests/fake_verl (verl is not installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from rayless.transport.codec import decode, encode
from rayless.transport.errors import ProtocolError

FAKE_VERL = str(Path(__file__).resolve().parents[1] / "fake_verl")
if FAKE_VERL not in sys.path:
    sys.path.append(FAKE_VERL)

from verl.protocol import DataProto  # noqa: E402


def rt(obj: Any) -> Any:
    return decode([bytes(f) for f in encode(obj)])


class Opaque:
    pass


def test_object_arrays_round_trip_item_by_item() -> None:
    strings = np.array(["a", "bc", None, 3, 2.5], dtype=object)
    nested = np.empty(3, dtype=object)
    nested[:] = [[1, 2], {"k": (1, "x")}, np.arange(3)]
    grid = np.array([["a", 1], [None, [2]]], dtype=object)
    for a in (strings, nested, grid, np.empty((0, 2), dtype=object)):
        out = rt(a)
        assert type(out) is np.ndarray and out.dtype == object and out.shape == a.shape
        for x, y in zip(a.ravel(), out.ravel(), strict=True):
            if isinstance(x, np.ndarray):
                assert np.array_equal(x, y)
            else:
                assert x == y and type(x) is type(y)


def test_an_object_array_item_the_codec_refuses_is_named_by_its_path() -> None:
    a = np.array(["ok", Opaque()], dtype=object)
    with pytest.raises(TypeError, match=r"obj\['uid'\]\[1\]: cannot encode Opaque"):
        encode({"uid": a})
    grid = np.array([[1, 2], [3, Opaque()]], dtype=object)
    with pytest.raises(TypeError, match=r"obj\[1,1\]: cannot encode Opaque"):
        encode(grid)


def test_a_bad_object_array_record_is_a_protocol_error() -> None:
    ext = msgpack.ExtType(16, b"")  # the EXT record marker
    for state in ([[3], [1, 2]], [[-1], []], ["x", []], [[2]]):
        header = msgpack.packb([ext, "numpy.object_array", state])
        with pytest.raises(ProtocolError):
            decode([header])


def dp(n: int = 4) -> DataProto:
    return DataProto.from_dict(
        tensors={"obs": torch.arange(n * 2.0).reshape(n, 2)},
        non_tensors={
            "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
            "reward_extra": np.array([{"acc": i} for i in range(n)], dtype=object),
            "score": np.arange(n),
        },
        meta_info={"temperature": 0.7, "global_steps": 3},
    )


def assert_same_dp(a: DataProto, b: DataProto) -> None:
    assert type(b) is DataProto and len(a) == len(b)
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert b.batch is not None and torch.equal(a.batch["obs"], b.batch["obs"])
    assert set(a.non_tensor_batch) == set(b.non_tensor_batch)
    for k, v in a.non_tensor_batch.items():
        assert b.non_tensor_batch[k].dtype == v.dtype and list(b.non_tensor_batch[k]) == list(v)
    assert a.meta_info == b.meta_info


def test_a_dataproto_round_trips_without_pickle() -> None:
    for value in (dp(), DataProto(non_tensor_batch={"x": np.array([1, None], dtype=object)})):
        assert_same_dp(value, rt(value))
    out = rt({"data": [dp(2)]})
    assert_same_dp(dp(2), out["data"][0])


def test_a_dataproto_with_an_item_the_codec_refuses_names_its_path() -> None:
    bad = dp(2)
    bad.non_tensor_batch["extra"] = np.array([1, Opaque()], dtype=object)
    with pytest.raises(
        TypeError, match=r"args\[0\]\.non_tensor_batch\['extra'\]\[1\]: cannot encode Opaque"
    ):
        encode((bad,), root="args")


def test_a_dataproto_where_verl_is_missing_is_a_protocol_error_and_imports_nothing() -> None:
    """The receiver imports verl.protocol only for a DataProto record; without verl it is a
    ProtocolError, and neither the codec nor a record name makes it import anything else."""
    frames = [bytes(f) for f in encode(dp(2))]
    code = (
        "import sys, pickle\n"
        "from rayless.transport.codec import decode\n"
        "frames = pickle.loads(sys.stdin.buffer.read())\n"
        "assert 'verl' not in sys.modules\n"
        "sys.modules['verl'] = None  # missing here, even where verl is installed\n"
        "try:\n"
        "    decode(frames)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    import pickle

    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(frames), capture_output=True, check=True
    )
    assert b"ProtocolError" in out.stdout and b"verl.protocol cannot be imported" in out.stdout


def test_importing_the_codec_never_imports_verl() -> None:
    code = "import sys; import rayless.transport.codec; print('verl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert out.stdout.strip() == b"False"


def test_an_unknown_extension_name_is_refused() -> None:
    header = msgpack.packb([msgpack.ExtType(16, b""), "os.system", ["true"]])
    with pytest.raises(ProtocolError, match="unknown extension"):
        decode([header])


def test_namespaces_travel_by_their_attributes() -> None:
    """``argparse.Namespace`` (the ``args`` OpenRLHF hands its actors) and
    ``types.SimpleNamespace`` arrive as themselves, their values decoded as any value."""
    import argparse
    import types

    args = argparse.Namespace(lr=1e-5, micro_batch=4, ranks=[0, 1], bias=torch.ones(2))
    out = rt({"args": args})["args"]
    assert type(out) is argparse.Namespace and out.ranks == [0, 1] and out.lr == 1e-5
    assert torch.equal(out.bias, torch.ones(2))
    inner = types.SimpleNamespace(a=1, nested=argparse.Namespace(b="x"), weird={"k-1": 2})
    out = rt([inner])[0]
    assert type(out) is types.SimpleNamespace and out == inner
    with pytest.raises(TypeError, match=r"obj\.opt\[0\]: cannot encode Opaque"):
        encode(argparse.Namespace(opt=[Opaque()]))


def test_a_bad_namespace_record_is_a_protocol_error() -> None:
    ext = msgpack.ExtType(16, b"")
    for state in ([1, 2], {1: 2}, "x"):
        header = msgpack.packb([ext, "argparse.Namespace", state])
        with pytest.raises(ProtocolError, match=r"argparse\.Namespace"):
            decode([header])


def test_a_plain_class_is_refused_with_what_travels_instead() -> None:
    with pytest.raises(TypeError, match=r"cannot encode Opaque \(values travel without pickle: "):
        encode([Opaque()])
    with pytest.raises(TypeError, match=r"obj\[0\]: cannot encode object$"):
        encode([object()])
