"""The codec's registry: record kinds and the tables that encode and rebuild them.

``codec`` (the send half) and ``_decoder`` (the receive half) read :data:`REGISTRY`;
``_heavy`` (torch, numpy, tensordict), imported by either half the first time it is needed,
adds its encoders and builders to it and records itself in it. Nobody assigns to another
module's globals, and ``_heavy`` imports neither half (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgpack

from rayless.transport.errors import ProtocolError

__all__ = ["HEAVY_KINDS", "KINDS", "MARK", "MAX_DEPTH", "REGISTRY", "Mark", "Registry"]

# Record kinds: the ext code of the marker that starts a record. Never renumber.
(TUPLE, BIGINT, ODICT, DTYPE, DEVICE, SIZE, TENSOR, CUDA_IPC, NDARRAY, JAGGED, NESTED, TDICT,
 NTDATA, NTSTACK, ERROR, EXT, PICKLE, SET, FROZENSET, OBJECT) = range(1, 21)  # fmt: skip
KINDS = 21
MAX_DEPTH = 128  # TensorDict nesting
# Kinds whose builders need torch, numpy or tensordict.
HEAVY_KINDS = (DTYPE, DEVICE, SIZE, TENSOR, CUDA_IPC, NDARRAY, JAGGED, NESTED, TDICT, NTDATA,
               NTSTACK)  # fmt: skip
HEAVY_MODULE = "rayless.transport._heavy"
MARK = [msgpack.ExtType(code, b"") for code in range(KINDS)]  # what starts a record on send

Encode = Callable[[Any, Any], Any]  # (the codec's per-call encoder, value) -> record
Build = Callable[[Any, list[Any]], Any]  # (the decoder's per-call state, record) -> value


class Unsupported(TypeError):
    """A value the codec cannot encode; the codec adds the path to the message."""


class Mark:
    """What a record marker decodes to until its record is rebuilt."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code


def _unknown(dec: Any, r: list[Any]) -> Any:
    raise ProtocolError(f"unknown record kind {r[0].code}")


class Registry:
    """Encoders by exact type, builders by record kind, and the heavy module once loaded."""

    def __init__(self) -> None:
        self.encoders: dict[type, Encode] = {}
        self.builders: list[Build] = [_unknown] * KINDS
        self.heavy: ModuleType | None = None

    def add_encoders(self, table: dict[type, Encode]) -> None:
        """Encode values of exactly these types with these functions."""
        self.encoders.update(table)

    def set_builders(self, table: dict[int, Build]) -> None:
        """Rebuild records of these kinds with these functions.

        Raises:
            ValueError: a kind out of range.
        """
        for kind, build in table.items():
            if not 0 < kind < KINDS:
                raise ValueError(f"record kind {kind} out of range")
            self.builders[kind] = build

    def set_heavy(self, module: ModuleType) -> None:
        """Record the module that handles torch, numpy and tensordict values."""
        self.heavy = module


REGISTRY = Registry()


def expect(record: list[Any], n: int) -> None:
    """ProtocolError unless ``record`` (marker included) has ``n`` fields."""
    if len(record) != n:
        raise ProtocolError(f"bad record of kind {record[0].code} with {len(record)} fields")


def one(kind: type, build: Callable[[Any], Any]) -> Build:
    """A builder for two-field records whose payload must be exactly of type ``kind``."""

    def builder(dec: Any, r: list[Any]) -> Any:
        expect(r, 2)
        if type(r[1]) is not kind:
            raise ProtocolError(f"bad record of kind {r[0].code}")
        return build(r[1])

    return builder
