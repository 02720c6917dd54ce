"""ShardStorage: columnar round trips, schema rules, deletes and reuse, capacity, KV face."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorStack, TensorDict

from rayless.store.data.schema import STORABLE_DTYPES, FieldSchema, dtype_from_name, split_columns
from rayless.store.errors import (
    SchemaError,
    StoreFullError,
    StoreInputError,
    UnknownFieldError,
    UnknownKeyError,
    UnknownPartitionError,
    WriteTooLargeError,
)
from rayless.store.unit.shard import ShardStorage, kv_shard_of


def jagged(lengths: list[int], *rest: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    rows = [
        (torch.arange(n * (rest[0] if rest else 1)) + 10 * k).to(dtype).reshape(n, *rest)
        for k, n in enumerate(lengths)
    ]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def batch(n: int = 3, offset: int = 0) -> TensorDict:
    lengths = [(i + offset) % 4 + 1 for i in range(n)]
    return TensorDict(
        {
            "obs": torch.arange(n * 4, dtype=torch.float32).reshape(n, 4) + offset,
            "flag": torch.arange(n) % 2 == 0,
            "logp": (torch.arange(n * 2).reshape(n, 2) / 3 - offset).to(torch.bfloat16),
            "z": torch.complex(torch.arange(n) + 0.5, -torch.arange(n) - offset * 1.0),
            "resp": jagged(lengths, 2, dtype=torch.int64),
            "text": NonTensorStack.from_list([f"s{i + offset}" for i in range(n)]),
            "info": TensorDict(
                {"step": torch.full((n,), offset), "tag": NonTensorStack.from_list(["t"] * n)},
                batch_size=[n],
            ),
        },
        batch_size=[n],
    )


def assert_same(a: TensorDict, b: TensorDict) -> None:
    """Same keys, kinds, dtypes, shapes, values (and nesting) in ``a`` and ``b``."""
    ca, cb = split_columns(a), split_columns(b)
    assert ca.keys() == cb.keys()
    for name in ca:
        x, y = ca[name], cb[name]
        assert (x.schema.kind, x.schema.dtype) == (y.schema.kind, y.schema.dtype), name
        if x.schema.kind == "dense":
            assert x.dense is not None and y.dense is not None
            assert x.dense.shape == y.dense.shape and torch.equal(x.dense, y.dense), name
        elif x.schema.is_nested:
            assert len(x.rows or []) == len(y.rows or [])
            for r, s in zip(x.rows or [], y.rows or [], strict=True):
                assert r.shape == s.shape and torch.equal(r, s), name
        else:
            assert x.rows == y.rows, name


def dump(s: ShardStorage) -> Any:
    """Everything a shard holds, as comparable plain values."""
    out: dict[str, Any] = {}
    for part, cols in s._parts.items():
        for name, col in cols.items():
            rows = getattr(col, "rows", None)
            if rows is None:
                data = {i: col.data[slot].tolist() for i, slot in col.slot_of.items()}
            else:
                data = {
                    i: r.tolist() if isinstance(r, torch.Tensor) else r for i, r in rows.items()
                }
            out[f"{part}/{name}"] = (col.schema, data)
    return out, s.used_bytes, dict(s._kv_rows), list(s._kv_free), s._kv_next


def test_round_trip_every_kind() -> None:
    s = ShardStorage("u0")
    td = batch(3)
    update = s.write("train", [7, 2, 9], td)
    assert update.partition == "train" and update.indexes == [7, 2, 9]
    assert update.schemas["resp"] == FieldSchema("jagged", "int64", (None, 2), "cpu")
    assert update.sample_shapes == {"resp": [(1, 2), (2, 2), (3, 2)]}
    out = s.read("train", [7, 2, 9])
    assert_same(out, td)
    assert out["resp"].layout == torch.jagged
    assert isinstance(out.get("text"), NonTensorStack)
    # reorder and subset
    assert_same(
        s.read("train", [9, 7], ["obs", "resp", "info.tag"]),
        td[[2, 0]].select("obs", "resp", ("info", "tag")),
    )


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_strided_nested_round_trip() -> None:
    s = ShardStorage("u0")
    nt = torch.nested.nested_tensor([torch.ones(2, 3), torch.zeros(4, 5)], layout=torch.strided)
    td = TensorDict({"img": nt}, batch_size=[2])
    s.write("p", [0, 1], td)
    out = s.read("p", [1, 0])["img"]
    assert out.is_nested and out.layout == torch.strided
    assert [t.shape for t in out.unbind()] == [torch.Size([4, 5]), torch.Size([2, 3])]


def test_stored_rows_do_not_alias_the_input() -> None:
    s = ShardStorage("u0")
    td = batch(2)
    s.write("p", [0, 1], td)
    td["obs"].zero_()
    td["resp"].values().zero_()
    assert s.read("p", [1], ["obs"])["obs"].sum() > 0
    assert s.read("p", [1], ["resp"])["resp"].values().sum() > 0


def test_overwrite_and_column_wise_fields() -> None:
    s = ShardStorage("u0")
    s.write("p", [0, 1], batch(2))
    s.write("p", [1], batch(1, offset=5))  # overwrite sample 1
    assert s.read("p", [1], ["text"]).get("text").tolist() == ["s5"]
    assert s.read("p", [0], ["text"]).get("text").tolist() == ["s0"]
    s.write("p", [0], TensorDict({"reward": torch.tensor([1.5])}, batch_size=[1]))
    assert s.read("p", [0])["reward"].tolist() == [1.5]
    assert "reward" not in s.read("p", [0, 1]).keys()  # noqa: SIM118 (fields=None: all hold)
    with pytest.raises(UnknownFieldError, match="reward"):
        s.read("p", [0, 1], ["reward"])
    assert s.has("p", 0, "reward") and not s.has("p", 1, "reward")


def test_declared_schemas() -> None:
    s = ShardStorage("u0")
    td = TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2])
    update = s.write(
        "p", [0, 1], td, schemas={"x": FieldSchema("dense", "float32", (3,), "cuda:3")}
    )
    assert update.schemas["x"].device == "cuda:3"
    before = dump(s)
    with pytest.raises(SchemaError, match="declared"):
        s.write("p", [0, 1], td, schemas={"y": FieldSchema("dense", "float32", (3,), "cpu")})
    with pytest.raises(SchemaError, match="declared"):
        s.write("p", [0, 1], td, schemas={"x": FieldSchema("dense", "int32", (3,), "cpu")})
    assert dump(s) == before


def test_bad_writes_leave_the_shard_unchanged() -> None:
    s = ShardStorage("u0", capacity_bytes=1 << 20)
    s.write("p", [0, 1, 2], batch(3))
    before = dump(s)
    dtype_change = TensorDict({"obs": torch.zeros(1, 4, dtype=torch.float64)}, batch_size=[1])
    shape_change = TensorDict({"obs": torch.zeros(1, 4, 1)}, batch_size=[1])  # (a rank change)
    kind_change = TensorDict({"text": torch.zeros(1)}, batch_size=[1])
    ok_then_bad = TensorDict(
        {"new": torch.zeros(1), "obs": torch.zeros(1, 4, dtype=torch.int32)}, batch_size=[1]
    )
    cases: list[tuple[Any, Any, Any, type[Exception]]] = [
        ("p", [3], dtype_change, SchemaError),
        ("p", [0], shape_change, SchemaError),
        ("p", [0], kind_change, SchemaError),
        ("p", [5], ok_then_bad, SchemaError),
        ("p", [3, 4], batch(3), SchemaError),  # batch size mismatch
        ("p", [3, 3, 4], batch(3), StoreInputError),
        ("p", [-1, 3, 4], batch(3), StoreInputError),
        ("p", "012", batch(3), StoreInputError),
        ("", [3, 4, 5], batch(3), StoreInputError),
        ("\x00kv", [3, 4, 5], batch(3), StoreInputError),
        ("p", [3], {"obs": torch.zeros(1, 4)}, SchemaError),
    ]
    for part, idx, td, exc in cases:
        with pytest.raises(exc):
            s.write(part, idx, td)
        assert dump(s) == before, (part, idx)


def test_read_errors() -> None:
    s = ShardStorage("u0")
    s.write("p", [0], batch(1))
    with pytest.raises(UnknownPartitionError):
        s.read("q", [0])
    with pytest.raises(UnknownFieldError):
        s.read("p", [0], ["nope"])
    with pytest.raises(UnknownFieldError, match="not written"):
        s.read("p", [0, 1], ["obs"])
    with pytest.raises(StoreInputError):
        s.read("p", [0], "obs")  # type: ignore[arg-type]
    assert s.read("p", [], ["obs", "resp", "text"]).batch_size == torch.Size([0])


def test_delete_reuses_slots_and_drops_empty_columns() -> None:
    s = ShardStorage("u0")
    s.write("p", list(range(8)), batch(8))
    full = s.used_bytes
    dense = s._parts["p"]["obs"]
    cap = dense.capacity
    freed = s.delete("p", [1, 3, 5])
    assert freed > 0  # nested/non-tensor rows give their bytes back at once
    s.write("p", [11, 13, 15], batch(3, offset=1))
    assert s._parts["p"]["obs"].capacity == cap  # freed slots were reused, no growth
    assert s.used_bytes <= full + 64
    assert_same(s.read("p", [13], ["obs"]), batch(3, offset=1)[[1]].select("obs"))
    assert s.delete("p", [100, 101]) == 0  # absent rows are ignored
    assert s.delete("nope", [0]) == 0
    # deleting only some fields
    s.delete("p", [0], ["obs"])
    assert not s.has("p", 0, "obs") and s.has("p", 0, "resp")
    everything = [0, 2, 4, 6, 7, 11, 13, 15]
    s.delete("p", everything)
    assert s.partitions() == [] and s.used_bytes == 0
    # with its column gone, the field may take another schema
    s.write("p", [0], TensorDict({"obs": torch.zeros(1, 9, dtype=torch.int8)}, batch_size=[1]))
    assert s.read("p", [0])["obs"].dtype == torch.int8


def test_long_run_does_not_grow() -> None:
    s = ShardStorage("u0")
    sizes = []
    for step in range(30):
        idx = [step * 4 + k for k in range(4)]
        s.write("p", idx, batch(4, offset=step))
        if step >= 2:
            s.delete("p", [i - 8 for i in idx])
        sizes.append(s.used_bytes)
    assert max(sizes[5:]) <= sizes[4] * 1.5


def test_drop_partition() -> None:
    s = ShardStorage("u0")
    s.write("a", [0], batch(1))
    s.write("b", [1], batch(1))
    assert s.drop_partition("a") > 0
    assert s.partitions() == ["b"]
    assert s.drop_partition("a") == 0
    assert s.stats().rows == {"b": 1}


def test_capacity_refuses_before_writing() -> None:
    row = 4 * 4  # one obs row of float32[4]
    s = ShardStorage("u0", capacity_bytes=10 * row)
    obs = lambda n: TensorDict({"obs": torch.ones(n, 4)}, batch_size=[n])  # noqa: E731
    s.write("p", list(range(4)), obs(4))
    assert s.used_bytes == 4 * row
    # 4 more rows: doubling to 8 fits exactly
    s.write("p", list(range(4, 8)), obs(4))
    assert s._parts["p"]["obs"].capacity == 8
    # 3 more: doubling to 16 does not fit, exact growth to 11 does not either
    before = dump(s)
    with pytest.raises(StoreFullError) as info:
        s.write("p", [8, 9, 10], obs(3))
    assert info.value.unit == "u0" and info.value.needed == 3 * row
    assert info.value.available == 2 * row and info.value.capacity == 10 * row
    assert dump(s) == before
    # 2 more: exact growth to 10
    s.write("p", [8, 9], obs(2))
    assert s._parts["p"]["obs"].capacity == 10 and s.free_bytes == 0
    # full, but overwriting and reusing freed slots still works
    s.write("p", [0, 1], obs(2))
    s.delete("p", [2, 3])
    s.write("p", [20, 21], obs(2))
    with pytest.raises(StoreFullError):
        s.write("p", [22], TensorDict({"text": NonTensorStack("x")}, batch_size=[1]))


def test_capacity_counts_ragged_and_plain_rows() -> None:
    s = ShardStorage("u0", capacity_bytes=200)
    nt = lambda *ls: TensorDict({"r": jagged(list(ls))}, batch_size=[len(ls)])  # noqa: E731
    s.write("p", [0], nt(10))  # 40 bytes
    assert s.used_bytes == 40
    with pytest.raises(StoreFullError):
        s.write("p", [1, 2], nt(30, 20))
    s.write("p", [0], nt(50))  # an overwrite: 200 - 40 + ... only the difference counts
    assert s.used_bytes == 200
    s.delete("p", [0])
    assert s.used_bytes == 0 and s.free_bytes == 200
    assert ShardStorage("u1").free_bytes is None


def test_constructor_validation() -> None:
    with pytest.raises(StoreInputError):
        ShardStorage("")
    with pytest.raises(StoreInputError):
        ShardStorage("u", capacity_bytes=-5)


def test_kv_face() -> None:
    s = ShardStorage("u0")
    schemas = s.kv_put(["a", "b"], batch(2))
    assert schemas["obs"].dtype == "float32"
    s.write("p", [0], batch(1))  # the partition space is separate
    assert s.kv_list() == ["a", "b"] and s.partitions() == ["p"]
    assert_same(s.kv_get(["b", "a"]), batch(2)[[1, 0]])
    s.kv_put(["b", "c"], batch(2, offset=3))  # b is overwritten, c is new
    assert s.kv_get(["b"], ["text"]).get("text").tolist() == ["s3"]
    assert s.kv_get(["a"], ["text"]).get("text").tolist() == ["s0"]
    with pytest.raises(UnknownKeyError):
        s.kv_get(["a", "zz"])
    with pytest.raises(StoreInputError):
        s.kv_get("a")
    with pytest.raises(StoreInputError):
        s.kv_put(["x", "x"], batch(2))
    assert s.kv_delete(["a", "zz"]) == 1
    assert s.kv_list() == ["b", "c"]
    s.kv_put(["d"], batch(1))  # reuses a's row
    assert s._kv_next == 3
    assert s.kv_get(["d", "c"], ["obs"]).batch_size == torch.Size([2])


def test_kv_failed_put_registers_no_key() -> None:
    s = ShardStorage("u0", capacity_bytes=64)
    s.kv_put(["a"], TensorDict({"x": torch.zeros(1, 4)}, batch_size=[1]))
    before = dump(s)
    with pytest.raises(StoreFullError):
        s.kv_put(["b", "c"], TensorDict({"y": torch.zeros(2, 40)}, batch_size=[2]))
    with pytest.raises(SchemaError):
        s.kv_put(["b"], TensorDict({"x": torch.zeros(1, 4, dtype=torch.int64)}, batch_size=[1]))
    assert dump(s) == before and s.kv_list() == ["a"]


def test_kv_shard_of_is_stable_and_spread() -> None:
    keys = [f"k{i}" for i in range(200)]
    shards = [kv_shard_of(k, 4) for k in keys]
    assert shards == [kv_shard_of(k, 4) for k in keys]
    assert set(shards) == {0, 1, 2, 3}
    with pytest.raises(StoreInputError):
        kv_shard_of("k", 0)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.lists(st.integers(0, 15), min_size=1, max_size=5, unique=True),
            st.lists(st.integers(0, 4), min_size=5, max_size=5),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_write_read_round_trip_property(ops: list[tuple[list[int], list[int], bool]]) -> None:
    """Random writes/deletes: every live row reads back as last written."""
    s = ShardStorage("u0")
    model: dict[int, tuple[list[float], list[int], str]] = {}
    for idx, lengths, delete in ops:
        if delete:
            s.delete("p", idx)
            for i in idx:
                model.pop(i, None)
            continue
        n = len(idx)
        dense = [[float(i), float(k)] for k, i in enumerate(idx)]
        ragged = [list(range(lengths[k])) for k in range(n)]
        text = [f"t{i}-{lengths[k]}" for k, i in enumerate(idx)]
        td = TensorDict(
            {
                "d": torch.tensor(dense),
                "r": torch.nested.nested_tensor(
                    [torch.tensor(r, dtype=torch.int32) for r in ragged], layout=torch.jagged
                ),
                "t": NonTensorStack.from_list(text),
            },
            batch_size=[n],
        )
        s.write("p", idx, td)
        for k, i in enumerate(idx):
            model[i] = (dense[k], ragged[k], text[k])
    live = sorted(model)
    if not live:
        assert s.partitions() == []
        return
    out = s.read("p", live)
    assert out["d"].tolist() == [model[i][0] for i in live]
    assert [r.tolist() for r in out["r"].unbind()] == [model[i][1] for i in live]
    assert out.get("t").tolist() == [model[i][2] for i in live]


@pytest.mark.parametrize("name", sorted(STORABLE_DTYPES))
def test_every_storable_dtype_round_trips(name: str) -> None:
    dtype = dtype_from_name(name)
    s = ShardStorage("u0")
    dense = (torch.arange(12) % 2).to(dtype).reshape(4, 3)
    rows = [(torch.arange(n) % 2).to(dtype) for n in (1, 3, 2, 4)]
    td = TensorDict(
        {"d": dense, "r": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, [4]
    )
    s.write("p", [5, 1, 7, 3], td)
    s.write("p", [1], td[1:2])  # an overwrite: index_copy_ into existing slots
    back = s.read("p", [3, 5])
    assert back["d"].dtype == dtype and torch.equal(back["d"], dense[[3, 0]])
    for got, want in zip(back["r"].unbind(0), [rows[3], rows[0]], strict=True):
        assert torch.equal(got, want)


def test_a_write_larger_than_the_whole_capacity_fails_at_once() -> None:
    s = ShardStorage("u0", capacity_bytes=64)
    s.write("p", [0], TensorDict({"x": torch.zeros(1, 4)}, [1]))
    before = dump(s)
    with pytest.raises(WriteTooLargeError) as info:  # 80 bytes > 64: it can never fit
        s.write("p", [1, 2, 3, 4, 5], TensorDict({"x": torch.zeros(5, 4)}, [5]))
    assert info.value.needed == 80 and info.value.capacity == 64
    assert isinstance(info.value, StoreFullError)
    with pytest.raises(StoreFullError) as full:  # 64 bytes: they fit once room is freed
        s.write("p", [1, 2, 3, 4], TensorDict({"x": torch.zeros(4, 4)}, [4]))
    assert not isinstance(full.value, WriteTooLargeError)
    with pytest.raises(WriteTooLargeError):
        s.kv_put(["k"], TensorDict({"t": NonTensorStack("x" * 100)}, [1]))
    assert dump(s) == before


@pytest.mark.parametrize("shm", [False, True])
def test_a_field_of_several_widths_keeps_a_dense_part_per_width(shm: bool) -> None:
    """Issue 41 item 9: another per-sample shape (same rank, dtype) is a column part of its own;
    rows already stored stay in place; a read of one part is dense, a mixed one nested; a
    sample rewritten with another shape leaves its old part; a part left empty is dropped."""
    from rayless.store.samehost.columns import ShmDense
    from rayless.store.unit.columns import _Parts

    s = ShardStorage("u0", dense_type=ShmDense) if shm else ShardStorage("u0")
    four = torch.arange(8.0).view(2, 4)
    six = torch.arange(12.0).view(2, 6) + 100
    s.write("p", [0, 1], TensorDict({"x": four}, [2]))
    first = s._parts["p"]["x"]
    s.write("p", [2, 3], TensorDict({"x": six}, [2]))
    s.write("p", [4, 5], TensorDict({"x": four + 50}, [2]))
    col = s._parts["p"]["x"]
    assert isinstance(col, _Parts) and col.parts[(4,)] is first  # the old rows did not move
    assert col.schema == FieldSchema("dense", "float32", (None,), "cpu")
    assert torch.equal(s.read("p", [0, 1])["x"], four)
    assert torch.equal(s.read("p", [4, 0])["x"], torch.stack([four[0] + 50, four[0]]))
    mixed = s.read("p", [0, 2, 5])["x"]
    assert mixed.is_nested and mixed.layout == torch.jagged
    assert [r.tolist() for r in mixed.unbind(0)] == [
        four[0].tolist(),
        six[0].tolist(),
        (four[1] + 50).tolist(),
    ]
    s.write("p", [2], TensorDict({"x": four[:1] - 1}, [1]))  # sample 2 now of width 4
    assert 2 not in col.parts[(6,)] and torch.equal(s.read("p", [2])["x"], four[:1] - 1)
    before = s.used_bytes
    s.delete("p", [3])  # the last row of width 6: its part goes, the field is plain again
    assert s._parts["p"]["x"] is first and s.used_bytes < before
    with pytest.raises(SchemaError, match="dtype"):
        s.write("p", [6], TensorDict({"x": torch.zeros(1, 6, dtype=torch.int64)}, [1]))
    with pytest.raises(SchemaError, match="dim samples"):
        s.write("p", [6], TensorDict({"x": torch.zeros(1, 2, 3)}, [1]))
    # KV values of other lengths by key: the same parts
    s.kv_put(["a"], TensorDict({"v": torch.arange(3).unsqueeze(0)}, [1]))
    s.kv_put(["b"], TensorDict({"v": torch.arange(5).unsqueeze(0)}, [1]))
    kv = s.kv_get(["b", "a"])["v"]
    assert kv.is_nested and [r.tolist() for r in kv.unbind(0)] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert s.kv_get(["a"])["v"].tolist() == [[0, 1, 2]]
    s.close()
