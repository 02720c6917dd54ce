"""Rows of a put as plain columns on the wire, instead of a TensorDict.

A client writing one unit's rows sends ``{name: record}``: a dense field as one tensor, a nested
(ragged) field as its rows' values in one flat tensor plus their shapes, a non-tensor field as a
plain list. Building a TensorDict for that (a NonTensorStack of 1,024 strings, a jagged tensor
from 1,024 rows) and taking it apart again on the unit cost more than moving the bytes; the
unit now rebuilds the columns straight from the records (:func:`unpack_columns`), deriving
each schema from the data itself and validating everything the TensorDict path validates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from rayless.store.data.schema import (
    FIELD_SEP,
    Column,
    FieldSchema,
    _storable,
    check_plain,
    shapes_from_wire,
    shapes_to_wire,
)
from rayless.store.errors import SchemaError

__all__ = ["PACKED", "is_packed", "pack_columns", "unpack_columns"]

PACKED = "\x00packed"  # the key that marks a packed write (no field name can start with NUL)


def is_packed(value: Any) -> bool:
    """Whether ``value`` is :func:`pack_columns`' output."""
    return isinstance(value, dict) and value.get(PACKED) == 1


def pack_columns(columns: Mapping[str, Column], positions: list[int]) -> dict[str, Any]:
    """The rows at ``positions`` of ``columns`` as plain records (dense rows: one contiguous
    tensor; nested: one flat values tensor and the shapes; non-tensor: a list)."""
    n = len(positions)
    run = n > 0 and positions == list(range(positions[0], positions[0] + n))
    out: dict[str, Any] = {PACKED: 1, "n": n}
    for name, col in columns.items():
        if col.dense is not None:
            dense = col.dense
            if run:
                part = dense.narrow(0, positions[0], n)
            else:
                part = dense.index_select(0, torch.tensor(positions, device=dense.device))
            out[name] = {"kind": "dense", "t": part.contiguous()}
        elif col.schema.is_non_tensor:
            rows = col.rows or []
            out[name] = {"kind": "non_tensor", "values": [rows[p] for p in positions]}
        else:
            rows = [(col.rows or [])[p] for p in positions]
            shapes = [tuple(int(d) for d in r.shape) for r in rows]
            dtype = col.schema.torch_dtype or torch.float32
            if rows and all(r.dim() == 1 for r in rows):
                flat = torch.cat(rows)  # ragged 1-D rows (token ids): no per-row reshape
            elif rows:
                flat = torch.cat([r.reshape(-1) for r in rows])
            else:
                flat = torch.empty(0, dtype=dtype)
            out[name] = {"kind": col.schema.kind, "values": flat, "shapes": shapes_to_wire(shapes)}
    return out


def unpack_columns(packed: Mapping[str, Any], batch_size: int) -> dict[str, Column]:
    """Columns from :func:`pack_columns`' output, schemas derived from the data. Raises
    SchemaError for anything malformed or that the store cannot hold (what ``split_columns``
    raises for the same data)."""
    if packed.get("n") != batch_size:
        raise SchemaError(f"the write holds {packed.get('n')!r} samples, expected {batch_size}")
    columns: dict[str, Column] = {}
    for name, rec in packed.items():
        if name in (PACKED, "n"):
            continue
        if not isinstance(name, str) or any(not p for p in name.split(FIELD_SEP)):
            raise SchemaError(f"bad field name {name!r}")
        if not isinstance(rec, dict):
            raise SchemaError(f"field {name!r}: bad packed record")
        columns[name] = _column(name, rec, batch_size)
    return columns


def _column(name: str, rec: Mapping[str, Any], n: int) -> Column:
    kind = rec.get("kind")
    if kind == "dense":
        t = rec.get("t")
        if not isinstance(t, torch.Tensor) or t.is_nested or t.dim() < 1 or t.shape[0] != n:
            raise SchemaError(f"field {name!r}: a dense field needs a [{n}, ...] tensor")
        shape = tuple(int(d) for d in t.shape[1:])
        return Column(FieldSchema("dense", _storable(t.dtype, name), shape, str(t.device)), dense=t)
    if kind == "non_tensor":
        values = rec.get("values")
        if not isinstance(values, list) or len(values) != n:
            raise SchemaError(f"field {name!r}: non-tensor data must have one value per sample")
        for i, row in enumerate(values):
            check_plain(row, f"field {name!r} sample {i}")
        return Column(FieldSchema("non_tensor"), rows=values)
    if kind in ("jagged", "strided"):
        return _nested(name, kind, rec, n)
    raise SchemaError(f"field {name!r}: unknown packed kind {kind!r}")


def _nested(name: str, kind: str, rec: Mapping[str, Any], n: int) -> Column:
    values = rec.get("values")
    if not isinstance(values, torch.Tensor) or values.is_nested or values.dim() != 1:
        raise SchemaError(f"field {name!r}: a nested field needs one flat values tensor")
    try:
        shapes = shapes_from_wire(rec.get("shapes"))
    except Exception as exc:
        raise SchemaError(f"field {name!r}: {exc}") from None
    if len(shapes) != n or any(s is None or not s for s in shapes):
        raise SchemaError(f"field {name!r}: needs the shape (rank >= 1) of each of {n} samples")
    known: list[tuple[int, ...]] = [s for s in shapes if s is not None]
    sizes = [math.prod(s) for s in known]
    if sum(sizes) != values.shape[0]:
        raise SchemaError(f"field {name!r}: the shapes do not cover the values")
    rank = len(known[0]) if known else 1
    if any(len(s) != rank for s in known):
        raise SchemaError(f"field {name!r}: samples of a nested tensor differ in rank")
    if known:
        first = known[0]
        shape = tuple(d if all(s[i] == d for s in known) else None for i, d in enumerate(first))
    else:
        shape = (None,)
    if kind == "jagged" and None in shape[1:]:
        raise SchemaError(
            f"field {name!r}: a jagged tensor may vary only in its first sample dimension"
        )
    pieces = values.split(sizes)
    if rank == 1:  # already the rows' shapes: no per-row view
        rows: list[Any] = list(pieces)
    else:
        rows = [piece.view(s) for piece, s in zip(pieces, known, strict=True)]
    schema = FieldSchema(kind, _storable(values.dtype, name), shape, str(values.device))
    return Column(schema, rows=rows, sample_shapes=known)
