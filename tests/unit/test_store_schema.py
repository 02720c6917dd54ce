"""Field schemas, column split/assembly, data updates and the store's error tree."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from rayless.store.data.schema import (
    DataUpdate,
    FieldSchema,
    assemble,
    check_plain,
    dtype_from_name,
    dtype_name,
    merge_parts,
    split_columns,
)
from rayless.store.errors import (
    ForeignMetaError,
    PartialResultError,
    SchemaError,
    StaleMetaError,
    StoreError,
    StoreFullError,
    StoreInputError,
    UnitLostError,
    UnknownFieldError,
    UnknownKeyError,
    UnknownPartitionError,
    WriteTooLargeError,
)
from rayless.transport.errors import RaylessError, error_from_state, error_to_state


def jagged(lengths: list[int], *rest: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    rows = [torch.arange(n * max(1, *rest, 1), dtype=dtype).reshape(n, *rest) for n in lengths]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def batch() -> TensorDict:
    return TensorDict(
        {
            "obs": torch.randn(3, 4),
            "mask": torch.tensor([True, False, True]),
            "resp": jagged([2, 5, 1]),
            "text": NonTensorStack("a", "bb", "ccc"),
            "sub": TensorDict(
                {
                    "x": torch.arange(3, dtype=torch.int64),
                    "info": NonTensorStack(1, {"k": 2}, None),
                },
                batch_size=[3],
            ),
        },
        batch_size=[3],
    )


def test_split_columns_kinds_and_schemas() -> None:
    cols = split_columns(batch())
    assert set(cols) == {"obs", "mask", "resp", "text", "sub.x", "sub.info"}
    assert cols["obs"].schema == FieldSchema("dense", "float32", (4,), "cpu")
    assert cols["mask"].schema == FieldSchema("dense", "bool", (), "cpu")
    assert cols["resp"].schema == FieldSchema("jagged", "float32", (None,), "cpu")
    assert cols["resp"].sample_shapes == [(2,), (5,), (1,)]
    assert cols["text"].schema == FieldSchema("non_tensor")
    assert cols["text"].rows == ["a", "bb", "ccc"]
    assert cols["sub.info"].rows == [1, {"k": 2}, None]
    assert all(len(c) == 3 for c in cols.values())


def test_jagged_with_fixed_trailing_dims_and_uniform_lengths() -> None:
    td = TensorDict({"r": jagged([2, 4], 3), "u": jagged([2, 2])}, batch_size=[2])
    cols = split_columns(td)
    assert cols["r"].schema.shape == (None, 3)
    assert cols["u"].schema.shape == (2,)  # every sample happens to agree


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_strided_nested_may_vary_anywhere() -> None:
    nt = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 5)], layout=torch.strided)
    col = split_columns(TensorDict({"img": nt}, batch_size=[2]))["img"]
    assert col.schema == FieldSchema("strided", "float32", (None, None), "cpu")


def test_non_tensor_data_broadcast_becomes_per_sample() -> None:
    td = TensorDict({"s": "hello"}, batch_size=[2])
    assert split_columns(td)["s"].rows == ["hello", "hello"]


@pytest.mark.parametrize(
    "bad",
    [
        {"x": 1},
        TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3]),
        TensorDict({"x": torch.zeros(2)}, batch_size=[]),
        TensorDict({"a.b": torch.zeros(2)}, batch_size=[2]),
        TensorDict({"s": NonTensorStack(object(), 1)}, batch_size=[2]),
        TensorDict({"s": NonTensorStack({1: "int key"}, 1)}, batch_size=[2]),
    ],
)
def test_split_columns_rejects_what_it_cannot_store(bad: object) -> None:
    with pytest.raises(SchemaError):
        split_columns(bad)


def test_split_columns_checks_batch_size() -> None:
    with pytest.raises(SchemaError, match="holds 3 samples"):
        split_columns(batch(), 4)


def test_jagged_varying_in_a_later_dim_is_refused() -> None:
    base = torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged)
    # a jagged tensor transposed so that the ragged dim is not the first sample dim
    transposed = base.transpose(1, 2)
    with pytest.raises(SchemaError, match="first sample dimension"):
        split_columns(TensorDict({"t": transposed}, batch_size=[2]))


def test_field_schema_validation_and_wire() -> None:
    s = FieldSchema("jagged", "bfloat16", (None, 8), "cuda:1")
    assert FieldSchema.from_dict(s.to_dict()) == s
    assert s.is_nested and not s.is_non_tensor and s.torch_dtype == torch.bfloat16
    multi = FieldSchema("dense", "float32", (None,), "cpu")  # a multi-shape dense field
    assert FieldSchema.from_dict(multi.to_dict()) == multi and multi.is_multi_shape
    for bad in (
        {"kind": "sparse"},
        {"kind": "dense", "dtype": "float32"},
        {"kind": "dense", "dtype": "nope", "shape": [1]},
        {"kind": "dense", "dtype": "float32", "shape": [-1]},
        {"kind": "non_tensor", "dtype": "float32"},
        {"kind": "dense", "dtype": "float32", "shape": 3},
        "not a dict",
    ):
        with pytest.raises(SchemaError):
            FieldSchema.from_dict(bad)  # type: ignore[arg-type]


def test_dtype_names_round_trip() -> None:
    for dt in (torch.float32, torch.bfloat16, torch.bool, torch.complex64, torch.uint8):
        assert dtype_from_name(dtype_name(dt)) is dt
    with pytest.raises(SchemaError):
        dtype_from_name("Tensor")


def test_merged_rules() -> None:
    dense = FieldSchema("dense", "float32", (4,), "cpu")
    assert dense.merged(FieldSchema("dense", "float32", (4,), "cuda:0"), "x").device == "cuda:0"
    with pytest.raises(SchemaError, match="dtype float32; cannot write float16"):
        dense.merged(FieldSchema("dense", "float16", (4,), "cpu"), "x")
    # issue 41: another width of one rank makes a multi-shape dense field (parts per shape)
    multi = dense.merged(FieldSchema("dense", "float32", (5,), "cpu"), "x")
    assert multi == FieldSchema("dense", "float32", (None,), "cpu") and multi.is_multi_shape
    assert multi.merged(dense, "x") == multi and not dense.is_multi_shape
    with pytest.raises(SchemaError, match="1-dim samples; cannot write 2-dim"):
        dense.merged(FieldSchema("dense", "float32", (2, 2), "cpu"), "x")
    with pytest.raises(SchemaError, match="dtype float32; cannot write int64"):
        multi.merged(FieldSchema("dense", "int64", (5,), "cpu"), "x")
    with pytest.raises(SchemaError, match="holds dense data"):
        dense.merged(FieldSchema("jagged", "float32", (None,), "cpu"), "x")
    nested = FieldSchema("jagged", "int64", (None, 3), "cpu")
    assert nested.merged(FieldSchema("jagged", "int64", (7, 3), "cpu"), "r").shape == (None, 3)
    assert nested.merged(FieldSchema("jagged", "int64", (7, 4), "cpu"), "r").shape == (None, None)
    with pytest.raises(SchemaError, match="2-dim samples"):
        nested.merged(FieldSchema("jagged", "int64", (7,), "cpu"), "r")
    plain = FieldSchema("non_tensor")
    assert plain.merged(FieldSchema("non_tensor"), "s") is plain


def test_check_plain() -> None:
    check_plain({"a": [1, 2.0, "x", b"y", None, True, (1, 2)]})
    with pytest.raises(SchemaError):
        check_plain({"a": torch.zeros(1)})
    deep: list[object] = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(SchemaError, match="too deeply"):
        check_plain(deep)


def test_assemble_restores_nesting_and_kinds() -> None:
    td = batch()
    cols = split_columns(td)
    data = {
        name: (c.schema, c.dense if c.schema.kind == "dense" else c.rows)
        for name, c in cols.items()
    }
    out = assemble(3, data)
    assert out.batch_size == torch.Size([3])
    torch.testing.assert_close(out["obs"], td["obs"])
    assert out["resp"].is_nested and out["resp"].layout == torch.jagged
    for a, b in zip(out["resp"].unbind(), td["resp"].unbind(), strict=True):
        torch.testing.assert_close(a, b)
    assert out.get("text").tolist() == ["a", "bb", "ccc"]
    assert out.get(("sub", "info")).tolist() == [1, {"k": 2}, None]
    torch.testing.assert_close(out["sub", "x"], td["sub", "x"])


def test_assemble_empty_batch() -> None:
    out = assemble(
        0,
        {
            "r": (FieldSchema("jagged", "float32", (None, 2), "cpu"), []),
            "d": (FieldSchema("dense", "int32", (2,), "cpu"), torch.zeros(0, 2, dtype=torch.int32)),
            "s": (FieldSchema("non_tensor"), []),
        },
    )
    assert out.batch_size == torch.Size([0])
    assert out["r"].is_nested and out["r"].dtype == torch.float32


def test_merge_parts_reorders_rows() -> None:
    td = batch()
    schemas = {n: c.schema for n, c in split_columns(td).items()}
    parts = [([2, 0], td[[2, 0]]), ([1], td[[1]])]
    out = merge_parts(3, schemas, parts)
    torch.testing.assert_close(out["obs"], td["obs"])
    assert [r.shape[0] for r in out["resp"].unbind()] == [2, 5, 1]
    assert out.get("text").tolist() == ["a", "bb", "ccc"]
    assert out.get(("sub", "info")).tolist() == [1, {"k": 2}, None]
    with pytest.raises(StoreInputError):
        merge_parts(3, schemas, [([0, 1], td[[0, 1]])])
    with pytest.raises(StoreInputError):
        merge_parts(3, schemas, [([0, 1, 2], td[[0, 1]])])


def test_data_update_wire() -> None:
    upd = DataUpdate(
        "train",
        [4, 7],
        {"r": FieldSchema("jagged", "float32", (None,), "cpu")},
        {"r": [(3,), (5,)]},
    )
    assert DataUpdate.from_dict(upd.to_dict()) == upd
    with pytest.raises(StoreInputError):
        DataUpdate.from_dict({"partition": "p"})
    with pytest.raises(SchemaError):
        DataUpdate.from_dict({"partition": "p", "indexes": [], "schemas": {"x": {"kind": "?"}}})


def test_error_tree() -> None:
    for cls in (
        SchemaError,
        UnknownFieldError,
        UnknownPartitionError,
        UnknownKeyError,
        StaleMetaError,
        ForeignMetaError,
    ):
        assert issubclass(cls, StoreInputError)
        assert issubclass(cls, ValueError)
    assert issubclass(StoreInputError, StoreError) and issubclass(StoreError, RaylessError)
    assert not issubclass(StoreFullError, ValueError)
    full = StoreFullError("u1", needed=100, available=10, capacity=50)
    assert "u1" in str(full) and "100" in str(full)
    lost = UnitLostError("unit-3", "process died")
    assert "unit-3" in str(lost)


@pytest.mark.parametrize(
    "exc",
    [
        SchemaError("field 'x' changed dtype"),
        StoreFullError("u1", 100, 10, 50),
        UnitLostError("u2", "gone"),
        StaleMetaError("stale"),
        WriteTooLargeError("u1", 100, 10, 50),
        PartialResultError("u2", "half", units=["u2", "u3"]),
    ],
)
def test_errors_cross_the_wire(exc: StoreError) -> None:
    back = error_from_state(error_to_state(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert vars(back) == vars(exc)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ],
)
def test_unstorable_dtypes_are_refused_when_split(dtype: torch.dtype) -> None:
    dense = TensorDict({"obs": {"tok": torch.zeros(2, 3).to(dtype)}}, [2])
    with pytest.raises(SchemaError, match=r"obs\.tok.*cannot be stored"):
        split_columns(dense)
    if dtype.is_floating_point:
        return
    rows = [torch.zeros(1, dtype=dtype), torch.zeros(2, dtype=dtype)]
    ragged = TensorDict({"r": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [2])
    with pytest.raises(SchemaError, match=r"'r'.*cannot be stored"):
        split_columns(ragged)
    with pytest.raises(SchemaError):
        FieldSchema("dense", dtype_name(dtype), (3,))


def test_partial_result_error_is_a_unit_lost_error() -> None:
    err = PartialResultError("u1", "half", data="d", meta="m", lost="l")
    assert isinstance(err, UnitLostError) and err.unit == "u1" and err.units == ["u1"]
    assert (err.data, err.meta, err.lost) == ("d", "m", "l") and "u1" in str(err)


def test_a_rebuilt_jagged_field_keeps_its_longest_row() -> None:
    # nested_tensor_from_jagged without max_seqlen pads to the whole values length
    rows = [torch.arange(3), torch.arange(5), torch.arange(1)]
    nt = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    cols = split_columns(TensorDict({"r": nt}, [3]))
    back = assemble(3, {"r": (cols["r"].schema, cols["r"].rows)})["r"]
    assert torch.nested.to_padded_tensor(back, 0).shape == (3, 5)
    assert all(torch.equal(a, b) for a, b in zip(back.unbind(), rows, strict=True))
    assert cols["r"].sample_shapes == [(3,), (5,), (1,)]


def test_parts_of_a_multi_shape_field_merge_into_nested() -> None:
    """Issue 41 item 9: units' dense answers of one multi-shape field with different widths
    (or a unit's own nested answer) merge into one nested tensor, in batch order; one width
    stays dense. Jagged when only the first per-sample dim differs, else strided."""
    from rayless.store.data.rows import merge
    from rayless.store.data.schema import nest_rows

    multi = FieldSchema("dense", "float32", (None, 3), "cpu")
    a = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 2, 3)
    b = torch.arange(1 * 5 * 3, dtype=torch.float32).view(1, 5, 3) + 100
    parts = [([0, 2], TensorDict({"x": a}, [2])), ([1], TensorDict({"x": b}, [1]))]
    want = [a[0].tolist(), b[0].tolist(), a[1].tolist()]
    for merged in (merge_parts(3, {"x": multi}, parts), merge(3, {"x": multi}, parts)):
        x = merged["x"]
        assert x.is_nested and x.layout == torch.jagged
        assert [r.tolist() for r in x.unbind(0)] == want
    same = [([1], TensorDict({"x": a[:1]}, [1])), ([0], TensorDict({"x": a[1:]}, [1]))]
    dense = merge_parts(2, {"x": multi}, same)["x"]
    assert not dense.is_nested and torch.equal(dense, a.flip(0))
    wide = torch.zeros(2, 4)
    strided = nest_rows([torch.zeros(2, 3), wide], multi)
    assert strided.is_nested and strided.layout == torch.strided
    assert [tuple(r.shape) for r in strided.unbind(0)] == [(2, 3), (2, 4)]
