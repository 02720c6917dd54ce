"""KVBatchMeta: what the KV face's puts return and its gets take (TransferQueue's KVBatchMeta).

Keys, one tag dict per key, the partition, the fields the samples hold, and ``extra_info``
(batch-level values the caller attaches). It splits and joins as TransferQueue's does
(:meth:`KVBatchMeta.chunk`, :meth:`~KVBatchMeta.concat`, :meth:`~KVBatchMeta.select_keys`,
:meth:`~KVBatchMeta.reorder`) and travels between processes as a plain record (a codec
extension), so that a trainer can hand one to its workers.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rayless.store.data.meta import BatchMeta

__all__ = ["KVBatchMeta"]

log = logging.getLogger(__name__)


@dataclass
class KVBatchMeta:
    """Keys of one partition with their tags; ``fields`` the fields they hold (None: not
    known), ``extra_info`` batch-level values. ``meta`` is the samples' BatchMeta where a put
    made this object (kept in this process only; None after a split, a join or a transfer).

    Raises ValueError when keys and tags differ in length, or a key or a field repeats.
    """

    keys: list[str] = field(default_factory=list)
    tags: list[dict[str, Any]] = field(default_factory=list)
    partition_id: str | None = None
    fields: list[str] | None = None
    extra_info: dict[str, Any] | None = field(default_factory=dict)
    meta: BatchMeta | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.keys = list(self.keys)
        self.tags = copy.deepcopy([dict(t) for t in self.tags])
        self.extra_info = copy.deepcopy(self.extra_info)
        if self.fields is not None:
            self.fields = list(self.fields)
            if len(self.fields) != len(set(self.fields)):
                raise ValueError("Got duplicated fields.")
        if len(self.keys) != len(self.tags):
            raise ValueError(
                f"keys and tags must have same length, but got {len(self.keys)} and "
                f"{len(self.tags)}"
            )
        if len(self.keys) != len(set(self.keys)):
            raise ValueError("Got duplicated keys.")

    @property
    def size(self) -> int:
        """The number of keys."""
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __str__(self) -> str:
        return (
            f"KVBatchMeta(size={self.size}, field_names={self.fields}, "
            f"extra_info={self.extra_info})"
        )

    def _with(self, keys: list[str], tags: list[dict[str, Any]]) -> KVBatchMeta:
        return KVBatchMeta(keys, tags, self.partition_id, self.fields, self.extra_info)

    def select_keys(self, keys_to_select: Sequence[str]) -> KVBatchMeta:
        """A new meta of these keys (in this order) with their tags.

        Raises ValueError for a repeated key, RuntimeError for a key this meta lacks.
        """
        wanted = list(keys_to_select)
        if len(set(wanted)) != len(wanted):
            raise ValueError("Contain duplicate keys.")
        at = {k: i for i, k in enumerate(self.keys)}
        missing = [k for k in wanted if k not in at]
        if missing:
            raise RuntimeError(f"Keys {set(missing)} not found in current batch.")
        return self._with(wanted, [self.tags[at[k]] for k in wanted])

    def reorder(self, indexes: Sequence[int]) -> None:
        """Reorder the keys and tags in place (``indexes``: the new order of positions).

        Raises ValueError when ``indexes`` is not as long as the batch or repeats a position.
        """
        order = list(indexes)
        if len(order) != self.size:
            raise ValueError(
                f"Attempted to reorder with indexes length {len(order)} that does not match "
                f"the batch size {self.size}."
            )
        if len(set(order)) != len(order):
            raise ValueError("Contain duplicate indexes.")
        self.keys = [self.keys[i] for i in order]
        self.tags = [self.tags[i] for i in order]
        self.meta = None

    def chunk(self, chunks: int) -> list[KVBatchMeta]:
        """``chunks`` consecutive parts, the first ``size % chunks`` one key longer (some
        empty when there are fewer keys than chunks)."""
        if self.size < chunks:
            log.warning(
                "Chunk size %d > number of samples in this batch %d, this will return some "
                "empty KVBatchMeta chunks.",
                chunks,
                self.size,
            )
        base, extra = divmod(self.size, chunks)
        out, start = [], 0
        for i in range(chunks):
            end = start + base + (1 if i < extra else 0)
            out.append(self._with(self.keys[start:end], self.tags[start:end]))
            start = end
        return out

    @classmethod
    def concat(cls, data: Sequence[KVBatchMeta]) -> KVBatchMeta:
        """One meta of the non-empty ``data`` in order (no data: an empty meta).

        Raises ValueError when their fields or partitions differ, or an ``extra_info`` key
        has different values in two of them.
        """
        parts = [d for d in data if d and d.size > 0]
        if not parts:
            log.warning("No valid KVBatchMeta chunks to concatenate. Returning empty KVBatchMeta.")
            return cls()
        first = parts[0]
        names = set(first.fields or ())
        keys: list[str] = []
        tags: list[dict[str, Any]] = []
        for part in parts:
            if part.fields is not None and set(part.fields) != names:
                raise ValueError("Field names do not match for concatenation.")
            if part.partition_id != first.partition_id:
                raise ValueError("Partition do not match for concatenation.")
            keys.extend(part.keys)
            tags.extend(part.tags)
        extra: dict[str, Any] = {}
        for part in parts:
            for key, value in (part.extra_info or {}).items():
                if key in extra and not _same(extra[key], value):
                    raise ValueError(
                        f"KVBatchMeta.concat: extra_info key '{key}' has conflicting values "
                        "across chunks."
                    )
                extra.setdefault(key, value)
        return cls(keys, tags, first.partition_id, first.fields, extra or None)

    def to_dict(self) -> dict[str, Any]:
        """The record that travels (``meta`` stays behind)."""
        return {
            "keys": self.keys,
            "tags": self.tags,
            "partition_id": self.partition_id,
            "fields": self.fields,
            "extra_info": self.extra_info,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVBatchMeta:
        """The meta of :meth:`to_dict`'s record. Raises ValueError for a malformed one."""
        if not isinstance(data, Mapping) or not set(data) <= _RECORD:
            raise ValueError("malformed KVBatchMeta record")
        keys, tags = data.get("keys", []), data.get("tags", [])
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise ValueError("malformed KVBatchMeta record: keys")
        if not isinstance(tags, list) or not all(isinstance(t, dict) for t in tags):
            raise ValueError("malformed KVBatchMeta record: tags")
        extra = data.get("extra_info")
        if extra is not None and not isinstance(extra, dict):
            raise ValueError("malformed KVBatchMeta record: extra_info")
        fields = data.get("fields")
        if fields is not None and not isinstance(fields, list):
            raise ValueError("malformed KVBatchMeta record: fields")
        return cls(keys, tags, data.get("partition_id"), fields, extra)


_RECORD = frozenset({"keys", "tags", "partition_id", "fields", "extra_info"})


def _same(a: Any, b: Any) -> bool:
    """Whether two ``extra_info`` values are equal (tensors and arrays element-wise)."""
    try:
        equal = a == b
        if isinstance(equal, bool):
            return equal
        return bool(equal.all())  # a tensor or an array of element results
    except Exception:
        return a is b


def _register_wire() -> None:
    from rayless.transport import register_extension

    register_extension(
        KVBatchMeta, "rayless.store.kv_batch_meta", KVBatchMeta.to_dict, KVBatchMeta.from_dict
    )


_register_wire()
