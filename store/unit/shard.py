"""ShardStorage: the columnar store of one storage unit, synchronous and free of I/O.

Per partition x field it holds one column, on the unit's device (``cpu`` or ``cuda:N``; data
is moved there on write and read back from there):

- dense fields: one preallocated tensor ``[slots, *shape]``; a global index maps to a slot.
  Writes are one ``index_copy_``, reads one ``index_select``. The tensor grows by doubling
  (capped by the unit's free bytes); freed slots are reused; a column with no rows left is
  dropped, giving its memory back (and letting the field take another schema). A write of
  another per-sample shape (same rank and dtype) adds a column *part* of that shape
  (:class:`~rayless.store.unit.columns._Parts`); rows already stored stay where they are, a
  read of samples of one part is dense as before, a read mixing parts is nested.
- nested (ragged) fields: one tensor per sample (a compact copy of the sample), rebuilt as a
  nested tensor of the same layout (jagged or strided) on read.
- non-tensor fields: one plain value per sample.

Capacity accounting counts the bytes the unit holds: the whole preallocated tensor of every
dense column, the elements of every nested row, and an estimate for plain values. A write that
would exceed the capacity raises :class:`StoreFullError` before changing anything (a dense
column's brief doubling during growth is not counted). Every method validates first and raises a
typed :mod:`store.errors` error with the storage unchanged.

The KV face (``kv_put``/``kv_get``/``kv_list``/``kv_delete``) keeps string-keyed rows in the same
columns, in a partition of its own that does not show in ``partitions()``. Clients choose a key's
unit with :func:`kv_shard_of`.
"""

from __future__ import annotations

import errno
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from rayless.store.data.dense import DenseColumn
from rayless.store.data.packed import is_packed, unpack_columns
from rayless.store.data.schema import (
    Column,
    DataUpdate,
    FieldSchema,
    assemble,
    split_columns,
    tensor_bytes,
)
from rayless.store.data.status import ShardStats
from rayless.store.errors import (
    SchemaError,
    StoreFullError,
    StoreInputError,
    UnknownFieldError,
    UnknownKeyError,
    UnknownPartitionError,
    WriteTooLargeError,
)
from rayless.store.unit.columns import (
    _close,
    _Col,
    _Parts,
    _row_sizes,
    _Rows,
    dense_part,
    part_schema,
    with_part,
)

__all__ = ["KV_PARTITION", "ShardStorage", "kv_shard_of"]

KV_PARTITION = "\x00kv"


def kv_shard_of(key: str, n_units: int) -> int:
    """The unit (shard number) that holds KV ``key`` among ``n_units``: a stable crc32 hash."""
    if not isinstance(key, str) or not isinstance(n_units, int) or n_units <= 0:
        raise StoreInputError("kv_shard_of needs a str key and a positive unit count")
    return zlib.crc32(key.encode()) % n_units


def _check_indexes(indexes: Any) -> list[int]:
    if isinstance(indexes, (str, bytes)) or not isinstance(indexes, Iterable):
        raise StoreInputError(f"indexes must be a list of ints, got {indexes!r}")
    idx = list(indexes)
    if (set(map(type, idx)) - {int} or (idx and min(idx) < 0)) and any(
        not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in idx
    ):
        raise StoreInputError("indexes must be ints >= 0")
    if len(set(idx)) != len(idx):
        raise StoreInputError("indexes must be distinct")
    return idx


def _check_partition(partition: Any) -> str:
    if not isinstance(partition, str) or not partition or partition.startswith("\x00"):
        raise StoreInputError(f"bad partition name {partition!r}")
    return partition


class ShardStorage:
    """The data of one storage unit: columns per partition x field, with a byte capacity."""

    def __init__(
        self,
        unit_id: str,
        device: str | torch.device = "cpu",
        capacity_bytes: int | None = None,
        dense_type: type[DenseColumn] = DenseColumn,
    ) -> None:
        if not isinstance(unit_id, str) or not unit_id:
            raise StoreInputError(f"unit_id must be a non-empty str, got {unit_id!r}")
        if capacity_bytes is not None and (
            not isinstance(capacity_bytes, int) or capacity_bytes < 0
        ):
            raise StoreInputError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.unit_id = unit_id
        self.device = torch.device(device)
        self.capacity_bytes = capacity_bytes
        self.dense_type = dense_type  # store.samehost.columns.ShmDense: columns in shared memory
        self._parts: dict[str, dict[str, _Col]] = {}
        self._kv_rows: dict[str, int] = {}
        self._kv_free: list[int] = []
        self._kv_next = 0

    # -- accounting ----------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """Bytes held by every column (dense columns count their whole preallocation)."""
        return sum(c.nbytes for cols in self._parts.values() for c in cols.values())

    @property
    def free_bytes(self) -> int | None:
        """Bytes left under the capacity (None: no capacity)."""
        if self.capacity_bytes is None:
            return None
        return max(0, self.capacity_bytes - self.used_bytes)

    def partitions(self) -> list[str]:
        """Partitions with data on this unit (the KV partition excluded)."""
        return [p for p in self._parts if p != KV_PARTITION]

    def stats(self) -> ShardStats:
        """Counts for monitoring: bytes, capacity, rows per partition, KV keys."""
        return ShardStats(
            self.unit_id,
            str(self.device),
            self.used_bytes,
            self.capacity_bytes,
            {
                p: max((len(c) - getattr(c, "pending", 0) for c in cols.values()), default=0)
                for p, cols in self._parts.items()
            },
            len(self._kv_rows),
        )

    def close(self) -> None:
        """Give every column's memory back (shared-memory segments are unlinked)."""
        for cols in self._parts.values():
            for col in cols.values():
                _close(col)
        self._parts.clear()

    # -- writes --------------------------------------------------------------------------

    def write(
        self,
        partition: str,
        indexes: Sequence[int],
        td: Any,
        *,
        schemas: Mapping[str, FieldSchema] | None = None,
    ) -> DataUpdate:
        """Store ``td``'s rows as samples ``indexes`` of ``partition``; return the notification.

        Existing rows of the same fields are overwritten. ``schemas`` (as the client derived
        them before sending) must describe ``td``; their devices are reported. Raises
        SchemaError (bad data, a schema change), StoreInputError, StoreFullError.
        """
        return self._write(_check_partition(partition), _check_indexes(indexes), td, schemas)

    def _write(
        self,
        partition: str,
        idx: list[int],
        td: Any,
        declared: Mapping[str, FieldSchema] | None,
    ) -> DataUpdate:
        n = len(idx)
        columns = unpack_columns(td, n) if is_packed(td) else split_columns(td, n)
        reported = {name: col.schema for name, col in columns.items()}
        if declared is not None:
            if set(declared) != set(columns):
                raise SchemaError(
                    f"declared fields {sorted(declared)} differ from the data's {sorted(columns)}"
                )
            for name, col in columns.items():
                want = declared[name]
                got = col.schema
                if (want.kind, want.dtype) != (got.kind, got.dtype) or len(want.shape or ()) != len(
                    got.shape or ()
                ):
                    raise SchemaError(f"field {name!r}: data does not match its declared schema")
                reported[name] = FieldSchema(got.kind, got.dtype, got.shape, want.device)
        existing = self._parts.get(partition, {})
        merged: dict[str, FieldSchema] = {}
        for name, col in columns.items():
            old = existing.get(name)
            merged[name] = col.schema if old is None else old.schema.merged(col.schema, name)
        # Bytes: check everything before changing anything.
        self._check_fits_ever(columns)
        budget = self.free_bytes
        limit = budget if budget is not None else 2**62
        growths: dict[str, int] = {}
        needed = 0
        sizes: dict[str, list[int]] = {}
        for name, col in columns.items():
            old = existing.get(name)
            if col.schema.kind == "dense":
                if not idx:
                    continue
                shape = tuple(col.schema.shape or ())
                column = dense_part(old, shape)
                if column is None:
                    column = self.dense_type(col.schema, self.device)
                cap, cost = column.growth(idx, max(0, limit - needed))
                needed += cost
                if cap == -1:
                    self._full(needed)
                if cost:
                    growths[name] = cap
            else:
                sizes[name] = _row_sizes(col)
                before = old.sizes if isinstance(old, _Rows) else {}
                needed += sum(sizes[name]) - sum(before.get(i, 0) for i in idx)
        if budget is not None and needed > budget:
            self._full(needed)
        # Grow (what can fail: shared memory exhausted), then apply.
        dense_cols = self._grow_dense(existing, columns, merged, growths, needed) if idx else {}
        cols = self._parts.setdefault(partition, {})
        for name, col in columns.items():
            if not idx:
                continue
            schema = merged[name]
            if col.schema.kind == "dense":
                dense = dense_cols[name]
                cols[name] = with_part(cols.get(name), dense, schema)
                if col.dense is not None:
                    dense.write(idx, col.dense)
                self.moved(cols, name, dense, idx)
            else:
                rows = cols.get(name)
                if not isinstance(rows, _Rows):
                    rows = _Rows(schema)
                    cols[name] = rows
                rows.schema = schema
                values = col.rows or []
                if not schema.is_non_tensor:
                    values = [r.to(self.device, copy=True) for r in values]
                rows.write(idx, values, sizes[name])
        if not cols:
            del self._parts[partition]
        shapes = {n: list(c.sample_shapes or []) for n, c in columns.items() if c.schema.is_nested}
        return DataUpdate(partition, idx, reported, shapes)

    def _grow_dense(
        self,
        existing: Mapping[str, _Col],
        columns: Mapping[str, Column],
        merged: Mapping[str, FieldSchema],
        growths: Mapping[str, int],
        needed: int,
    ) -> dict[str, DenseColumn]:
        """The dense columns of a write, grown as planned (new ones not yet in the partition).
        Raises StoreFullError naming ``/dev/shm`` when shared memory is exhausted (new columns
        are closed again, grown ones keep their room)."""
        out: dict[str, DenseColumn] = {}
        try:
            for name, col in columns.items():
                if col.schema.kind != "dense":
                    continue
                shape = tuple(col.schema.shape or ())
                schema = part_schema(merged[name], shape)
                dense = dense_part(existing.get(name), shape)
                if dense is None:
                    dense = self.dense_type(schema, self.device)
                dense.schema = schema
                out[name] = dense
                if name in growths:
                    dense.grow(growths[name])
        except OSError as exc:
            for name, dense in out.items():
                if dense is not dense_part(existing.get(name), _Parts.shape_of(dense)):
                    _close(dense)
            raise self.shm_full(needed, exc) from None
        return out

    @staticmethod
    def moved(cols: dict[str, _Col], name: str, part: DenseColumn, indexes: Sequence[int]) -> None:
        """Rows ``indexes`` of field ``name`` were just written into its column ``part``: drop
        their older rows of another shape (other parts), and a part left empty; a field left
        with one part is a plain dense column again."""
        col = cols.get(name)
        if not isinstance(col, _Parts):
            return
        for other in col.parts.values():
            if other is not part:
                other.delete(indexes)
        col.drop_empty()
        if len(col.parts) == 1:
            cols[name] = next(iter(col.parts.values()))

    def drop_part(self, partition: str, name: str, part: DenseColumn) -> None:
        """Drop field ``name``'s column ``part`` if it holds nothing (a dropped reservation's):
        close it; a field left with one part is a plain dense column again."""
        cols = self._parts.get(partition, {})
        field = cols.get(name)
        if len(part):
            return
        if field is part:
            del cols[name]
        elif isinstance(field, _Parts) and field.parts.get(_Parts.shape_of(part)) is part:
            del field.parts[_Parts.shape_of(part)]
            if len(field.parts) == 1:
                cols[name] = next(iter(field.parts.values()))
        else:
            return
        _close(part)
        if partition in self._parts and not cols:
            del self._parts[partition]

    def shm_full(self, needed: int, exc: OSError) -> Exception:
        """``exc`` (a column's shared memory could not be allocated) as the StoreFullError
        naming ``/dev/shm`` that it means when the host is out of it (ENOSPC, ENOMEM), else
        ``exc`` itself."""
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            return exc
        why = f"/dev/shm has no room for the write's {needed} more bytes ({exc.strerror})"
        free, cap = self.free_bytes or 0, self.capacity_bytes or 0
        return StoreFullError(self.unit_id, needed, free, cap, reason=why)

    def _check_fits_ever(self, columns: Mapping[str, Column]) -> None:
        """Raise WriteTooLargeError if the written rows alone exceed the whole capacity."""
        if self.capacity_bytes is None:
            return
        own = sum(
            tensor_bytes(col.dense) if col.dense is not None else sum(_row_sizes(col))
            for col in columns.values()
        )
        if own > self.capacity_bytes:
            raise WriteTooLargeError(self.unit_id, own, self.free_bytes or 0, self.capacity_bytes)

    def _full(self, needed: int) -> None:
        raise StoreFullError(self.unit_id, needed, self.free_bytes or 0, self.capacity_bytes or 0)

    # -- reads ---------------------------------------------------------------------------

    def read(
        self, partition: str, indexes: Sequence[int], fields: Sequence[str] | None = None
    ) -> TensorDict:
        """Samples ``indexes`` of ``partition`` as a TensorDict on this unit's device.

        ``fields`` None reads every field all the samples hold. Raises UnknownPartitionError,
        UnknownFieldError (a field missing, or not written for some sample), StoreInputError.
        """
        return self._read(_check_partition(partition), _check_indexes(indexes), fields)

    def _read(self, partition: str, idx: list[int], fields: Sequence[str] | None) -> TensorDict:
        cols = self._parts.get(partition)
        if cols is None:
            if partition == KV_PARTITION:
                cols = {}
            else:
                raise UnknownPartitionError(
                    f"unit {self.unit_id!r} holds no partition {partition!r}"
                )
        if fields is None:
            names = [n for n, c in cols.items() if all(i in c for i in idx)]
        else:
            if isinstance(fields, str):
                raise StoreInputError("fields must be a list of names")
            names = list(dict.fromkeys(fields))
            unknown = [n for n in names if n not in cols]
            if unknown:
                raise UnknownFieldError(
                    f"unit {self.unit_id!r} holds no fields {unknown} in partition {partition!r}"
                )
            for n in names:
                missing = [i for i in idx if i not in cols[n]]
                if missing:
                    raise UnknownFieldError(
                        f"field {n!r} is not written for samples {missing[:8]} on unit "
                        f"{self.unit_id!r}"
                    )
        data: dict[str, tuple[FieldSchema, Any]] = {}
        for n in names:
            col = cols[n]
            if isinstance(col, (DenseColumn, _Parts)):  # (_Parts: nested when idx mixes shapes)
                data[n] = (col.schema, col.read(idx))
            else:
                data[n] = (col.schema, [col.rows[i] for i in idx])
        return assemble(len(idx), data, self.device)

    def has(self, partition: str, index: int, field: str) -> bool:
        """Whether this unit holds ``field`` of sample ``index`` in ``partition``."""
        col = self._parts.get(partition, {}).get(field)
        return col is not None and index in col

    def has_any(self, partition: str, indexes: Iterable[int], field: str) -> bool:
        """Whether this unit holds ``field`` of any of ``indexes`` in ``partition``."""
        col = self._parts.get(partition, {}).get(field)
        return col is not None and col.holds_any(indexes)

    # -- deletes -------------------------------------------------------------------------

    def delete(
        self, partition: str, indexes: Iterable[int], fields: Iterable[str] | None = None
    ) -> int:
        """Delete rows (all fields, or ``fields``); absent ones are ignored. Returns bytes freed.

        Freed dense slots are reused by later writes; a column left empty is dropped.
        """
        _check_partition(partition)
        return self._delete(partition, _check_indexes(indexes), fields)

    def _delete(self, partition: str, idx: list[int], fields: Iterable[str] | None) -> int:
        cols = self._parts.get(partition)
        if cols is None:
            return 0
        before = self.used_bytes
        names = list(cols) if fields is None else [f for f in fields if f in cols]
        for name in names:
            col = cols[name]
            col.delete(idx)
            if not len(col):
                _close(cols.pop(name))
            elif isinstance(col, _Parts) and len(col.parts) == 1:
                cols[name] = next(iter(col.parts.values()))  # one shape left: plain dense
        if not cols:
            del self._parts[partition]
        return before - self.used_bytes

    def drop_partition(self, partition: str) -> int:
        """Delete a whole partition (absent: nothing happens). Returns bytes freed."""
        _check_partition(partition)
        before = self.used_bytes
        for col in self._parts.pop(partition, {}).values():
            _close(col)
        return before - self.used_bytes

    # -- KV face -------------------------------------------------------------------------

    @staticmethod
    def _check_keys(keys: Any) -> list[str]:
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            raise StoreInputError(f"keys must be a list of str, got {keys!r}")
        out = list(keys)
        if any(not isinstance(k, str) or not k for k in out):
            raise StoreInputError("keys must be non-empty str")
        if len(set(out)) != len(out):
            raise StoreInputError("keys must be distinct")
        return out

    def kv_put(self, keys: Sequence[str], td: Any) -> dict[str, FieldSchema]:
        """Store ``td``'s rows under ``keys`` (existing keys: their fields are overwritten).

        Returns the written fields' schemas. Raises like :meth:`write`.
        """
        names = self._check_keys(keys)
        rows: list[int] = []
        fresh: list[str] = []
        free = list(self._kv_free)
        top = self._kv_next
        for k in names:
            row = self._kv_rows.get(k)
            if row is None:
                if free:
                    row = free.pop()
                else:
                    row, top = top, top + 1
                fresh.append(k)
            rows.append(row)
        update = self._write(KV_PARTITION, rows, td, None)
        # The write succeeded: commit the new keys.
        self._kv_free, self._kv_next = free, top
        for k, row in zip(names, rows, strict=True):
            self._kv_rows[k] = row
        return update.schemas

    def kv_get(self, keys: Sequence[str], fields: Sequence[str] | None = None) -> TensorDict:
        """The rows under ``keys`` (``fields`` None: those all of them hold).

        Raises UnknownKeyError, UnknownFieldError.
        """
        names = self._check_keys(keys)
        unknown = [k for k in names if k not in self._kv_rows]
        if unknown:
            raise UnknownKeyError(f"unit {self.unit_id!r} holds no keys {unknown[:8]}")
        return self._read(KV_PARTITION, [self._kv_rows[k] for k in names], fields)

    def kv_list(self) -> list[str]:
        """The keys this unit holds, in insertion order."""
        return list(self._kv_rows)

    def kv_delete(self, keys: Sequence[str]) -> int:
        """Delete ``keys`` (absent ones are ignored). Returns how many were deleted."""
        names = [k for k in self._check_keys(keys) if k in self._kv_rows]
        rows = [self._kv_rows.pop(k) for k in names]
        self._delete(KV_PARTITION, rows, None)
        self._kv_free.extend(rows)
        return len(names)
