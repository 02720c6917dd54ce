"""The receive half of the codec: record codes and the hooks that rebuild records.

msgpack calls :meth:`Decoder.ext_hook` for every record marker and :meth:`Decoder.list_hook`
for every list, innermost first, so records are rebuilt bottom-up without recursion. Every
check raises ProtocolError; ``codec.decode`` turns any other failure into one too.

This module imports neither torch, numpy nor tensordict: the builders of records that need
them (tensors, arrays, TensorDicts, dtypes...) live in ``transport._heavy``, which the first
such record imports (it then replaces their entries in ``_BUILDERS``).
"""

from __future__ import annotations

import importlib
import pickle
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rayless.transport import shm
from rayless.transport.errors import ProtocolError, error_from_state

if TYPE_CHECKING:
    import torch

# Record kinds: the ext code of the marker that starts a record. Never renumber.
(TUPLE, BIGINT, ODICT, DTYPE, DEVICE, SIZE, TENSOR, CUDA_IPC, NDARRAY, JAGGED, NESTED, TDICT,
 NTDATA, NTSTACK, ERROR, EXT, PICKLE) = range(1, 18)  # fmt: skip
KINDS = 18
MAX_DEPTH = 128  # TensorDict nesting
# Kinds whose builders need torch, numpy or tensordict.
HEAVY_KINDS = (DTYPE, DEVICE, SIZE, TENSOR, CUDA_IPC, NDARRAY, JAGGED, NESTED, TDICT, NTDATA,
               NTSTACK)  # fmt: skip


class Mark:
    """What a record marker decodes to until its record is rebuilt."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code


_MARKS = [Mark(code) for code in range(KINDS)]
_Builder = Callable[["Decoder", list[Any]], Any]


def expect(record: list[Any], n: int) -> None:
    """ProtocolError unless ``record`` (marker included) has ``n`` fields."""
    if len(record) != n:
        raise ProtocolError(f"bad record of kind {record[0].code} with {len(record)} fields")


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
        if found is None:
            raise ProtocolError(f"unknown extension {r[1]!r}")
        return found[1](r[2])

    def pickled(self, r: list[Any]) -> Any:
        expect(r, 2)
        if not self.allow_pickle:
            raise ProtocolError("refusing a pickled value: allow_pickle is off")
        if type(r[1]) is not bytes:
            raise ProtocolError("bad pickle record")
        return pickle.loads(r[1])


def one(kind: type, build: Callable[[Any], Any]) -> _Builder:
    """A builder for two-field records whose payload must be exactly of type ``kind``."""

    def builder(dec: Decoder, r: list[Any]) -> Any:
        expect(r, 2)
        if type(r[1]) is not kind:
            raise ProtocolError(f"bad record of kind {r[0].code}")
        return build(r[1])

    return builder


def _bad(dec: Decoder, r: list[Any]) -> Any:
    raise ProtocolError(f"unknown record kind {r[0].code}")


def _load_heavy(dec: Decoder, r: list[Any]) -> Any:
    """First record of a torch/numpy/tensordict kind: import their builders, then build."""
    importlib.import_module("rayless.transport._heavy")  # replaces the HEAVY_KINDS entries
    return _BUILDERS[r[0].code](dec, r)


_BUILDERS: list[_Builder] = [_bad] * KINDS
_BUILDERS[TUPLE] = lambda dec, r: tuple(r[1:])
_BUILDERS[BIGINT] = one(bytes, lambda b: int.from_bytes(b, "little", signed=True))
_BUILDERS[ODICT] = one(dict, OrderedDict)
_BUILDERS[ERROR] = one(dict, error_from_state)
_BUILDERS[EXT] = Decoder.extension
_BUILDERS[PICKLE] = Decoder.pickled
for _kind in HEAVY_KINDS:
    _BUILDERS[_kind] = _load_heavy
