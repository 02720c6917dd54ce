"""UnitKeys: the storage units' own key-value store, seen from one client.

Unit keys (rayless's own, no partition) hash each key onto one unit (``kv_shard_of``) and
overwrite in place; nothing of the controller is involved (these keys are never fetched).
``Store.kv_put(keys, td)``, ``kv_get``, ``kv_keys`` and ``kv_delete`` run here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensordict import TensorDict

from rayless.store.client.link import StoreLink
from rayless.store.data.rows import place, take
from rayless.store.data.schema import merge_parts, split_columns
from rayless.store.unit.shard import kv_shard_of

__all__ = ["UnitKeys"]


class UnitKeys:
    """The units' KV over one client's :class:`StoreLink` (see the module docstring)."""

    def __init__(self, link: StoreLink) -> None:
        self._link = link

    def _by_key(self, keys: Sequence[str]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for pos, key in enumerate(keys):
            groups.setdefault(kv_shard_of(key, len(self._link.table)), []).append(pos)
        return groups

    async def put(self, keys: list[str], td: Any, timeout: float) -> None:
        """Store ``td``'s rows under ``keys`` (validated str) on their units. Raises
        SchemaError (``td`` is not a TensorDict of ``len(keys)`` rows), what the units raise
        (StoreInputError/SchemaError, StoreFullError), UnitLostError."""
        columns = split_columns(td, len(keys))
        groups = self._by_key(keys)
        shards, calls = [], []
        for shard, positions in groups.items():
            sub = td if len(groups) == 1 else take(columns, positions, len(keys))
            shards.append(shard)
            calls.append(
                self._link.table[shard].handle.kv_put([keys[p] for p in positions], sub, timeout)
            )
        await self._link.gather(shards, calls)

    async def get(self, keys: list[str], fields: Sequence[str] | None, device: Any) -> TensorDict:
        """The rows under ``keys`` (validated str), in order. Raises UnknownKeyError,
        UnknownFieldError, UnitLostError."""
        groups = self._by_key(keys)
        f = None if fields is None else list(fields)
        calls = [
            self._link.table[s].handle.kv_get([keys[p] for p in pos], f)
            for s, pos in groups.items()
        ]
        results = await self._link.gather(list(groups), calls)
        if not results:
            return TensorDict({}, batch_size=[0])
        schemas = {n: c.schema for n, c in split_columns(results[0]).items()}
        td = merge_parts(len(keys), schemas, list(zip(groups.values(), results, strict=True)))
        if device is not None:
            td = place(td, schemas, device)
        return td

    async def keys(self) -> list[str]:
        """Every unit key, unit by unit. Raises UnitLostError."""
        table = self._link.table
        shards = [u.shard for u in table]
        lists = await self._link.gather(shards, [u.handle.kv_list() for u in table])
        return [k for keys in lists for k in keys]

    async def delete(self, keys: list[str]) -> int:
        """Delete ``keys`` (validated str; absent ones ignored); how many were deleted.
        Raises UnitLostError."""
        groups = self._by_key(keys)
        calls = [
            self._link.table[s].handle.kv_delete([keys[p] for p in pos])
            for s, pos in groups.items()
        ]
        return sum(await self._link.gather(list(groups), calls))
