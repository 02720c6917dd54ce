"""Exact-equality helper for codec tests: types, dtypes, shapes, NaN-aware values, TD metadata."""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _raw(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().resolve_conj().resolve_neg()
    return t.view(_INTS.get(t.dtype.itemsize, t.dtype)).contiguous()


def _tensor_same(a: torch.Tensor, b: torch.Tensor, path: str) -> None:
    assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} != {b.dtype}"
    assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
    if a.is_nested:
        assert b.is_nested and a.layout == b.layout, f"{path}: nested layout"
        ua, ub = a.unbind(), b.unbind()
        assert len(ua) == len(ub), f"{path}: nested length"
        for i, (x, y) in enumerate(zip(ua, ub, strict=True)):
            _tensor_same(x, y, f"{path}<{i}>")
        return
    assert a.shape == b.shape, f"{path}: shape {a.shape} != {b.shape}"
    assert a.requires_grad == b.requires_grad, f"{path}: requires_grad"
    x, y = _raw(a), _raw(b)
    # Bit-exact: NaNs (and their payloads), -0.0, float8 and sub-byte types all compare.
    if not torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)):
        raise AssertionError(f"{path}: values differ:\n{x}\n{y}")


def assert_same(a: Any, b: Any, path: str = "obj") -> None:
    """Assert ``a`` and ``b`` are the same value of the same types, recursively."""
    if isinstance(a, NonTensorStack):
        assert type(b) is NonTensorStack, f"{path}: {type(b)} is not NonTensorStack"
        assert a.batch_size == b.batch_size and a.stack_dim == b.stack_dim, path
        assert_same(a.tolist(), b.tolist(), path)
        return
    assert type(a) is type(b) or (type(a) is torch.nn.Parameter and type(b) is torch.Tensor), (
        f"{path}: type {type(a).__name__} != {type(b).__name__}"
    )
    if isinstance(a, torch.Tensor):
        _tensor_same(a, b, path)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {a.dtype}{a.shape}"
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, TensorDict):
        assert a.batch_size == b.batch_size, f"{path}: batch_size"
        assert a.device == b.device, f"{path}: device {a.device} != {b.device}"
        assert a.names == b.names, f"{path}: names {a.names} != {b.names}"
        assert sorted(a.keys()) == sorted(b.keys()), f"{path}: keys"
        for key in a.keys():  # noqa: SIM118 (TensorDict iteration)
            assert_same(a.get(key), b.get(key), f"{path}.{key}")
    elif isinstance(a, NonTensorData):
        assert a.batch_size == b.batch_size and a.device == b.device, path
        assert_same(a.data, b.data, f"{path}.data")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, (dict, OrderedDict)):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    elif isinstance(a, BaseException):
        assert a.args == b.args and vars(a) == vars(b), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
