"""KeyValues: the controller's KV keys and per-sample tags (custom metadata).

A put may name its samples by keys new to their partition (``kv_batch_put``); a key lookup
returns the meta of the keyed samples, a listing their tags. Tags are the samples' custom
metadata: plain dicts, set by a put or replaced later (:meth:`KeyValues.set_custom_meta`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rayless.store.controller.catalog import Catalog
from rayless.store.controller.records import _Partition, as_indexes
from rayless.store.data.meta import NO_CUSTOM, BatchMeta
from rayless.store.data.plain import check_plain
from rayless.store.errors import StoreInputError, UnknownFieldError, UnknownKeyError

__all__ = ["KeyValues", "check_custom", "check_new_keys"]


def check_new_keys(part: _Partition | None, keys: Sequence[str] | None, n: int) -> None:
    """Raise StoreInputError unless ``keys`` are ``n`` distinct non-empty str new to
    the partition."""
    if keys is None:
        return
    if len(keys) != n:
        raise StoreInputError(f"keys has {len(keys)} entries for {n} samples")
    if any(not isinstance(k, str) or not k for k in keys) or len(set(keys)) != n:
        raise StoreInputError("keys must be distinct non-empty str")
    taken = [k for k in keys if part is not None and k in part.keys]
    if taken:
        raise StoreInputError(f"keys {taken[:8]} already name samples of the partition")


def check_custom(
    custom: Sequence[Mapping[str, Any]] | None, n: int
) -> list[Mapping[str, Any]] | None:
    """``custom`` as ``n`` plain dicts (None stays None). Raises StoreInputError."""
    if custom is None:
        return None
    if len(custom) != n:
        raise StoreInputError(f"custom_meta has {len(custom)} entries for {n} samples")
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(custom):
        if not isinstance(item, Mapping):
            raise StoreInputError(f"custom_meta[{i}] is not a dict")
        check_plain(dict(item), f"custom_meta[{i}]")
        out.append(dict(item))
    return out


class KeyValues:
    """Key lookups, key listings and tags over a :class:`Catalog`'s partitions."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def set_custom_meta(self, meta: BatchMeta, custom_meta: Sequence[Mapping[str, Any]]) -> None:
        """Replace the custom metadata of ``meta``'s samples (one plain dict per sample).
        Raises the catalog's meta check errors, StoreInputError."""
        catalog = self._catalog
        catalog.check_meta(meta)
        custom = check_custom(custom_meta, meta.size) or []
        for part_id, index, item in zip(
            meta.partition_ids, meta.global_indexes, custom, strict=True
        ):
            part = catalog.partitions[part_id]
            pos = int(catalog.where.pos[index])
            if item:
                part.custom[pos] = item
            else:
                part.custom.pop(pos, None)

    def lookup(self, partition: str, keys: Sequence[str]) -> tuple[BatchMeta, list[int]]:
        """The meta (with the fields every one of them holds) of the keys that exist, and
        the positions in ``keys`` of those that do not. Raises StoreInputError."""
        if isinstance(keys, str) or any(not isinstance(k, str) or not k for k in keys):
            raise StoreInputError("keys must be a list of non-empty str")
        if len(set(keys)) != len(keys):
            raise StoreInputError("keys must be distinct")
        catalog = self._catalog
        part = catalog.partitions.get(partition)
        table = part.keys if part is not None else {}
        found = [table[k] for k in keys if k in table]
        missing = [pos for pos, k in enumerate(keys) if k not in table]
        if part is None:
            return catalog.empty_meta(), missing
        at = catalog.where.pos[as_indexes(found)]
        names = catalog.ready_for_all(part, at) if found else []
        return catalog.meta(partition, part, at, names), missing

    def meta(
        self, partition: str, keys: Sequence[str], fields: Sequence[str] | None = None
    ) -> BatchMeta:
        """The meta of existing ``keys`` in order (``fields``: default all they hold).
        Raises UnknownPartitionError, UnknownKeyError, UnknownFieldError."""
        catalog = self._catalog
        part = catalog.part(partition)
        meta, missing = self.lookup(partition, keys)
        if missing:
            absent = [keys[p] for p in missing]
            raise UnknownKeyError(f"keys {absent[:8]} are not in partition {partition!r}")
        if fields is None:
            return meta
        at = catalog.where.pos[as_indexes(list(meta.global_indexes))]
        names = list(dict.fromkeys(fields))
        for f in names:
            bits = part.ready.get(f)
            if bits is None or not bits[at].all():
                raise UnknownFieldError(f"field {f!r} is not written for every key")
        return catalog.meta(partition, part, at, names)

    def keys_of(self, partition: str, indexes: Sequence[int]) -> list[str | None]:
        """The KV key of each of ``indexes`` (None: a sample of ``partition`` without a key,
        or not one of its samples). O(len(indexes)). Raises StoreInputError."""
        if isinstance(indexes, (str, bytes)) or any(
            not isinstance(i, int) or isinstance(i, bool) for i in indexes
        ):
            raise StoreInputError("indexes must be a list of int")
        part = self._catalog.partitions.get(partition)
        if part is None or not indexes:
            return [None] * len(indexes)
        found, pos = self._catalog.positions(part, as_indexes(list(indexes)))
        return [part.key_at.get(int(p)) if f else None for f, p in zip(found, pos, strict=True)]

    def _custom_of(self, part: _Partition, index: int) -> dict[str, Any]:
        return dict(part.custom.get(int(self._catalog.where.pos[index]), NO_CUSTOM))

    def listing(self, partition: str | None = None) -> dict[str, dict[str, dict[str, Any]]]:
        """``{partition: {key: tags}}`` (one partition, or every one that has keys); an
        unknown partition or one without keys lists as ``{}``."""
        if partition is not None:
            part = self._catalog.partitions.get(partition)
            if part is None or not part.keys:
                return {}
            return {partition: {k: self._custom_of(part, i) for k, i in part.keys.items()}}
        return {
            name: {k: self._custom_of(p, i) for k, i in p.keys.items()}
            for name, p in self._catalog.partitions.items()
            if p.keys
        }
