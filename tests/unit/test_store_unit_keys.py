"""UnitKeys alone: each key lives on the unit it hashes to, rows come back in the keys' order
(units faked by ShardStorage behind a StoreLink)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from rayless.store.client.link import StoreLink
from rayless.store.client.unit_keys import UnitKeys
from rayless.store.data.messages import UnitView
from rayless.store.unit.shard import ShardStorage, kv_shard_of


class _Unit:
    """A unit actor's KV calls, answered by a ShardStorage in process."""

    def __init__(self, unit_id: str) -> None:
        self.shard = ShardStorage(unit_id)

    async def kv_put(self, keys: list[str], td: Any, timeout: float) -> Any:
        return self.shard.kv_put(keys, td)

    async def kv_get(self, keys: list[str], fields: list[str] | None) -> TensorDict:
        return self.shard.kv_get(keys, fields)

    async def kv_list(self) -> list[str]:
        return self.shard.kv_list()

    async def kv_delete(self, keys: list[str]) -> int:
        return self.shard.kv_delete(keys)


async def test_unit_keys_are_put_on_their_units_and_read_back_in_order() -> None:
    units = [_Unit("u0"), _Unit("u1"), _Unit("u2")]
    table = [UnitView(f"u{i}", i, handle=u) for i, u in enumerate(units)]
    kv = UnitKeys(StoreLink(object(), table, "s"))  # type: ignore[arg-type]
    keys = [f"k{i}" for i in range(12)]
    td = TensorDict({"x": torch.arange(12.0), "y": torch.arange(12) * 2}, batch_size=[12])
    await kv.put(keys, td, 0.0)
    for i, unit in enumerate(units):
        assert unit.shard.kv_list() == [k for k in keys if kv_shard_of(k, 3) == i]
    wanted = ["k7", "k0", "k11", "k3"]
    got = await kv.get(wanted, ["x"], None)
    assert got["x"].tolist() == [7.0, 0.0, 11.0, 3.0] and list(got.keys()) == ["x"]
    assert sorted(await kv.keys()) == sorted(keys)
    assert await kv.delete(["k0", "k1", "nope"]) == 2
    assert len(await kv.keys()) == 10
    assert (await kv.get([], None, None)).batch_size == torch.Size([0])
