"""BatchMeta: views, derived metas and the wire format."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import FieldSchema
from rayless.store.errors import ForeignMetaError, SchemaError, StoreInputError, UnknownFieldError

DENSE = FieldSchema("dense", "float32", (4,), "cpu")
RAGGED = FieldSchema("jagged", "int64", (None,), "cuda:0")
TEXT = FieldSchema("non_tensor")


def make(n: int = 6, store: str = "s", partition: str = "train") -> BatchMeta:
    return BatchMeta(
        store,
        tuple(range(10, 10 + n)),
        (partition,) * n,
        tuple(i % 3 for i in range(n)),
        (1,) * n,
        {"obs": DENSE, "resp": RAGGED, "text": TEXT},
        tuple({"uid": f"p{i // 2}"} for i in range(n)),
        {"resp": tuple((i + 1,) for i in range(n))},
    )


def test_views() -> None:
    m = make()
    assert m.size == len(m) == 6
    assert m.field_names == ["obs", "resp", "text"]
    assert m.partition_id == "train"
    assert m.by_shard() == {0: [0, 3], 1: [1, 4], 2: [2, 5]}
    assert m.by_partition() == {"train": list(range(10, 16))}


def test_defaults_and_validation() -> None:
    m = BatchMeta("s", (1, 2), ("p", "p"), (0, 0), (1, 1))
    assert m.custom_meta == ({}, {}) and m.field_names == []
    with pytest.raises(StoreInputError, match="shards"):
        BatchMeta("s", (1, 2), ("p", "p"), (0,), (1, 1))
    with pytest.raises(StoreInputError, match="more than once"):
        BatchMeta("s", (1, 1), ("p", "p"), (0, 0), (1, 1))
    with pytest.raises(StoreInputError, match="sample_shapes"):
        BatchMeta("s", (1,), ("p",), (0,), (1,), {"r": RAGGED}, ({},), {"r": ((1,), (2,))})
    # the same index in two partitions is two samples
    assert len(BatchMeta("s", (1, 1), ("p", "q"), (0, 0), (1, 1))) == 2


def test_partition_id_of_mixed_meta_raises() -> None:
    mixed = BatchMeta.concat([make(2), make(2, partition="val")])
    assert mixed.by_partition() == {"train": [10, 11], "val": [10, 11]}
    with pytest.raises(StoreInputError):
        _ = mixed.partition_id


def test_select_split_chunk() -> None:
    m = make()
    sub = m.select([4, 1])
    assert sub.global_indexes == (14, 11)
    assert sub.shards == (1, 1)
    assert sub.custom_meta == ({"uid": "p2"}, {"uid": "p0"})
    assert sub.sample_shapes["resp"] == ((5,), (2,))
    with pytest.raises(StoreInputError):
        m.select([6])
    assert [len(x) for x in m.split(4)] == [4, 2]
    assert [len(x) for x in m.chunk(4)] == [2, 2, 1, 1]
    assert BatchMeta.concat(m.chunk(4)) == m
    with pytest.raises(StoreInputError):
        m.split(0)
    with pytest.raises(StoreInputError):
        m.chunk(-1)


def test_select_fields() -> None:
    m = make().select_fields(["resp"])
    assert m.field_names == ["resp"] and list(m.sample_shapes) == ["resp"]
    with pytest.raises(UnknownFieldError):
        make().select_fields(["nope"])


def test_concat_rules() -> None:
    with pytest.raises(StoreInputError):
        BatchMeta.concat([])
    with pytest.raises(ForeignMetaError):
        BatchMeta.concat([make(2), make(2, store="other")])
    with pytest.raises(StoreInputError, match="different fields"):
        BatchMeta.concat([make(2), make(2).select_fields(["obs"])])
    with pytest.raises(StoreInputError, match="more than once"):
        BatchMeta.concat([make(2), make(2)])


def test_with_fields_and_custom_meta() -> None:
    m = make(2).select_fields(["obs"])
    m2 = m.with_fields({"resp": RAGGED}, {"resp": [(3,), (4,)]})
    assert m2.field_names == ["obs", "resp"]
    assert m2.sample_shapes == {"resp": ((3,), (4,))}
    assert m.field_names == ["obs"]  # the original is unchanged
    m3 = m.with_custom_meta([{"a": 1}, {"b": [1, 2]}])
    assert m3.custom_meta == ({"a": 1}, {"b": [1, 2]})
    with pytest.raises(StoreInputError):
        m.with_custom_meta([{}])
    with pytest.raises(SchemaError):
        m.with_custom_meta([{"a": object()}, {}])


def test_wire_round_trip() -> None:
    m = make()
    assert BatchMeta.from_dict(m.to_dict()) == m
    empty = BatchMeta("s", (), (), (), ())
    assert BatchMeta.from_dict(empty.to_dict()) == empty
    with pytest.raises(StoreInputError):
        BatchMeta.from_dict({"store_id": "s"})
    bad = m.to_dict()
    bad["shard_runs"] = bad["shard_runs"][:-1]
    with pytest.raises(StoreInputError):
        BatchMeta.from_dict(bad)


def test_wire_form_is_runs_and_rejects_forged_runs() -> None:
    n = 1024
    m = BatchMeta("s", tuple(range(n)), ("p",) * n, (0,) * 512 + (1,) * 512, (7,) * n)
    d = m.to_dict()
    assert d["index_spans"] == [0, n] and d["partition_runs"] == ["p", n]
    assert d["shard_runs"] == [0, 512, 1, 512] and d["custom_meta"] == []
    assert BatchMeta.from_dict(d) == m
    # the plain per-sample lists of earlier versions still decode
    legacy = {
        "store_id": "s",
        "global_indexes": list(m.global_indexes),
        "partition_ids": list(m.partition_ids),
        "shards": list(m.shards),
        "generations": list(m.generations),
        "field_schemas": {},
    }
    assert BatchMeta.from_dict(legacy) == m
    forged = [
        {**d, "n": 10**12, "index_spans": [0, 10**12]},  # a memory bomb
        {**d, "index_spans": [0, n + 1]},  # more samples than n
        {**d, "index_spans": [0, 0, 0, n]},  # a zero-length run
        {**d, "shard_runs": [0, 512, "1", 512]},  # a shard that is no int
        {**d, "partition_runs": [3, n]},  # a partition that is no str
        {**d, "generation_runs": [7]},  # not pairs
        {**d, "index_spans": [0, 512, 0, 512]},  # a sample twice
    ]
    for bad in forged:
        with pytest.raises(StoreInputError):
            BatchMeta.from_dict(bad)


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=60, unique=True),
    st.data(),
)
def test_wire_round_trip_property(indexes: list[int], data: st.DataObject) -> None:
    n = len(indexes)
    parts = data.draw(st.lists(st.sampled_from(["a", "b"]), min_size=n, max_size=n))
    shards = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    gens = data.draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    custom = data.draw(st.lists(st.sampled_from([{}, {"k": 1}]), min_size=n, max_size=n))
    m = BatchMeta("s", tuple(indexes), tuple(parts), tuple(shards), tuple(gens), {}, tuple(custom))
    assert BatchMeta.from_dict(m.to_dict()) == m


def test_sample_shapes_travel_flat_and_forged_ones_are_refused() -> None:
    from rayless.store.data.schema import shapes_from_wire, shapes_to_wire

    shapes = [(3,), (5,), (1,)]
    wire = shapes_to_wire(shapes)
    assert wire == {"rank": 1, "n": 3, "dims": [3, 5, 1]}
    assert shapes_from_wire(wire) == tuple(shapes)
    mixed = [(2, 4), None, (1, 4)]
    assert shapes_from_wire(shapes_to_wire(mixed)) == tuple(mixed)  # unknown ones: a list
    assert shapes_from_wire(shapes_to_wire([(), ()])) == ((), ())
    for bad in (
        {"rank": 1, "n": 10**9, "dims": [1]},
        {"rank": 2, "n": 2, "dims": [1, 2, 3]},
        {"rank": 1, "n": 2, "dims": [1, -2]},
        {"rank": 1, "n": 2, "dims": [1, "2"]},
        {"rank": True, "n": 1, "dims": [1]},
        "x",
    ):
        with pytest.raises(StoreInputError):
            shapes_from_wire(bad)


def test_samples_without_custom_meta_share_one_read_only_empty_dict() -> None:
    import copy
    import pickle

    m = BatchMeta("s", (0, 1), ("p", "p"), (0, 0), (1, 1))
    assert m.custom_meta == ({}, {}) and isinstance(m.custom_meta[0], dict)
    with pytest.raises(TypeError, match="with_custom_meta"):
        m.custom_meta[0]["k"] = 1
    assert m.custom_meta == ({}, {})
    for clone in (
        copy.deepcopy(m),
        pickle.loads(pickle.dumps(m)),
        BatchMeta.from_dict(m.to_dict()),
    ):
        assert clone == m
    assert m.with_custom_meta([{"k": 1}, {}]).custom_meta == ({"k": 1}, {})
    assert dict(m.select([1]).custom_meta[0]) == {}
