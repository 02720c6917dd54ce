"""Field schemas: the kinds of field, the dtypes a storage unit holds, and :class:`FieldSchema`.

A field is a leaf of a TensorDict named by its key path joined with :data:`FIELD_SEP`; its
schema (kind, dtype, per-sample shape, device) is a typed message on the wire
(``store.FieldSchema``; ``to_dict``/``from_dict`` give the plain form a BatchMeta and a
checkpoint keep) and merges with the schema of newly written data (:meth:`FieldSchema.merged`).
:mod:`rayless.store.data.schema` re-exports everything here. This module does not import torch
(the store's controller uses it): only :func:`dtype_from_name` and
:attr:`FieldSchema.torch_dtype`, which hand out torch dtypes, import it, when called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rayless.actors.ext import message
from rayless.store.errors import SchemaError

if TYPE_CHECKING:
    import torch

__all__ = [
    "FIELD_SEP",
    "KINDS",
    "STORABLE_DTYPES",
    "FieldSchema",
    "Shape",
    "dtype_from_name",
    "dtype_name",
    "field_key",
]

FIELD_SEP = "."
KINDS = ("dense", "jagged", "strided", "non_tensor")
Shape = tuple[int | None, ...]
# Dtypes a storage unit can hold: those whose index_copy_/index_select/cat work on every
# device. Others (uint16/32/64, float8_*, sub-byte and quantized dtypes) are refused with a
# SchemaError when a TensorDict is split, i.e. at the client before anything is allocated.
STORABLE_DTYPES = frozenset(
    {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
)


def dtype_name(dtype: torch.dtype) -> str:
    """The wire name of a torch dtype: ``torch.float32`` → ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (as :func:`dtype_name` writes it). Raises SchemaError."""
    import torch

    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise SchemaError(f"unknown dtype name {name!r}")
    return value


def field_key(name: str) -> tuple[str, ...]:
    """The TensorDict key path of field ``name`` (``"obs.image"`` → ``("obs", "image")``)."""
    return tuple(name.split(FIELD_SEP))


@message("store.FieldSchema")
@dataclass(frozen=True)
class FieldSchema:
    """What the store knows of one field: kind, dtype, per-sample shape and original device.

    ``shape`` is the shape of one sample (without the batch dimension); ``None`` entries mark
    dimensions that vary between samples. A dense field with ``None`` entries is a *multi-shape*
    dense field: puts of different per-sample shapes (of one rank) each kept dense, in a column
    part of their own per shape (see :meth:`merged`). Non-tensor fields have no dtype, shape or
    device. ``device`` is where the data lived when it was put (``get`` returns it there).
    """

    kind: str
    dtype: str | None = None
    shape: Shape | None = None
    device: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SchemaError(f"unknown field kind {self.kind!r}; expected one of {KINDS}")
        if self.kind == "non_tensor":
            if self.dtype is not None or self.shape is not None:
                raise SchemaError("a non-tensor field has no dtype or shape")
            return
        if self.dtype is None or self.shape is None:
            raise SchemaError(f"a {self.kind} field needs a dtype and a shape")
        if self.dtype not in STORABLE_DTYPES:  # (every one of them is a torch dtype)
            raise SchemaError(
                f"dtype {self.dtype} cannot be stored (supported: {sorted(STORABLE_DTYPES)})"
            )
        if any(d is not None and (not isinstance(d, int) or d < 0) for d in self.shape):
            raise SchemaError(f"bad per-sample shape {self.shape!r}")

    @property
    def is_nested(self) -> bool:
        """True for nested (ragged) tensor fields."""
        return self.kind in ("jagged", "strided")

    @property
    def is_multi_shape(self) -> bool:
        """True for a dense field whose samples were put with different per-sample shapes
        (each shape is a dense column part; a read mixing them comes back nested)."""
        return self.kind == "dense" and self.shape is not None and None in self.shape

    @property
    def is_non_tensor(self) -> bool:
        """True for fields of plain, non-tensor values."""
        return self.kind == "non_tensor"

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The field's torch dtype (None for non-tensor fields)."""
        return None if self.dtype is None else dtype_from_name(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (a BatchMeta's wire form and a checkpoint keep schemas so)."""
        return {
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
            "device": self.device,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FieldSchema:
        """Rebuild from :meth:`to_dict`'s output. Raises SchemaError on malformed input."""
        if not isinstance(data, Mapping) or "kind" not in data:
            raise SchemaError(f"not a field schema: {data!r}")
        shape = data.get("shape")
        if shape is not None and not isinstance(shape, (list, tuple)):
            raise SchemaError(f"bad shape in field schema: {shape!r}")
        return cls(
            kind=data["kind"],
            dtype=data.get("dtype"),
            shape=None if shape is None else tuple(shape),
            device=data.get("device"),
        )

    def merged(self, new: FieldSchema, name: str) -> FieldSchema:
        """The schema after ``new`` data is written into a field that has this schema.

        Kind and dtype may never change; a field keeps its number of per-sample dimensions
        (dimensions that now differ become ``None``: a dense field then holds several shapes,
        each in a dense column part of its own, as TransferQueue takes a padded batch of
        another width). The device is the newest. Raises SchemaError naming the field otherwise.
        """
        if new.kind != self.kind:
            raise SchemaError(
                f"field {name!r} holds {self.kind} data; cannot write {new.kind} data"
            )
        if new.dtype != self.dtype:
            raise SchemaError(
                f"field {name!r} has dtype {self.dtype}; cannot write {new.dtype} "
                "(a field keeps its dtype while any sample holds it)"
            )
        if self.kind == "non_tensor" or new.shape == self.shape:
            return self if new.device == self.device else replace(self, device=new.device)
        old_shape, new_shape = self.shape or (), new.shape or ()
        if len(old_shape) != len(new_shape):
            raise SchemaError(
                f"field {name!r} has {len(old_shape)}-dim samples; cannot write "
                f"{len(new_shape)}-dim samples"
            )
        shape = tuple(a if a == b else None for a, b in zip(old_shape, new_shape, strict=True))
        return FieldSchema(self.kind, self.dtype, shape, new.device)
