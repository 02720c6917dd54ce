"""Weight-sync layouts: buckets, dtype conversion, mismatches that name the tensor."""

from __future__ import annotations

import pytest
import torch

from rayless.weights.errors import WeightMismatchError
from rayless.weights.layout import (
    bucket_sizes,
    check,
    make_layout,
    read_into,
    targets_of,
    write_from,
)


def _round_trip(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor], bucket: int) -> None:
    layout = make_layout(src, bucket)
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in bucket_sizes(layout)]
    write_from(src, layout, buckets)
    check(layout, dst, strict=True)
    read_into(layout, buckets, dst)


def test_tensors_never_straddle_buckets_and_a_big_one_gets_its_own() -> None:
    src = {"a": torch.ones(10), "b": torch.ones(10), "big": torch.ones(100), "c": torch.ones(3)}
    layout = make_layout(src, bucket_bytes=256)
    where = {row[0]: row[3] for row in layout}
    assert where["a"] == where["b"] == 0
    assert where["big"] == 1 and where["c"] == 2
    for _, _, _, b, offset, n in layout:
        assert offset % 64 == 0 and offset + n <= bucket_sizes(layout)[b]


def test_every_dtype_round_trips_and_converts_to_the_targets_dtype() -> None:
    src = {
        "w": torch.randn(5, 7, dtype=torch.bfloat16),
        "mask": torch.rand(9) > 0.5,
        "steps": torch.arange(4, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
    }
    dst = {
        "w": torch.zeros(5, 7, dtype=torch.float16),
        "mask": torch.zeros(9, dtype=torch.bool),
        "steps": torch.zeros(4, dtype=torch.int64),
        "scalar": torch.tensor(0.0, dtype=torch.float64),
        "empty": torch.empty(0, 3),
    }
    _round_trip(src, dst, bucket=64)
    assert dst["w"].dtype == torch.float16
    assert torch.equal(dst["w"], src["w"].to(torch.float16))
    assert torch.equal(dst["mask"], src["mask"])
    assert torch.equal(dst["steps"], src["steps"])
    assert float(dst["scalar"]) == 2.5


def test_a_module_is_filled_in_place() -> None:
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    dst = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).double()
    weight = dst[0].weight
    _round_trip(dict(src.state_dict()), targets_of(dst), bucket=1 << 20)
    assert dst[0].weight is weight  # the same Parameter, new values
    assert torch.allclose(dst[0].weight.float(), src[0].weight)
    assert int(dst[1].num_batches_tracked) == int(src[1].num_batches_tracked)


def test_mismatches_name_the_tensor() -> None:
    layout = make_layout({"a": torch.ones(2, 3), "b": torch.ones(1)}, 1 << 20)
    with pytest.raises(WeightMismatchError, match=r"'a'.*shape") as info:
        check(layout, {"a": torch.ones(3, 2), "b": torch.ones(1)}, strict=True)
    assert info.value.tensor == "a"
    with pytest.raises(WeightMismatchError, match="'b'") as info:
        check(layout, {"a": torch.ones(2, 3)}, strict=True)
    assert info.value.tensor == "b"
    with pytest.raises(WeightMismatchError, match="'extra'"):
        check(layout, {"a": torch.ones(2, 3), "b": torch.ones(1), "extra": torch.ones(1)}, True)
    check(layout, {"a": torch.ones(2, 3)}, strict=False)  # a subset is fine when not strict


def test_targets_must_be_a_module_or_a_dict() -> None:
    with pytest.raises(TypeError):
        targets_of([torch.ones(1)])


def test_tied_tensors_are_laid_out_once_and_read_back_under_both_names() -> None:
    """An embedding tied to the head (one tensor, two names) takes its bytes once; a target
    with both names gets both filled, a loader gets the tensor once (the first name)."""
    from rayless.weights.layout import feed_into

    embed = torch.arange(12, dtype=torch.float32).view(3, 4)
    state = {"embed.weight": embed, "bias": torch.ones(4), "head.weight": embed}
    layout = make_layout(state, 1 << 20)
    assert bucket_sizes(layout) == bucket_sizes(
        make_layout({k: state[k] for k in list(state)[:2]}, 1 << 20)
    )
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in bucket_sizes(layout)]
    write_from(state, layout, buckets)
    targets = {k: torch.zeros(v.shape) for k, v in state.items()}
    read_into(layout, buckets, targets)
    assert torch.equal(targets["head.weight"], embed) and torch.equal(
        targets["embed.weight"], embed
    )
    got: list[str] = []
    feed_into(layout, buckets, lambda ws: got.extend(n for n, _ in ws), lambda n: n, None)
    assert got == ["embed.weight", "bias"]


def test_an_empty_tensor_is_no_alias_of_the_tensor_after_it() -> None:
    """An empty tensor takes no bytes, so the next tensor starts at its offset: both copied."""
    state = {"empty": torch.zeros(0), "w": torch.full((4,), 7.0), "tail": torch.ones(2)}
    layout = make_layout(state, 1 << 20)
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in bucket_sizes(layout)]
    write_from(state, layout, buckets)
    targets = {k: torch.zeros(v.shape) for k, v in state.items()}
    read_into(layout, buckets, targets)
    assert targets["w"].tolist() == [7.0] * 4 and targets["tail"].tolist() == [1.0, 1.0]


def test_batched_copies_round_trip_every_kind_of_tensor() -> None:
    """Many small tensors (one foreach call), a big one, a non-contiguous source, an empty
    one, an alias and a scalar: written and read back bit-exact, converted where asked."""
    from rayless.weights.layout import BATCH, bucket_sizes, read_into, write_from

    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {f"s{i}": torch.full((3, i + 1), float(i), dtype=torch.bfloat16) for i in range(50)}
    state.update(
        big=torch.randn(BATCH // 4 + 7),
        strided=base.t(),  # not contiguous
        empty=torch.empty(0, 3),
        scalar=torch.tensor(5, dtype=torch.int64),
    )
    state["alias"] = state["big"]
    layout = make_layout(state, 4096)
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in bucket_sizes(layout)]
    write_from(state, layout, buckets)
    same = {k: torch.zeros_like(v) for k, v in state.items()}
    same["strided"] = torch.zeros(6, 4).t().contiguous().t()  # a non-contiguous target
    read_into(layout, buckets, same)
    assert all(torch.equal(same[k], v) for k, v in state.items())
    wide = {k: torch.zeros(v.shape, dtype=torch.float32) for k, v in state.items() if k[0] == "s"}
    read_into(layout, buckets, wide)
    assert all(torch.equal(wide[k], state[k].float()) for k in wide)


def test_big_copies_and_comparisons_run_in_pieces_on_threads() -> None:
    from rayless.weights.delta import changed_rows
    from rayless.weights.layout import PARALLEL, PIECE, bucket_sizes, read_into, write_from

    g = torch.Generator().manual_seed(1)
    state = {f"w{i}": torch.randn(PIECE // 4 + 1000 * i, generator=g) for i in range(5)}
    state["small"] = torch.randn(10, generator=g)
    assert sum(t.numel() * 4 for t in state.values()) >= PARALLEL
    layout = make_layout(state, 1 << 40)
    buckets = [torch.zeros(n, dtype=torch.uint8) for n in bucket_sizes(layout)]
    write_from(state, layout, buckets)
    back = {k: torch.zeros_like(v) for k, v in state.items()}
    read_into(layout, buckets, back)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    assert changed_rows(state, layout, buckets, None) == set()
    state["w3"] = state["w3"].clone()
    state["w3"][-1] += 1  # the last byte of the last piece
    assert changed_rows(state, layout, buckets, None) == {3}


def test_many_small_tensors_are_copied_in_foreach_chunks_on_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rayless.weights import layout as layout_mod
    from rayless.weights.layout import PARALLEL, PIECE

    g = torch.Generator().manual_seed(2)
    n = PARALLEL // (256 << 10) + 3  # tensors of 256 KiB (below BATCH) past PARALLEL in all
    state = {f"t{i}": torch.randn(64 << 10, generator=g) for i in range(n)}
    chunks: list[int] = []
    real = layout_mod._foreach_copy

    def counting(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        chunks.append(sum(d.numel() for d, _ in pairs))
        real(pairs)

    monkeypatch.setattr(layout_mod, "_foreach_copy", counting)
    monkeypatch.setattr(layout_mod.os, "cpu_count", lambda: 2)
    back = {k: torch.zeros_like(v) for k, v in state.items()}
    _round_trip(state, back, 1 << 40)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    # both directions in chunks of about PIECE bytes, not one call of everything
    assert len(chunks) >= 2 * (PARALLEL // PIECE) and max(chunks) <= PIECE + (256 << 10)
