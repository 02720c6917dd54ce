"""The store's two key-value faces (a mixin of :class:`~rayless.store.client.Store`).

**Partition keys** (TransferQueue 0.1.x's KV interface, same names and arguments):
``kv_batch_put(keys, partition_id, fields=None, tags=None)`` names samples of a partition by
string keys: a new key allocates a sample (its ``tags`` are the sample's custom metadata),
an existing key gets ``fields`` written onto its sample (a column-wise put) and its tags
replaced. The samples are ordinary samples: ``get_meta`` fetches them, ``clear`` removes
them. ``kv_batch_get(keys, partition_id, select_fields=None)`` reads them in order,
``kv_list(partition_id=None)`` returns ``{partition: {key: tags}}`` and
``kv_clear(keys, partition_id)`` removes them. A batch mixing new and existing keys is two
puts (new samples, then fields onto the old ones): each is atomic, the pair is not.

**Unit keys** (rayless's own, no partition): ``kv_put(keys, td)`` / ``kv_get`` /
``kv_keys`` / ``kv_delete`` hash each key onto one unit and overwrite in place; nothing of
the controller is involved (these keys are never fetched).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensordict import TensorDict, TensorDictBase

from rayless.store.errors import StoreInputError
from rayless.store.meta import BatchMeta
from rayless.store.rows import place, take
from rayless.store.schema import merge_parts, split_columns
from rayless.store.shard import kv_shard_of

if TYPE_CHECKING:
    from rayless.actors import ActorHandle

__all__ = ["KVBatchMeta", "KVFace"]

PUT_TIMEOUT = 30.0


@dataclass(frozen=True)
class KVBatchMeta:
    """What ``kv_batch_put`` returns: the keys, their tags, the partition and the fields the
    samples hold now (TransferQueue's KVBatchMeta); ``meta`` is the samples' BatchMeta."""

    keys: list[str]
    tags: list[dict[str, Any]]
    partition_id: str
    fields: list[str]
    meta: BatchMeta | None = field(default=None, compare=False)


class KVFace:
    """The KV methods of Store (see the module docstring)."""

    if TYPE_CHECKING:
        store_id: str

        @property
        def controller(self) -> ActorHandle[Any]: ...
        @property
        def units(self) -> list[dict[str, Any]]: ...
        async def _gather(self, shards: list[int], calls: list[Any]) -> list[Any]: ...
        async def put(
            self,
            td: TensorDictBase,
            partition: str | None = None,
            *,
            meta: BatchMeta | None = None,
            env_ids: Sequence[str] | None = None,
            group_ids: Sequence[Any] | None = None,
            custom_meta: Sequence[Mapping[str, Any]] | None = None,
            timeout: float = PUT_TIMEOUT,
            keys: Sequence[str] | None = None,
            group_size: int | None = None,
        ) -> BatchMeta: ...
        async def get(self, meta: BatchMeta, fields: Sequence[str] | None = None) -> Any: ...
        async def clear(self, meta: BatchMeta) -> None: ...
        async def set_custom_meta(
            self, meta: BatchMeta, custom: Sequence[Mapping[str, Any]]
        ) -> None: ...

    # -- partition keys (TransferQueue's KV interface) -----------------------------------

    async def kv_batch_put(
        self,
        keys: Sequence[str],
        partition_id: str,
        fields: TensorDictBase | None = None,
        tags: Sequence[Mapping[str, Any]] | None = None,
    ) -> KVBatchMeta:
        """Write ``fields`` (batch_size ``len(keys)``) and/or ``tags`` under ``keys`` of
        ``partition_id``; returns their KVBatchMeta.

        Raises StoreInputError (neither fields nor tags, lengths that differ, bad keys) and
        every error of ``put``.
        """
        keys = _kv_keys(keys)
        if fields is None and tags is None:
            raise StoreInputError("kv_batch_put needs fields or tags")
        if fields is not None and int(fields.batch_size[0]) != len(keys):
            raise StoreInputError(
                f"{len(keys)} keys for a TensorDict of batch size {fields.batch_size[0]}"
            )
        tag_list = None if tags is None else [dict(t) for t in tags]
        if tag_list is not None and len(tag_list) != len(keys):
            raise StoreInputError(f"{len(keys)} keys for {len(tag_list)} tags")
        old, missing = await self.controller.kv_lookup(partition_id, keys)
        present = [p for p in range(len(keys)) if p not in set(missing)]
        if missing:
            data = fields if fields is not None else TensorDict({}, batch_size=[len(keys)])
            sub = data if len(missing) == len(keys) else _rows(data, missing)
            await self.put(
                sub,
                partition_id,
                keys=[keys[p] for p in missing],
                custom_meta=None if tag_list is None else [tag_list[p] for p in missing],
            )
        if present:
            if fields is not None and list(fields.keys()):
                sub = fields if len(present) == len(keys) else _rows(fields, present)
                old = await self.put(sub, meta=old)
            if tag_list is not None:
                await self.set_custom_meta(old, [tag_list[p] for p in present])
        meta = await self.controller.kv_meta(partition_id, keys)
        return KVBatchMeta(
            list(keys), [dict(c) for c in meta.custom_meta], partition_id, meta.field_names, meta
        )

    async def kv_batch_get(
        self,
        keys: Sequence[str] | str,
        partition_id: str,
        select_fields: Sequence[str] | str | None = None,
    ) -> TensorDict:
        """The data under ``keys`` of ``partition_id`` (all the fields every key holds, or
        ``select_fields``). Raises UnknownPartitionError, UnknownKeyError, UnknownFieldError."""
        key_list = [keys] if isinstance(keys, str) else _kv_keys(keys)
        wanted = [select_fields] if isinstance(select_fields, str) else select_fields
        meta = await self.controller.kv_meta(
            partition_id, key_list, None if wanted is None else list(wanted)
        )
        result: TensorDict = await self.get(meta)
        return result

    async def kv_list(self, partition_id: str | None = None) -> dict[str, dict[str, Any]]:
        """``{partition: {key: tags}}`` of one partition or of every partition with keys;
        ``{}`` for an unknown partition or one without keys."""
        result: dict[str, dict[str, Any]] = await self.controller.kv_list(partition_id)
        return result

    async def kv_clear(self, keys: Sequence[str] | str, partition_id: str) -> None:
        """Remove ``keys`` (and their samples) from ``partition_id``; absent keys are ignored."""
        key_list = [keys] if isinstance(keys, str) else _kv_keys(keys)
        meta, _missing = await self.controller.kv_lookup(partition_id, key_list)
        if meta.size:
            await self.clear(meta)

    # -- unit keys -----------------------------------------------------------------------

    def _by_key(self, keys: Sequence[str]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for pos, key in enumerate(keys):
            groups.setdefault(kv_shard_of(key, len(self.units)), []).append(pos)
        return groups

    async def kv_put(
        self, keys: Sequence[str], td: TensorDictBase, *, timeout: float = PUT_TIMEOUT
    ) -> None:
        """Store ``td``'s rows under string ``keys`` (existing keys are overwritten).

        Raises StoreInputError/SchemaError, StoreFullError, UnitLostError.
        """
        keys = _kv_keys(keys)
        columns = split_columns(td, len(keys))
        groups = self._by_key(keys)
        shards, calls = [], []
        for shard, positions in groups.items():
            sub = td if len(groups) == 1 else take(columns, positions, len(keys))
            shards.append(shard)
            calls.append(
                self.units[shard]["handle"].kv_put([keys[p] for p in positions], sub, timeout)
            )
        await self._gather(shards, calls)

    async def kv_get(
        self, keys: Sequence[str], fields: Sequence[str] | None = None, *, device: Any = None
    ) -> TensorDict:
        """The rows under ``keys``, in order. Raises UnknownKeyError, UnknownFieldError."""
        keys = _kv_keys(keys)
        groups = self._by_key(keys)
        f = None if fields is None else list(fields)
        calls = [
            self.units[s]["handle"].kv_get([keys[p] for p in pos], f) for s, pos in groups.items()
        ]
        results = await self._gather(list(groups), calls)
        if not results:
            return TensorDict({}, batch_size=[0])
        schemas = {n: c.schema for n, c in split_columns(results[0]).items()}
        td = merge_parts(len(keys), schemas, list(zip(groups.values(), results, strict=True)))
        if device is not None:
            td = place(td, schemas, device)
        return td

    async def kv_keys(self) -> list[str]:
        """Every unit key, unit by unit (``kv_list`` lists partition keys)."""
        shards = [int(u["shard"]) for u in self.units]
        lists = await self._gather(shards, [u["handle"].kv_list() for u in self.units])
        return [k for keys in lists for k in keys]

    async def kv_delete(self, keys: Sequence[str]) -> int:
        """Delete unit ``keys`` (absent ones ignored); returns how many were deleted."""
        keys = _kv_keys(keys)
        groups = self._by_key(keys)
        calls = [
            self.units[s]["handle"].kv_delete([keys[p] for p in pos]) for s, pos in groups.items()
        ]
        return sum(await self._gather(list(groups), calls))


def _rows(td: TensorDictBase, positions: list[int]) -> TensorDictBase:
    return take(split_columns(td), positions, int(td.batch_size[0]))


def _kv_keys(keys: Any) -> list[str]:
    """``keys`` as a list of str; a bare str (``"abc"``) is refused, not split into letters."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise StoreInputError(f"keys must be a list of str, got {keys!r}")
    out = list(keys)
    if any(not isinstance(k, str) or not k for k in out):
        raise StoreInputError("keys must be non-empty str")
    return out
