"""Field schemas, and the split of a TensorDict into per-field columns and back.

A *field* is a leaf of a TensorDict, named by its key path joined with ``"."`` (``"obs.image"``
for ``td["obs", "image"]``). Each field has one of four kinds:

- ``dense``: a plain tensor; every sample has the same shape.
- ``jagged`` / ``strided``: a nested tensor (``torch.nested``, that layout); samples differ in
  shape. Its schema's shape holds ``None`` for every dimension that varies.
- ``non_tensor``: per-sample plain values (``NonTensorStack``/``NonTensorData``); only values
  the transport carries without pickle (None, bool, int, float, str, bytes, numpy arrays of
  a non-object dtype, lists/tuples and str-keyed dicts of them). A ``NonTensorData`` holding
  a list or tuple with one entry per sample (``td.set_non_tensor("k", [...])``) is one
  value per sample, as in TransferQueue; any other ``NonTensorData`` is the same value for
  every sample.

:class:`FieldSchema` (in :mod:`rayless.store.data.fields`) travels as a plain dict (``to_dict``/
``from_dict``); :class:`DataUpdate` (in :mod:`rayless.store.data.updates`) is the notification a
storage unit sends the controller after a write. This module re-exports both.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tensordict
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from rayless.store.data.fields import (
    FIELD_SEP,
    KINDS,
    STORABLE_DTYPES,
    FieldSchema,
    Shape,
    dtype_from_name,
    dtype_name,
    field_key,
)
from rayless.store.data.plain import check_plain, estimate_plain_bytes
from rayless.store.data.updates import DataUpdate, known_shapes, shapes_from_wire, shapes_to_wire
from rayless.store.errors import SchemaError, StoreInputError

__all__ = [
    "FIELD_SEP",
    "KINDS",
    "Column",
    "DataUpdate",
    "STORABLE_DTYPES",
    "FieldSchema",
    "assemble",
    "check_plain",
    "dtype_from_name",
    "dtype_name",
    "estimate_plain_bytes",
    "field_key",
    "known_shapes",
    "merge_parts",
    "nest_rows",
    "shapes_from_wire",
    "shapes_to_wire",
    "split_columns",
    "tensor_bytes",
]
# FieldSchema, the dtypes and field names live in store/data/fields.py; DataUpdate and the wire form
# of per-sample shapes in store/data/updates.py; check_plain and estimate_plain_bytes in
# store/data/plain.py. All are re-exported here (and _storable, private,
# is imported from here by packed.py and the tests).


@dataclass
class Column:
    """One field of a batch: its schema and its data.

    ``dense`` holds a batch tensor (dense kind); ``rows`` holds one tensor per sample (nested
    kinds) or one plain value per sample (non-tensor); ``sample_shapes`` the per-sample shapes
    of nested kinds.
    """

    schema: FieldSchema
    dense: torch.Tensor | None = None
    rows: list[Any] | None = None
    sample_shapes: list[tuple[int, ...]] | None = None

    def __len__(self) -> int:
        if self.dense is not None:
            return int(self.dense.shape[0])
        return len(self.rows or ())


def _storable(dtype: torch.dtype, name: str) -> str:
    text = dtype_name(dtype)
    if text not in STORABLE_DTYPES:
        raise SchemaError(
            f"field {name!r}: dtype {text} cannot be stored (supported: "
            f"{sorted(STORABLE_DTYPES)}); convert it first, e.g. uint16 -> int32, "
            "float8 -> bfloat16"
        )
    return text


def _nested_column(value: torch.Tensor, name: str) -> Column:
    dtype = _storable(value.dtype, name)
    layout = "jagged" if value.layout == torch.jagged else "strided"
    packed = _jagged_rows(value) if layout == "jagged" else None
    if packed is not None:
        rows, shapes = packed
    else:
        rows = [row.contiguous() for row in value.unbind(0)]
        shapes = [tuple(int(d) for d in row.shape) for row in rows]
    shape: Shape
    if shapes:
        first = shapes[0]
        if any(len(s) != len(first) for s in shapes):
            raise SchemaError(f"field {name!r}: samples of a nested tensor differ in rank")
        shape = tuple(d if all(s[i] == d for s in shapes) else None for i, d in enumerate(first))
    else:
        shape = tuple(None for _ in range(value.dim() - 1))
    if layout == "jagged" and None in shape[1:]:
        raise SchemaError(
            f"field {name!r}: a jagged tensor may vary only in its first sample dimension"
        )
    schema = FieldSchema(layout, dtype, shape, str(value.device))
    return Column(schema, rows=rows, sample_shapes=shapes)


def split_columns(td: Any, batch_size: int | None = None) -> dict[str, Column]:
    """Split a TensorDict with batch_size ``[B]`` into its columns, keyed by field name.

    Raises SchemaError for anything the store cannot hold (not a TensorDict, batch dims other
    than one, a batch size other than ``batch_size``, a key with ``"."``, a leaf of an
    unsupported type, non-plain non-tensor values).
    """
    if not isinstance(td, TensorDictBase):
        raise SchemaError(f"expected a TensorDict, got {type(td).__name__}")
    if td.batch_dims != 1:
        raise SchemaError(f"expected a TensorDict with batch_size [B], got {list(td.batch_size)}")
    n = int(td.batch_size[0])
    if batch_size is not None and n != batch_size:
        raise SchemaError(f"the TensorDict holds {n} samples, expected {batch_size}")
    columns: dict[str, Column] = {}
    items = td.items(include_nested=True, leaves_only=True, is_leaf=tensordict.is_leaf_nontensor)
    for key, value in items:
        path = (key,) if isinstance(key, str) else tuple(key)
        if any(FIELD_SEP in part or not part for part in path):
            raise SchemaError(f"key {path!r}: key parts must be non-empty and contain no '.'")
        name = FIELD_SEP.join(path)
        if isinstance(value, (NonTensorData, NonTensorStack)):
            data = value.data if isinstance(value, NonTensorData) else None
            if isinstance(data, (list, tuple)) and len(data) == n:
                rows = list(data)
            else:
                rows = value.tolist()
            if not isinstance(rows, list) or len(rows) != n:
                raise SchemaError(f"field {name!r}: non-tensor data must have one value per sample")
            for i, row in enumerate(rows):
                check_plain(row, f"field {name!r} sample {i}")
            columns[name] = Column(FieldSchema("non_tensor"), rows=rows)
        elif isinstance(value, torch.Tensor) and value.is_nested:
            columns[name] = _nested_column(value, name)
        elif isinstance(value, torch.Tensor) and value.layout == torch.strided:
            shape = tuple(int(d) for d in value.shape[1:])
            dtype = _storable(value.dtype, name)
            schema = FieldSchema("dense", dtype, shape, str(value.device))
            columns[name] = Column(schema, dense=value)
        else:
            raise SchemaError(f"field {name!r}: cannot store a {type(value).__name__}")
    return columns


def _jagged_rows(value: torch.Tensor) -> tuple[list[Any], list[tuple[int, ...]]] | None:
    """The rows of a packed jagged tensor as views of its values (a split, not NestedTensor's
    unbind: ~2x faster for 1,024 rows), with their shapes; None when it is not packed (holes,
    offsets not from 0 to the end, ragged in another dimension): unbind then."""
    values, offsets = value.values(), value.offsets()  # type: ignore[attr-defined]
    if getattr(value, "_lengths", None) is not None or getattr(value, "_ragged_idx", 1) != 1:
        return None
    bounds = offsets.tolist()
    if not bounds or bounds[0] != 0 or bounds[-1] != values.shape[0]:
        return None
    if not values.is_contiguous():
        values = values.contiguous()
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    rest = tuple(int(d) for d in values.shape[1:])
    return list(values.split(lengths)), [(n, *rest) for n in lengths]


def _hush_torch_fx_notice() -> None:
    """torch 2.13 logs a one-time "is_fx_tracing will return true ..." warning the first time a
    process builds a jagged tensor (torch.nested calls its deprecated is_fx_tracing); it says
    nothing about the store, so its once-only cache is filled here with the log muted."""
    try:
        from torch.fx import _symbolic_trace as trace

        notice = trace.is_fx_tracing_warning
    except (ImportError, AttributeError):  # another torch: nothing to hush
        return
    log = logging.getLogger(trace.__name__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        notice()
    finally:
        log.setLevel(level)


_hush_torch_fx_notice()


def _nested(kind: str, rows: list[torch.Tensor], schema: FieldSchema, device: Any) -> torch.Tensor:
    if kind == "jagged" and len({tuple(r.shape[1:]) for r in rows}) > 1:
        kind = "strided"  # (a multi-shape field's rows, merged: ragged beyond their first dim)
    layout = torch.jagged if kind == "jagged" else torch.strided
    if rows and kind == "jagged" and all(r.dim() >= 1 for r in rows):
        values = torch.cat(rows)  # one copy of the values and their offsets: no per-row checks
        lengths = [int(r.shape[0]) for r in rows]
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor(lengths), 0, out=offsets[1:])
        return torch.nested.nested_tensor_from_jagged(
            values,
            offsets.to(values.device),
            min_seqlen=min(lengths),  # without them torch takes all values for the longest row
            max_seqlen=max(lengths),
        )
    if rows:
        with warnings.catch_warnings():  # torch's "prototype stage" notice for strided ones
            warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)
            return torch.nested.as_nested_tensor(rows, layout=layout)
    dtype = schema.torch_dtype or torch.float32
    rest = [d or 0 for d in (schema.shape or ())[1:]]
    values = torch.empty([0, *rest], dtype=dtype, device=device)
    offsets = torch.zeros(1, dtype=torch.int64, device=device)
    return torch.nested.nested_tensor_from_jagged(values, offsets)


def nest_rows(rows: list[torch.Tensor], schema: FieldSchema, device: Any = None) -> torch.Tensor:
    """The rows of a multi-shape dense field that a read mixes (shapes of one rank) as one
    nested tensor: jagged when they differ only in their first dimension, else strided."""
    rest = {tuple(r.shape[1:]) for r in rows}
    jagged = bool(rows) and all(r.dim() >= 1 for r in rows) and len(rest) == 1
    return _nested("jagged" if jagged else "strided", rows, schema, device)


def _dense_value(schema: FieldSchema, data: Any, device: Any) -> Any:
    """A dense field's value from ``data``: a batch tensor (or a nested one: a multi-shape
    field's mixed read) as it is; a list of rows (merged from parts) stacked when they share a
    shape, else nested."""
    if isinstance(data, torch.Tensor):
        return data
    rows = list(data)
    if rows and len({tuple(r.shape) for r in rows}) == 1:
        return torch.stack(rows)
    if not rows:
        dtype = schema.torch_dtype or torch.float32
        return torch.empty((0, *(d or 0 for d in schema.shape or ())), dtype=dtype, device=device)
    return nest_rows(rows, schema, device)


def assemble(
    size: int, columns: Mapping[str, tuple[FieldSchema, Any]], device: Any = None
) -> TensorDict:
    """Build a TensorDict with batch_size ``[size]`` from ``{field: (schema, data)}``.

    ``data`` is a batch tensor (dense; a multi-shape field's mixed read: a nested tensor, or a
    list of per-sample tensors), a list of per-sample tensors (nested kinds) or a list of plain
    values (non-tensor). Dotted field names become nested TensorDicts.
    """
    out = TensorDict({}, batch_size=[size])
    for name, (schema, data) in columns.items():
        if schema.kind == "dense":
            value: Any = _dense_value(schema, data, device)
        elif schema.is_nested:
            value = _nested(schema.kind, list(data), schema, device)
        else:
            value = NonTensorStack.from_list(list(data))
        out.set(field_key(name), value)
    return out


def _rows_of(schema: FieldSchema, value: Any) -> list[Any]:
    if schema.is_nested or (isinstance(value, torch.Tensor) and value.is_nested):
        return list(value.unbind(0))
    if schema.is_non_tensor:
        return list(value.tolist())
    return list(value)


def merge_parts(
    size: int,
    schemas: Mapping[str, FieldSchema],
    parts: Iterable[tuple[Sequence[int], TensorDictBase]],
    device: Any = None,
) -> TensorDict:
    """Merge per-shard results into one batch, in order.

    ``parts`` holds ``(positions, td)`` pairs: ``td``'s row ``j`` goes to row ``positions[j]``
    of the result; together the positions must cover ``0..size-1`` once. Dense fields are
    concatenated and reordered with one ``index_select``; nested and non-tensor fields row by
    row. A multi-shape dense field whose parts differ in shape (or came back nested) is merged
    row by row too, into a nested tensor (:func:`nest_rows`). Raises StoreInputError if the
    positions do not cover the batch exactly.
    """
    parts = list(parts)
    for positions, td in parts:
        if not isinstance(td, TensorDictBase) or td.batch_size[:1] != (len(positions),):
            raise StoreInputError("each part needs a TensorDict with one row per position")
    order: list[int] = [p for positions, _ in parts for p in positions]
    if sorted(order) != list(range(size)):
        raise StoreInputError("the parts' positions do not cover the batch exactly once")
    columns: dict[str, tuple[FieldSchema, Any]] = {}
    for name, schema in schemas.items():
        values = [td.get(field_key(name)) for _, td in parts]
        if schema.kind == "dense" and len(values) == 1 and order == list(range(size)):
            columns[name] = (schema, values[0])
        elif schema.kind == "dense" and not mixed_shapes(values):
            cat = torch.cat(values, 0)
            inverse = torch.empty(size, dtype=torch.int64)
            inverse[torch.tensor(order, dtype=torch.int64)] = torch.arange(size)
            columns[name] = (schema, cat.index_select(0, inverse.to(cat.device)))
        else:
            rows: list[Any] = [None] * size
            for (positions, _), value in zip(parts, values, strict=True):
                for p, row in zip(positions, _rows_of(schema, value), strict=True):
                    rows[p] = row
            columns[name] = (schema, rows)
    return assemble(size, columns, device)


def mixed_shapes(values: Sequence[Any]) -> bool:
    """Whether the read-back values of one dense field (one per unit) cannot be concatenated:
    a multi-shape field's parts of different shapes, or a nested (mixed) part among them."""
    if any(isinstance(v, torch.Tensor) and v.is_nested for v in values):
        return True
    return len({tuple(v.shape[1:]) for v in values}) > 1


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a (dense) tensor's elements take."""
    return int(math.prod(t.shape)) * t.element_size()
