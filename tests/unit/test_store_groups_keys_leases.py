"""The store's pure pieces: group sizes at put time, partition keys, un-consuming, fetch
leases, the seqlen-balanced split, rate meters and the Prometheus text."""

from __future__ import annotations

import pytest

from rayless.store.controller.fetches import Fetches, check_timeout
from rayless.store.controller.samplers import SeqlenBalancedSampler, balanced_split, make_sampler
from rayless.store.controller.state import ControllerState
from rayless.store.data.requests import FetchRequest
from rayless.store.data.schema import DataUpdate, FieldSchema
from rayless.store.errors import StoreInputError, UnknownKeyError
from rayless.store.metrics import RateMeter, prometheus, render_text

X = FieldSchema.from_dict(
    {"kind": "dense", "dtype": "int64", "shape": [], "device": "cpu", "is_nested": False}
)


def state() -> ControllerState:
    c = ControllerState("s")
    c.register_unit("u0")
    return c


def write(c: ControllerState, meta) -> None:  # type: ignore[no-untyped-def]
    c.on_data_update("u0", DataUpdate(meta.partition_ids[0], list(meta.global_indexes), {"x": X}))


def test_a_group_put_that_outgrows_the_partitions_group_size_is_refused_at_put() -> None:
    c = state()
    write(c, c.allocate("p", 4, group_ids=["a", "a", "b", "b"], group_size=2, schemas={"x": X}))
    with pytest.raises(StoreInputError, match="group 'a' would hold 3"):
        c.allocate("p", 1, group_ids=["a"], schemas={"x": X})
    with pytest.raises(StoreInputError, match="group_size is 3"):
        c.allocate("p", 3, group_ids=["c"] * 3, group_size=3)
    with pytest.raises(StoreInputError, match="groups of 4"):
        c.try_fetch("p", ["x"], 4, task="t", sampler={"name": "grouped", "n": 4})
    assert c.try_fetch("p", ["x"], 4, task="t", sampler={"name": "grouped", "n": 2}) is not None


def test_a_grouped_fetch_fixes_the_group_size_for_later_puts() -> None:
    c = state()
    write(c, c.allocate("p", 2, group_ids=["a", "a"], schemas={"x": X}))
    assert c.try_fetch("p", ["x"], 4, task="t", sampler={"name": "grouped", "n": 2}) is None
    assert c.group_size("p") == 2
    with pytest.raises(StoreInputError, match="group size is 2"):
        c.allocate("p", 3, group_ids=["b"] * 3)


def test_a_grouped_fetch_refuses_a_group_larger_than_n_that_a_plain_fetch_partly_took() -> None:
    """A group of 6 put without a size, 4 of it taken by a plain fetch: a grouped fetch of
    n=2 would hand out the last 2 as a "whole" group, splitting the group of 6."""
    c = state()
    write(c, c.allocate("p", 6, group_ids=["g0"] * 6, schemas={"x": X}))
    assert c.try_fetch("p", ["x"], 4, task="t") is not None
    with pytest.raises(StoreInputError, match="group 'g0' of partition 'p' holds 6"):
        c.try_fetch("p", ["x"], 2, task="t", sampler={"name": "grouped", "n": 2})
    assert c.group_size("p") is None  # the refused fetch fixed nothing
    meta = c.try_fetch("p", ["x"], 6, task="u", sampler={"name": "grouped", "n": 6})
    assert meta is not None and c.group_size("p") == 6


def test_partition_keys_map_to_samples_and_are_forgotten_on_clear() -> None:
    c = state()
    meta = c.allocate("p", 2, keys=["k1", "k2"], custom_meta=[{"t": 1}, {"t": 2}], schemas={"x": X})
    write(c, meta)
    with pytest.raises(StoreInputError, match="already name"):
        c.allocate("p", 1, keys=["k1"])
    found, missing = c.kv_lookup("p", ["k2", "zz"])
    assert found.global_indexes == (meta.global_indexes[1],) and missing == [1]
    assert c.kv_list("p").as_dict() == {"p": {"k1": {"t": 1}, "k2": {"t": 2}}}
    c.release(c.clear(c.kv_meta("p", ["k1"])).indexes)
    with pytest.raises(UnknownKeyError):
        c.kv_meta("p", ["k1"])


def test_unconsume_hands_samples_back_and_skips_cleared_ones() -> None:
    c = state()
    meta = c.allocate("p", 3, schemas={"x": X})
    write(c, meta)
    got = c.try_fetch("p", ["x"], 3, task="t")
    assert got is not None and c.try_fetch("p", ["x"], 1, task="t") is None
    c.clear(meta.select([0]))
    assert sorted(c.unconsume("t", "p", got.global_indexes)) == sorted(meta.global_indexes[1:])
    assert c.try_fetch("p", ["x"], 2, task="t") is not None


def test_fetch_leases_cancels_and_early_cancels() -> None:
    f = Fetches(lease_after=5.0)
    w = f.wait("a", FetchRequest("p", ("x",), 2, "t"))
    assert f.cancel("a") is w and w.cancelled
    f.done(w)
    f.lease("b", "t", "p", [1, 2])
    assert f.cancel("b") is None and f.unlease("b") is not None  # served: unlease hands back
    assert (
        f.cancel("c") is None and f.wait("c", FetchRequest("p", ("x",), 1, "t")).cancelled
    )  # early cancel
    f.lease("d", "t", "p", [3])
    assert f.expired(now=10**9)[0].indexes == (3,)
    for bad in (-1, "1", True):
        with pytest.raises(StoreInputError):
            check_timeout(bad)


def test_balanced_split_evens_token_totals_and_keeps_groups() -> None:
    lengths = [100, 1, 1, 1, 50, 50, 1, 1]
    parts = balanced_split(lengths, 2)
    totals = [sum(lengths[p] for p in part) for part in parts]
    assert sorted(p for part in parts for p in part) == list(range(8))
    assert all(len(p) == 4 for p in parts) and max(totals) - min(totals) <= 100 - 52 + 4
    grouped = balanced_split([5, 5, 1, 1, 9, 9, 2, 2], 2, group=2)
    assert all(
        set(part) in ({0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 6, 7}, {2, 3, 4, 5}) for part in grouped
    )
    s = make_sampler({"name": "seqlen_balanced", "dp_size": 2})
    assert isinstance(s, SeqlenBalancedSampler)
    split = s.split([{"total_lengths": v} for v in lengths])
    assert [sum(lengths[p] for p in part) for part in split] == totals
    with pytest.raises(StoreInputError):
        balanced_split([1, 2, 3], 2)


def test_rate_meter_and_prometheus_text() -> None:
    r = RateMeter(window=10)
    r.add(5, now=100.0)
    r.add(5, now=105.0)
    assert r.rate(now=106.0) == 1.0 and r.rate(now=200.0) == 0.0 and r.total == 10
    m = {
        "name": "st",
        "store_id": "abc",
        "controller": {
            "puts": {"total": 3, "per_s": 0.3},
            "fetches": {"total": 1, "per_s": 0.1},
            "waiting": [{"text": "a fetch waits"}],
            "partitions": {"p": {"samples": 3, "consumers": {"t": 1}}},
        },
        "units": [{"unit_id": "u0", "node_id": "n0", "alive": True, "bytes_used": 24, "rows": 3}],
    }
    text = prometheus(m)
    assert "# TYPE rayless_store_unit_bytes gauge" in text
    assert 'rayless_store_unit_bytes{store="abc",unit="u0",node="n0"} 24' in text
    assert 'rayless_store_consumed{store="abc",partition="p",task="t"} 1' in text
    assert "rayless_store_waiting_fetches" in text and "a fetch waits" in render_text(m)


def test_prometheus_values_keep_their_precision() -> None:
    # {float(v):g} printed 4194304 bytes as 4.1943e+06 and rounded counters past 10**6
    m = {
        "name": "st",
        "store_id": "abc",
        "controller": {
            "puts": {"total": 12_345_678, "per_s": 0.123456789},
            "fetches": {"total": 1, "per_s": float("inf")},
            "waiting": [],
            "partitions": {"p": {"samples": 2**40 + 1, "consumers": {"t": 1_000_001}}},
        },
        "units": [
            {"unit_id": "u0", "node_id": "n0", "alive": True, "bytes_used": 4194304, "rows": 3}
        ],
    }
    text = prometheus(m)
    assert 'rayless_store_unit_bytes{store="abc",unit="u0",node="n0"} 4194304\n' in text + "\n"
    assert 'rayless_store_consumed{store="abc",partition="p",task="t"} 1000001' in text
    assert " 12345678" in text and " 1099511627777" in text
    assert "e+" not in text
