"""Checkpoint loads are checked before they write and undone when they fail part-way: a bad
manifest, a missing data file or a store without room is a CheckpointError that leaves the
target untouched, and a load that fails while writing leaves nothing behind, so a retry
works."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from rayless.actors import Cluster
from rayless.store import CheckpointError, Store, StoreInputError

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster(nodes=1)]


async def _saved(st: Store, directory: Path) -> dict[str, Any]:
    """Two partitions of 1 KiB rows (p0: 8, p1: 8), two samples of p0 consumed by "t"."""
    await st.put(TensorDict({"x": torch.ones(8, 256)}, [8]), "p0")
    await st.put(TensorDict({"x": torch.ones(8, 256), "y": torch.arange(8)}, [8]), "p1")
    await st.get_meta("p0", ["x"], 2, task="t", timeout=5)
    return await st.save_checkpoint(directory)


def _rewrite(directory: Path, change: Any) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


async def test_a_bad_checkpoint_is_refused_before_anything_is_written(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    src = await Store.create(local_cluster, num_units=2, name="ck-src")
    await _saved(src, tmp_path / "good")
    target = await Store.create(local_cluster, num_units=2, name="ck-dst")

    def broken(name: str, change: Any) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        for f in (tmp_path / "good").iterdir():
            (directory / f.name).write_bytes(f.read_bytes())
        _rewrite(directory, change)
        return directory

    def no_partitions(m: dict[str, Any]) -> None:
        del m["partitions"]

    def consumed_999(m: dict[str, Any]) -> None:
        m["partitions"][1]["consumed"] = {"t": [999]}

    def outside(m: dict[str, Any]) -> None:
        m["partitions"][1]["groups"][0]["file"] = "../good/manifest.json"

    cases = {  # before: KeyError 'partitions'; KeyError 999 after both partitions were written
        "no-partitions": (no_partitions, "no 'partitions'"),
        "consumed-999": (consumed_999, "[999]"),
        "outside": (outside, "not a file name"),
    }
    for name, (change, text) in cases.items():
        with pytest.raises(CheckpointError, match=text.replace("[", r"\[").replace("]", r"\]")):
            await target.load_checkpoint(broken(name, change))
        assert await target.partitions() == [], name
    missing = broken("missing-file", lambda m: None)
    manifest = json.loads((missing / "manifest.json").read_text())
    (missing / manifest["partitions"][1]["groups"][0]["file"]).unlink()
    with pytest.raises(CheckpointError, match="missing"):  # before: FileNotFoundError, p0 left
        await target.load_checkpoint(missing)
    assert await target.partitions() == []
    assert issubclass(CheckpointError, StoreInputError)
    back = await target.load_checkpoint(tmp_path / "good")  # the target is as it was: it loads
    assert sorted(back) == ["p0", "p1"]
    assert (await target.consumption_status("p0", "t"))["consumed"] == 2


async def test_a_store_too_small_fails_fast_and_a_retry_works_once_there_is_room(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    src = await Store.create(local_cluster, num_units=2, name="ck-src2")
    await _saved(src, tmp_path / "ck")  # 16 KiB of rows, 8 KiB per unit
    small = await Store.create(local_cluster, num_units=2, name="ck-small", capacity_bytes=12288)
    filler = await small.put(TensorDict({"x": torch.ones(8, 256)}, [8]), "filler")  # 4 KiB/unit
    # refused by the room check, before any put (before: StoreFullError after a 30 s wait)
    with pytest.raises(CheckpointError, match="nothing was written"):
        await small.load_checkpoint(tmp_path / "ck")
    assert await small.partitions() == ["filler"]  # before: p0 was left behind
    await small.clear(filler)
    back = await small.load_checkpoint(tmp_path / "ck")  # before: "partitions ['p0'] exist"
    assert sorted(back) == ["p0", "p1"]
    meta = await small.get_meta("p1", ["x", "y"], 8, task="u", timeout=5)
    assert sorted((await small.get(meta))["y"].tolist()) == list(range(8))


async def test_a_load_that_fails_while_writing_leaves_nothing_behind(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    src = await Store.create(local_cluster, num_units=2, name="ck-src3")
    await _saved(src, tmp_path / "ck")

    def overfull_group(m: dict[str, Any]) -> None:  # p1's put is refused: 8 samples, group of 2
        m["partitions"][1]["group_size"] = 2
        m["partitions"][1]["groups"][0]["group_ids"] = [0] * 8

    _rewrite(tmp_path / "ck", overfull_group)
    target = await Store.create(local_cluster, num_units=2, name="ck-dst3")
    with pytest.raises(StoreInputError, match="group"):
        await target.load_checkpoint(tmp_path / "ck")
    assert await target.partitions() == []  # before: p0 was left, and a retry was refused

    def fixed(m: dict[str, Any]) -> None:
        m["partitions"][1]["group_size"] = None
        m["partitions"][1]["groups"][0]["group_ids"] = [None] * 8

    _rewrite(tmp_path / "ck", fixed)
    assert sorted(await target.load_checkpoint(tmp_path / "ck")) == ["p0", "p1"]
