"""A Ray ``ObjectRef`` inside a value travels with its outcome (``rayless.ray.object_ref``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest

from rayless import ray
from rayless.errors import ProtocolError, RemoteError
from rayless.ray.object_ref import ARRIVED, ObjectRef, put_ref
from rayless.transport import codec


def _round_trip(value: Any) -> Any:
    return codec.decode(codec.encode(value))


def _done(outcome: BaseException | None, value: Any = None) -> ObjectRef:
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    if outcome is None:
        fut.set_result(value)
    else:
        fut.set_exception(outcome)
    return ObjectRef(fut, 1, task=True)


def test_a_made_ref_arrives_as_a_done_ref_with_its_value_and_id() -> None:
    ref = put_ref({"x": [1, 2]}, 1)
    [back] = _round_trip([ref])
    assert type(back) is ObjectRef and back._generation == ARRIVED
    assert back.hex() == ref.hex()
    assert ray.get(back) == {"x": [1, 2]}  # no session here: the ref holds its value


def test_an_error_arrives_as_the_original_class_and_raises_at_get() -> None:
    [back] = _round_trip([_done(RemoteError.from_exception(KeyError("k")))])
    with pytest.raises(KeyError) as info:
        ray.get(back)
    assert isinstance(info.value, ray.exceptions.RayTaskError)
    [plain] = _round_trip([_done(ValueError("not a rayless error"))])
    with pytest.raises(ValueError, match="not a rayless error"):
        ray.get(plain)


def test_a_cancelled_ref_arrives_cancelled() -> None:
    fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
    fut.cancel()
    [back] = _round_trip([ObjectRef(fut, 1)])
    with pytest.raises(ray.exceptions.TaskCancelledError):
        ray.get(back)


def test_a_pending_ref_inside_a_value_is_a_type_error_naming_its_path() -> None:
    pending = ObjectRef(concurrent.futures.Future(), 1)
    with pytest.raises(TypeError, match=r"\[0\]\[1\].*ray\.wait or ray\.get it first"):
        codec.encode([[1, pending]])


def test_settled_waits_without_raising() -> None:
    async def main() -> None:
        fut = asyncio.get_running_loop().create_future()
        ref = ObjectRef(fut, 1)
        waiter = asyncio.ensure_future(ref.settled())
        await asyncio.sleep(0)
        assert not waiter.done()
        fut.set_exception(RemoteError.from_exception(KeyError("k")))
        await asyncio.wait_for(waiter, 10)  # done, not raising
        other: concurrent.futures.Future[Any] = concurrent.futures.Future()
        asyncio.get_running_loop().call_later(0.05, other.set_exception, ValueError("v"))
        await asyncio.wait_for(ObjectRef(other, 1).settled(), 10)

    asyncio.run(main())


@pytest.mark.parametrize(
    "state",
    [None, [], ["id", True, "value"], ["id", True, "error", "not an error"], [1, 0, "value", 2]],
)
def test_a_malformed_record_is_a_protocol_error(state: Any) -> None:
    from rayless.ray.object_ref import _ref_from_state

    with pytest.raises(ProtocolError):
        _ref_from_state(state)


def test_a_put_snapshot_is_a_copy_big_or_small() -> None:
    import threading

    import numpy as np
    import torch

    from rayless.ray.object_ref import snapshot

    big = np.arange(1 << 18, dtype=np.float64)  # 2 MiB: copied by torch
    small = torch.zeros(4)
    value = {"big": big, "small": small, "list": [1, {"k": "v"}]}
    copy = snapshot(value)
    big[0], value["list"][1]["k"] = -1.0, "changed"
    small.add_(1)
    assert copy["big"][0] == 0.0 and copy["big"].flags.writeable
    assert copy["small"].tolist() == [0.0] * 4 and copy["list"] == [1, {"k": "v"}]
    lock = threading.Lock()
    assert snapshot(lock) is lock and snapshot(7) == 7  # cannot travel: kept as it is
