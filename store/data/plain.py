"""Plain values: what a non-tensor field or a sample's custom meta may hold (msgpack-able).

:func:`check_plain` refuses anything the transport would need pickle for;
:func:`estimate_plain_bytes` is what a plain value costs a storage unit. Neither imports numpy
or torch: a numpy array can only reach them once numpy is imported (``sys.modules``), so the
store's controller checks custom meta without loading either.
:mod:`rayless.store.data.schema` re-exports both.
"""

from __future__ import annotations

import sys
from typing import Any

from rayless.store.errors import SchemaError

__all__ = ["MAX_DEPTH", "check_plain", "estimate_plain_bytes"]

_PLAIN_SCALARS = (str, bytes, int, float, bool, type(None))
MAX_DEPTH = 32


def _ndarray() -> Any:
    """numpy's array type, where numpy is imported already (else no value can be one): None."""
    np = sys.modules.get("numpy")
    return None if np is None else np.ndarray


def check_plain(value: Any, where: str = "value", _depth: int = 0) -> None:
    """Raise SchemaError unless ``value`` is made only of values msgpack carries."""
    if isinstance(value, _PLAIN_SCALARS):
        return
    ndarray = _ndarray()
    if ndarray is not None and isinstance(value, ndarray):
        if value.dtype.hasobject:
            raise SchemaError(
                f"{where} is a numpy array of Python objects (only pickle carries it)"
            )
        return
    if _depth >= MAX_DEPTH:
        raise SchemaError(f"{where} is nested too deeply")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]", _depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SchemaError(f"{where} has a non-str key {key!r}")
            check_plain(item, f"{where}[{key!r}]", _depth + 1)
        return
    raise SchemaError(f"{where} is a {type(value).__name__}, not a plain (msgpack-able) value")


def estimate_plain_bytes(value: Any, _depth: int = 0) -> int:
    """A rough size in bytes of a plain value (what a non-tensor row costs a unit)."""
    if isinstance(value, (str, bytes)):
        return 16 + len(value)
    ndarray = _ndarray()
    if ndarray is not None and isinstance(value, ndarray):
        return 64 + int(value.nbytes)
    if isinstance(value, (list, tuple)) and _depth < MAX_DEPTH:
        return 16 + sum(estimate_plain_bytes(v, _depth + 1) for v in value)
    if isinstance(value, dict) and _depth < MAX_DEPTH:
        return 16 + sum(
            estimate_plain_bytes(k, _depth + 1) + estimate_plain_bytes(v, _depth + 1)
            for k, v in value.items()
        )
    return 8
