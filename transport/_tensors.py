"""Tensor and array buffers for the codec: dtype tables, zero-copy views, validation.

Send side: :func:`tensor_frame` and :func:`array_frame` return a memoryview over the value's
own memory (a contiguous copy only for views that are not contiguous). Receive side:
:func:`view_buffer` turns a received buffer into a writable uint8 array without copying and
without torch's non-writable-buffer warning, keeping the buffer's owner (a ``zmq.Frame``,
``bytes``, the mapping of a shared memory segment...) alive for as long as any tensor or array
made from it.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import torch

from rayless.transport._decoder import as_bytes_view as as_bytes_view
from rayless.transport.codec import Unsupported as Unsupported
from rayless.transport.errors import ProtocolError

MAX_DIMS = 64
MAX_DIM_SIZE = 1 << 62
# Buffers smaller than this are copied on receive: cheaper than the zero-copy bookkeeping, and
# it never makes a tensor write into small cached objects (such as one-byte bytes singletons).
COPY_BELOW = 1024

_QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
# Every dtype this torch has, by its short name ("float32", "bfloat16", "float8_e4m3fn"...).
DTYPES: dict[str, torch.dtype] = {
    str(value).removeprefix("torch."): value
    for value in vars(torch).values()
    if isinstance(value, torch.dtype) and value not in _QUANTIZED
}
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}
_SAME_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_DTYPE = re.compile(r"[<>|][biufc][0-9]{1,2}")


def tensor_problem(t: torch.Tensor) -> str | None:
    """Why ``t`` cannot be sent, or None when it can (layout, dtype, device checks)."""
    if t.is_nested:
        return None
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return f"cannot encode tensor subclass {type(t).__qualname__}"
    if t.layout != torch.strided:
        return f"cannot encode tensor with layout {t.layout}"
    if t.dtype not in DTYPE_NAMES:
        return f"cannot encode tensor of dtype {t.dtype}"
    if t.device.type not in ("cpu", "cuda"):
        return f"cannot encode tensor on device {t.device}"
    return None


def array_problem(a: np.ndarray) -> str | None:
    """Why the numpy array ``a`` cannot be sent, or None when it can."""
    if a.dtype.kind not in "biufc" or a.dtype.fields is not None or a.dtype.subdtype:
        return f"cannot encode numpy array of dtype {a.dtype}"
    return None


def tensor_frame(t: torch.Tensor) -> memoryview:
    """A byte view of the CPU tensor ``t``'s data, sharing memory when it is contiguous.

    The view keeps ``t`` (or its contiguous copy) alive; the caller must not modify the tensor
    until the frame has been sent.
    """
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        try:
            t = t.contiguous()
        except NotImplementedError:  # sub-byte and bits dtypes: copy as same-size integers
            t = t.view(_SAME_SIZE[t.dtype.itemsize]).contiguous().view(t.dtype)
    return t.reshape(-1).view(torch.uint8).numpy().data


def array_frame(a: np.ndarray) -> memoryview:
    """A byte view of the numpy array ``a`` (C order; copied once when it is not C-contiguous)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8).data


class _Owner:
    """Exposes received memory to numpy as writable while holding the buffer's owner alive."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, owner: memoryview, address: int, nbytes: int) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }


def view_buffer(view: memoryview, align: int) -> np.ndarray:
    """A writable uint8 array over ``view``'s memory, or over a copy.

    Copies (into fresh, aligned memory) when the buffer is small or its address is not a
    multiple of ``align``; otherwise no byte is copied. The array's base keeps ``view`` (and so
    the frame or bytes object it came from) alive. Decoding takes ownership of received
    buffers: writing to the result writes into them.
    """
    raw = np.frombuffer(view, dtype=np.uint8)
    address = raw.__array_interface__["data"][0]
    if view.nbytes < COPY_BELOW or address % align:
        return raw.copy()
    return np.asarray(_Owner(view, address, view.nbytes))


def check_shape(shape: Any) -> tuple[int, ...]:
    """Validate a shape from the wire: a list of at most 64 non-negative ints."""
    if type(shape) is not list or len(shape) > MAX_DIMS:
        raise ProtocolError(f"bad shape {shape!r}")
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= MAX_DIM_SIZE:
            raise ProtocolError(f"bad shape {shape!r}")
    return tuple(shape)


def torch_dtype(name: Any) -> torch.dtype:
    """The torch dtype named ``name`` on the wire; ProtocolError for unknown names."""
    dtype = DTYPES.get(name) if type(name) is str else None
    if dtype is None:
        raise ProtocolError(f"unknown tensor dtype {name!r}")
    return dtype


def numpy_dtype(name: Any) -> np.dtype[Any]:
    """The numpy dtype written ``name`` (e.g. ``'<f4'``); only bool and numeric kinds."""
    if type(name) is not str or not _NUMPY_DTYPE.fullmatch(name):
        raise ProtocolError(f"unknown array dtype {name!r}")
    try:
        return np.dtype(name)
    except TypeError:
        raise ProtocolError(f"unknown array dtype {name!r}") from None


def _align(itemsize: int, complex_: bool) -> int:
    return min(itemsize // 2 if complex_ else itemsize, 8) or 1


def _expect(view: memoryview, shape: tuple[int, ...], itemsize: int) -> None:
    nbytes = math.prod(shape) * itemsize
    if view.nbytes != nbytes:
        raise ProtocolError(f"buffer of {view.nbytes} bytes for shape {shape} needs {nbytes}")


def tensor_from(view: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A CPU tensor of ``dtype`` and ``shape`` backed by ``view`` (see :func:`view_buffer`).

    Raises ProtocolError when the buffer length does not match dtype and shape.
    """
    itemsize = dtype.itemsize
    _expect(view, shape, itemsize)
    if not view.nbytes:
        return torch.empty(shape, dtype=dtype)
    data = torch.from_numpy(view_buffer(view, _align(itemsize, dtype.is_complex)))
    return data.view(dtype).reshape(shape)


def array_from(view: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """A numpy array of ``dtype`` and ``shape`` backed by ``view`` (see :func:`view_buffer`)."""
    _expect(view, shape, dtype.itemsize)
    if not view.nbytes:
        return np.empty(shape, dtype=dtype)
    data = view_buffer(view, _align(dtype.itemsize, dtype.kind == "c"))
    return data.view(dtype).reshape(shape)
