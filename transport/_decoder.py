"""The receive half of the codec: record codes and the hooks that rebuild records.

msgpack calls :meth:`Decoder.ext_hook` for every record marker and :meth:`Decoder.list_hook`
for every list, innermost first, so records are rebuilt bottom-up without recursion. Every
check raises ProtocolError; ``codec.decode`` turns any other failure into one too.

This module imports neither torch, numpy nor tensordict: the builders of records that need
them (tensors, arrays, TensorDicts, dtypes...) live in ``transport._heavy``, which the first
such record imports (it then replaces their entries in ``_registry.REGISTRY``). Record kinds
and markers live in ``transport._registry``; they are re-exported here.
"""

from __future__ import annotations

import importlib
import pickle
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rayless.transport import shm
from rayless.transport._foreign import LAZY_EXTENSIONS
from rayless.transport._objects import rebuild
from rayless.transport._registry import (
    BIGINT,
    CUDA_IPC,
    DEVICE,
    DTYPE,
    ERROR,
    EXT,
    FROZENSET,
    HEAVY_KINDS,
    HEAVY_MODULE,
    JAGGED,
    KINDS,
    MAX_DEPTH,
    NDARRAY,
    NESTED,
    NTDATA,
    NTSTACK,
    OBJECT,
    ODICT,
    PICKLE,
    REGISTRY,
    SET,
    SIZE,
    TDICT,
    TENSOR,
    TUPLE,
    Mark,
    expect,
    one,
)
from rayless.transport.errors import ProtocolError, error_from_state

if TYPE_CHECKING:
    import torch

__all__ = [
    "BIGINT", "CUDA_IPC", "DEVICE", "DTYPE", "ERROR", "EXT", "HEAVY_KINDS", "JAGGED", "KINDS",
    "MAX_DEPTH", "NDARRAY", "NESTED", "NTDATA", "NTSTACK", "ODICT", "PICKLE", "SIZE", "TDICT",
    "TENSOR", "TUPLE", "Decoder", "Mark", "as_bytes_view", "expect", "one",
]  # fmt: skip

_MARKS = [Mark(code) for code in range(KINDS)]
_Builder = Callable[["Decoder", list[Any]], Any]


def as_bytes_view(frame: Any) -> memoryview:
    """A flat, byte-formatted memoryview of a received frame (bytes, memoryview, zmq.Frame...).

    Raises ProtocolError when the object has no contiguous buffer.
    """
    try:
        view = memoryview(frame)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"frame is not a contiguous buffer: {exc}") from None
    return view


class Decoder:
    """Per-call state of ``codec.decode``: frames, options, and counters for validation."""

    __slots__ = (
        "allow_pickle",
        "depths",
        "device",
        "extensions",
        "frames",
        "keep_origin",
        "marks",
        "records",
        "used",
    )

    def __init__(
        self,
        frames: Sequence[Any],
        allow_pickle: bool,
        device: torch.device | None,
        extensions: dict[str, tuple[type, Callable[[Any], Any]]],
    ) -> None:
        self.frames = frames
        self.allow_pickle = allow_pickle
        self.device = device
        self.keep_origin = False  # CUDA tensors land on the device they were sent from
        self.extensions = extensions
        self.marks = 0
        self.records = 0
        self.depths: dict[int, int] = {}
        self.used: set[int] = set()

    def ext_hook(self, code: int, data: bytes) -> Mark:
        """msgpack's ext hook: only zero-length record markers are valid."""
        if data or not 0 < code < KINDS:
            raise ProtocolError(f"unknown ext type {code}")
        self.marks += 1
        return _MARKS[code]

    def list_hook(self, items: list[Any]) -> Any:
        """msgpack's list hook: rebuild records, pass plain lists through."""
        if items and type(items[0]) is Mark:
            self.records += 1
            return _BUILDERS[items[0].code](self, items)
        return items

    def check(self) -> None:
        """After unpacking: every marker began a record and every buffer was used once."""
        if self.marks != self.records:
            raise ProtocolError("record marker outside a record")
        if len(self.used) != len(self.frames) - 1:
            raise ProtocolError(f"{len(self.frames) - 1 - len(self.used)} unused buffer frames")

    def buffer(self, index: Any) -> memoryview:
        """The buffer a record refers to, as bytes: frame ``index`` (each may be used once), or
        the shared memory segment ``[name, size]`` (mapped and unlinked, see ``transport.shm``).
        """
        if type(index) is list:
            if len(index) != 2:
                raise ProtocolError("bad shared memory reference")
            return shm.open_segment(index[0], index[1])
        if type(index) is not int or not 0 < index < len(self.frames):
            raise ProtocolError(f"buffer index {index!r} out of range")
        if index in self.used:
            raise ProtocolError(f"buffer {index} used twice")
        self.used.add(index)
        return as_bytes_view(self.frames[index])

    def extension(self, r: list[Any]) -> Any:
        expect(r, 3)
        found = self.extensions.get(r[1]) if type(r[1]) is str else None
        if found is None and r[1] in LAZY_EXTENSIONS:  # a fixed list of rayless's modules
            importlib.import_module(LAZY_EXTENSIONS[r[1]])
            found = self.extensions.get(r[1])
        if found is None:
            raise ProtocolError(f"unknown extension {r[1]!r}")
        return found[1](r[2])

    def pickled(self, r: list[Any]) -> Any:
        expect(r, 2)
        if not self.allow_pickle:
            raise ProtocolError(
                "refusing a pickled value: this process does not allow pickle (set "
                "RAYLESS_ALLOW_PICKLE=1 in every process of the cluster, or send plain values)"
            )
        if type(r[1]) is not bytes:
            raise ProtocolError("bad pickle record")
        return pickle.loads(r[1])


def _items_of(kind: type[set[Any]] | type[frozenset[Any]]) -> Callable[[Decoder, list[Any]], Any]:
    """A builder of a set or frozenset record (its items after the marker).

    Raises (from the builder):
        ProtocolError: an item that cannot be in a set (a list, a dict).
    """

    def build(dec: Decoder, r: list[Any]) -> Any:
        try:
            return kind(r[1:])
        except TypeError as exc:
            raise ProtocolError(f"bad {kind.__name__} record: {exc}") from None

    return build


def _object(dec: Decoder, r: list[Any]) -> Any:
    if len(r) == 6:  # a class of the sender's __main__ or a function: by value
        return rebuild(r[1], r[2], r[3], r[4], r[5])
    expect(r, 5)
    return rebuild(r[1], r[2], r[3], r[4])


def _load_heavy(dec: Decoder, r: list[Any]) -> Any:
    """First record of a torch/numpy/tensordict kind: import their builders, then build."""
    importlib.import_module(HEAVY_MODULE)  # it replaces the HEAVY_KINDS entries
    return _BUILDERS[r[0].code](dec, r)


_BUILDERS = REGISTRY.builders
REGISTRY.set_builders(
    {
        TUPLE: lambda dec, r: tuple(r[1:]),
        BIGINT: one(bytes, lambda b: int.from_bytes(b, "little", signed=True)),
        ODICT: one(dict, OrderedDict),
        ERROR: one(dict, error_from_state),
        EXT: Decoder.extension,
        PICKLE: Decoder.pickled,
        SET: _items_of(set),
        FROZENSET: _items_of(frozenset),
        OBJECT: _object,
        **dict.fromkeys(HEAVY_KINDS, _load_heavy),
    }
)
