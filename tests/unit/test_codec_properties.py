"""Property tests: random nested values and TensorDicts round-trip; random input never leaks."""

from __future__ import annotations

from typing import Any

import msgpack
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rayless.transport.codec import decode, encode
from rayless.transport.errors import ProtocolError
from tests.unit.test_codec_helpers import assert_same

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
]  # fmt: skip


@st.composite
def tensors(draw: st.DrawFn, batch: tuple[int, ...] = ()) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    extra = draw(st.lists(st.integers(0, 4), max_size=3))
    shape = (*batch, *extra)
    n = 1
    for d in shape:
        n *= d
    high = 2 if dtype == torch.bool else 256
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, high, (n * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    t = raw.view(dtype).reshape(shape)
    if not batch and t.dim() >= 2 and draw(st.booleans()):
        t = t.transpose(0, -1)  # a non-contiguous view
    return t


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**100), 2**100)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
keys = st.none() | st.booleans() | st.integers() | st.text(max_size=4) | st.binary(max_size=4)
hashable = st.recursive(keys, lambda kids: st.tuples(kids, kids), max_leaves=4)
values = st.recursive(
    scalars | tensors(),
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.lists(kids, max_size=4).map(tuple)
        | st.dictionaries(hashable, kids, max_size=4)
    ),
    max_leaves=12,
)


def _expected(value: Any) -> Any:
    """What decode should produce: non-contiguous views arrive contiguous."""
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, list):
        return [_expected(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_expected(v) for v in value)
    if isinstance(value, dict):
        return {k: _expected(v) for k, v in value.items()}
    return value


@SETTINGS
@given(values)
def test_nested_values_round_trip(value: Any) -> None:
    out = decode([bytes(f) for f in encode(value)])
    assert_same(_expected(value), out)


@st.composite
def tensordicts(draw: st.DrawFn, prefix: tuple[int, ...] = (), depth: int = 0) -> TensorDict:
    batch = prefix + tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    source: dict[str, Any] = {}
    for key in draw(st.lists(st.text("abcxyz_", min_size=1, max_size=4), max_size=4, unique=True)):
        if depth < 2 and draw(st.integers(0, 3)) == 0:
            source[key] = draw(tensordicts(batch, depth + 1))
        else:
            source[key] = draw(tensors(batch))
    td = TensorDict(source, batch_size=batch, device=draw(st.sampled_from([None, "cpu"])))
    if depth == 0 and batch and draw(st.booleans()):
        td.names = [f"d{i}" for i in range(len(batch))]
    return td


@SETTINGS
@given(tensordicts())
def test_tensordicts_round_trip(td: TensorDict) -> None:
    out = decode(encode(td))
    assert_same(td.apply(torch.Tensor.contiguous) if td.keys() else td, out)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=64), min_size=0, max_size=4)
    | st.builds(
        lambda h, bufs: [h, *bufs],
        st.sampled_from(
            [
                msgpack.packb([msgpack.ExtType(c, b""), *f])
                for c in range(1, 18)
                for f in ([], ["float32", [2], 1, None, False], [{}, [], None, None], ["x"])
            ]
        ),
        st.lists(st.binary(max_size=16), max_size=2),
    )
)
def test_decode_fuzz_only_raises_protocol_error(frames: list[bytes]) -> None:
    try:
        decode(frames)
    except ProtocolError:
        pass
