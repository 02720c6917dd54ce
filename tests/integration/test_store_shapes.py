"""Issue 41 item 9: a dense field put with another per-sample shape (TransferQueue users pad
each batch to its own longest length) is kept, not refused. Rows already stored stay where
they are; each shape is a dense column part of its own; a read of samples of one shape is
dense (through the same-host plane: one copy per byte, no socket read), a read mixing shapes
is nested (jagged when only the first per-sample dim differs, else strided) — on the
same-host path and on the socket path; KV values too; checkpoints keep such fields; a dtype
or rank change is still a SchemaError."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.store import SchemaError, Store
from tests.integration.test_store_budgets import _store_calls

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=2)]

B = 4


def batch(width: int, start: float, rows: int = B) -> torch.Tensor:
    return torch.arange(rows * width, dtype=torch.float32).view(rows, width) + start


def rows_of(value: torch.Tensor) -> list[list[float]]:
    return [r.tolist() for r in value.unbind(0)]


async def _reads(cluster: Cluster) -> tuple[int, int]:
    calls = await _store_calls(cluster)
    return calls.get("StorageUnit.read", 0), calls.get("StorageUnit.locate", 0)


@pytest.mark.parametrize("path", ["same_host", "socket"])
async def test_puts_of_other_widths_stay_dense_per_batch_and_mix_nested(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path == "socket":
        monkeypatch.setenv("RAYLESS_STORE_LOCAL", "0")  # the client reads units by socket
    st = await Store.create(local_cluster, num_units=2, name=f"shapes-{path}")
    try:
        widths = [4, 6, 4]
        data = [batch(w, 100.0 * k) for k, w in enumerate(widths)]
        ids = [torch.arange(B) + B * k for k in range(3)]
        metas = [
            await st.put(TensorDict({"x": x, "id": i}, [B]), "p")
            for x, i in zip(data, ids, strict=True)
        ]
        every = await st.get_meta("p", ["x", "id"], 3 * B, mode="peek", timeout=10)
        schema = every.field_schemas["x"]
        assert (schema.kind, schema.dtype, schema.shape) == ("dense", "float32", (None,))
        order = every.global_indexes
        want = {
            int(m.global_indexes[j]): data[k][j].tolist()
            for k, m in enumerate(metas)
            for j in range(B)
        }

        # a read mixing shapes: nested (jagged: only the first per-sample dim differs)
        before = await _reads(local_cluster)
        got = await st.get(every)
        x = got["x"]
        assert x.is_nested and x.layout == torch.jagged and x.dtype == torch.float32
        assert rows_of(x) == [want[i] for i in order]
        index_of = {
            int(i): k * B + j for k, m in enumerate(metas) for j, i in enumerate(m.global_indexes)
        }
        assert got["id"].tolist() == [index_of[i] for i in order]

        # each batch alone: dense, exact, the same-host path reads no rows by socket
        for k, meta in enumerate(metas):
            one = await st.get(meta)
            assert not one["x"].is_nested and one["x"].shape == (B, widths[k])
            assert torch.equal(one["x"], data[k]) and torch.equal(one["id"], ids[k])
        reads, locates = await _reads(local_cluster)
        if path == "same_host":  # every read, the mixed one too, copied out of the segments
            assert reads == before[0] and locates - before[1] == 2 + 3 * 2
        else:
            assert locates == before[1] and reads - before[0] == 2 + 3 * 2

        # batches of one width fetched together: dense
        both = await st.get(
            type(metas[0]).concat([metas[0], metas[2]])  # the (B, 4) puts
        )
        assert not both["x"].is_nested
        assert torch.equal(both["x"], torch.cat([data[0], data[2]]))

        # dtype and rank changes are still refused
        with pytest.raises(SchemaError, match="dtype"):
            await st.put(TensorDict({"x": torch.zeros(B, 4, dtype=torch.int64)}, [B]), "p")
        with pytest.raises(SchemaError, match="dim samples"):
            await st.put(TensorDict({"x": torch.zeros(B, 2, 2)}, [B]), "p")

        # clearing the (B, 6) batch frees its part; the rest reads dense again
        await st.clear(metas[1])
        rest = await st.get_meta("p", ["x"], 2 * B, mode="peek", timeout=10)
        x = (await st.get(rest))["x"]
        assert not x.is_nested and x.shape == (2 * B, 4)
        assert x.tolist() == [want[i] for i in rest.global_indexes]
        # and a put of yet another width reuses nothing of the others' rows
        third = await st.put(TensorDict({"x": batch(3, 7.0), "id": ids[0]}, [B]), "p")
        assert torch.equal((await st.get(third))["x"], batch(3, 7.0))
        # a column-wise rewrite of stored samples with another width moves them to its part
        await st.put(TensorDict({"x": batch(5, -9.0)}, [B]), meta=metas[0])
        assert torch.equal((await st.get(metas[0]))["x"], batch(5, -9.0))
        assert torch.equal((await st.get(metas[2]))["x"], data[2])
        # widths alternating batch after batch, each cleared after its read: slots reused
        for k in range(8):
            x = batch(4 + 3 * (k % 2), 1000.0 * k)
            meta = await st.put(TensorDict({"x": x, "id": ids[0]}, [B]), "q")
            assert torch.equal((await st.get(meta))["x"], x)
            await st.clear(meta)
    finally:
        await st.aclose()


async def test_zero_copy_get_of_one_width_is_views_and_mixed_is_nested(
    local_cluster: Cluster,
) -> None:
    st = await Store.create(local_cluster, num_units=1, name="shapes-zc")
    try:
        a = await st.put(TensorDict({"x": batch(4, 0.0)}, [B]), "p")
        b = await st.put(TensorDict({"x": batch(6, 50.0)}, [B]), "p")
        view = (await st.get(b, zero_copy=True))["x"]
        assert not view.is_nested and torch.equal(view, batch(6, 50.0))
        both = (await st.get(type(a).concat([a, b]), zero_copy=True))["x"]
        assert both.is_nested
        assert rows_of(both) == rows_of(batch(4, 0.0)) + rows_of(batch(6, 50.0))
    finally:
        await st.aclose()


async def test_kv_values_of_other_lengths_by_key(local_cluster: Cluster) -> None:
    st = await Store.create(local_cluster, num_units=2, name="shapes-kv")
    try:
        keys = [f"k{i}" for i in range(6)]
        vals = {k: torch.arange(3 + i, dtype=torch.int64) + 10 * i for i, k in enumerate(keys)}
        for k in keys:  # unit keys: one put per key, each of its own length
            await st.kv_put([k], TensorDict({"v": vals[k].unsqueeze(0)}, [1]))
        got = await st.kv_get(keys)
        assert got["v"].is_nested and rows_of(got["v"]) == [vals[k].tolist() for k in keys]
        one = await st.kv_get(["k4"])
        assert not one["v"].is_nested and one["v"].tolist() == [vals["k4"].tolist()]

        # TransferQueue's partition-keyed face: each kv_batch_put its own padded width
        await st.kv_batch_put(["a", "b"], "kv", TensorDict({"r": batch(4, 0.0, 2)}, [2]))
        await st.kv_batch_put(["c"], "kv", TensorDict({"r": batch(7, 9.0, 1)}, [1]))
        mixed = await st.kv_batch_get(["a", "c", "b"], "kv")
        assert mixed["r"].is_nested
        assert rows_of(mixed["r"]) == [
            batch(4, 0.0, 2)[0].tolist(),
            batch(7, 9.0, 1)[0].tolist(),
            batch(4, 0.0, 2)[1].tolist(),
        ]
        dense = await st.kv_batch_get(["b", "a"], "kv")
        assert torch.equal(dense["r"], batch(4, 0.0, 2).flip(0))
    finally:
        await st.aclose()


async def test_a_multi_shape_field_survives_a_checkpoint(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    st = await Store.create(local_cluster, num_units=2, name="shapes-ckpt-a")
    other = await Store.create(local_cluster, num_units=1, name="shapes-ckpt-b")
    try:
        grid = torch.arange(B * 2 * 3, dtype=torch.float32).view(B, 2, 3)
        wide = torch.arange(B * 5 * 4, dtype=torch.float32).view(B, 5, 4) + 1000
        await st.put(TensorDict({"x": grid, "y": torch.arange(B)}, [B]), "p")
        await st.put(TensorDict({"x": wide, "y": torch.arange(B) + B}, [B]), "p")
        await st.save_checkpoint(tmp_path / "ck")
        restored = await other.load_checkpoint(tmp_path / "ck")
        assert len(restored["p"]) == 2 * B
        meta = await other.get_meta("p", ["x", "y"], 2 * B, mode="peek", timeout=10)
        assert meta.field_schemas["x"].kind == "dense"  # still parts of dense, not nested
        got = await other.get(meta)
        x = got["x"]
        assert x.is_nested and x.layout == torch.strided  # (2, 3) and (5, 4): strided
        want = {int(y): r for y, r in zip(torch.arange(2 * B), [*grid, *wide], strict=True)}
        for y, row in zip(got["y"].tolist(), x.unbind(0), strict=True):
            assert torch.equal(row, want[y])
        # a later put of either shape goes on as dense parts
        more = await other.put(TensorDict({"x": grid + 1, "y": torch.arange(B)}, [B]), "p")
        assert torch.equal((await other.get(more))["x"], grid + 1)
    finally:
        await other.aclose()
        await st.aclose()


async def test_each_width_reuses_its_own_part_after_clears(
    local_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAYLESS_STORE_LEASE", "0")  # (no spare slots leased ahead)
    st = await Store.create(local_cluster, num_units=1, name="shapes-reuse")
    try:
        keep = await st.put(TensorDict({"x": batch(4, -1.0)}, [B]), "p")  # parts stay alive
        used = []
        for k in range(8):
            x = batch(4 + 2 * (k % 2), 10.0 * k)
            meta = await st.put(TensorDict({"x": x}, [B]), "p")
            mixed = (await st.get(type(keep).concat([keep, meta])))["x"]
            assert rows_of(mixed) == rows_of(batch(4, -1.0)) + rows_of(x)
            await st.clear(meta)
            used.append((await st.stats())["unit_stats"][0]["used_bytes"])
        # the width-4 part (it keeps ``keep``) reuses its freed slots, never growing; the
        # width-6 part is dropped with its last row and made again (like any empty column)
        assert used[2:] == used[:2] * 3 and used[0] == 8 * 4 * 4  # 8 slots of 4 float32
    finally:
        await st.aclose()
