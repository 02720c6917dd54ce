"""Packed writes: a put's rows as plain columns (dense tensor, flat ragged values + shapes,
plain lists), rebuilt on the unit with schemas derived from the data."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorStack, TensorDict

from rayless.store.data.packed import PACKED, is_packed, pack_columns, unpack_columns
from rayless.store.data.schema import split_columns
from rayless.store.errors import SchemaError


def batch(lengths: list[int]) -> TensorDict:
    n = len(lengths)
    return TensorDict(
        {
            "x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
            "resp": torch.nested.as_nested_tensor(
                [torch.arange(k) for k in lengths], layout=torch.jagged
            ),
            "img": torch.nested.as_nested_tensor(
                [torch.ones(k % 3 + 1, 2) for k in lengths], layout=torch.jagged
            ),
            "text": NonTensorStack.from_list([f"s{k}" for k in range(n)]),
        },
        [n],
    )


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if set(a) != set(b):
        return False
    for name in a:
        x, y = a[name], b[name]
        if x.schema != y.schema or x.sample_shapes != y.sample_shapes:
            return False
        if x.dense is not None and not torch.equal(x.dense, y.dense):
            return False
        for r, s in zip(x.rows or [], y.rows or [], strict=True):
            if (r != s) if isinstance(r, str) else not torch.equal(r, s):
                return False
    return True


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12), st.data())
def test_unpacked_columns_equal_the_tensordict_path(lengths: list[int], data: Any) -> None:
    cols = split_columns(batch(lengths))
    positions = data.draw(st.permutations(range(len(lengths))))
    packed = pack_columns(cols, list(positions))
    assert is_packed(packed)
    want = split_columns(batch([lengths[p] for p in positions]))
    want["text"].rows = [f"s{p}" for p in positions]
    want["x"].dense = cols["x"].dense[list(positions)]
    assert same(unpack_columns(packed, len(lengths)), want)


def test_forged_packed_writes_are_refused() -> None:
    good = pack_columns(split_columns(batch([2, 3])), [0, 1])
    flat = good["resp"]["values"]
    forged: list[dict[str, Any]] = [
        {**good, "n": 3},  # another sample count
        {**good, "x": {"kind": "dense", "t": torch.ones(3, 3)}},  # rows != n
        {**good, "x": {"kind": "dense", "t": "nope"}},
        {**good, "x": {"kind": "dense", "t": torch.ones(2, 2, dtype=torch.uint16)}},  # dtype
        {**good, "resp": {"kind": "jagged", "values": flat, "shapes": [[2], [4]]}},  # sum
        {**good, "resp": {"kind": "jagged", "values": flat, "shapes": [[5]]}},  # count
        {**good, "resp": {"kind": "jagged", "values": flat.view(1, -1), "shapes": [[2], [3]]}},
        {**good, "resp": {"kind": "jagged", "values": flat, "shapes": {"rank": 1, "n": 9}}},
        {**good, "img": {"kind": "jagged", "values": torch.ones(8), "shapes": [[2, 2], [1, 4]]}},
        {**good, "text": {"kind": "non_tensor", "values": ["a"]}},
        {**good, "text": {"kind": "non_tensor", "values": ["a", object()]}},
        {**good, "resp": {"kind": "sparse"}},
        {**good, "a..b": {"kind": "non_tensor", "values": ["a", "b"]}},
        {**good, "resp": [1, 2]},
    ]
    for bad in forged:
        with pytest.raises(SchemaError):
            unpack_columns(bad, 2)
    assert not is_packed(TensorDict({}, [2])) and not is_packed({PACKED: 2})
