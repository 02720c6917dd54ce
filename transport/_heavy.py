"""The torch, numpy and tensordict half of the codec, imported on first use.

``transport.codec`` and ``transport._decoder`` import none of these libraries. The first value
of one of their types that ``encode`` meets, and the first record of one of their kinds that
``decode`` meets, imports this module; importing it adds its encoders (keyed by exact type, so
later values of those types cost no more than before) and builders to the codec's registry,
``transport._registry.REGISTRY``. It imports neither half of the codec. The functions below
that are not underscored are what the codec calls for subclasses and for its path finder.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from rayless.transport import _cuda, shm
from rayless.transport import _tensors as T
from rayless.transport._foreign import OBJECT_ARRAY, object_array_state
from rayless.transport._registry import (
    CUDA_IPC,
    DEVICE,
    DTYPE,
    EXT,
    HEAVY_KINDS,
    JAGGED,
    MARK,
    MAX_DEPTH,
    NDARRAY,
    NESTED,
    NTDATA,
    NTSTACK,
    REGISTRY,
    SIZE,
    TDICT,
    TENSOR,
    Unsupported,
    expect,
    one,
)
from rayless.transport.errors import ProtocolError

if TYPE_CHECKING:
    from rayless.transport._decoder import Decoder
    from rayless.transport.codec import _Encoder

_MARK = MARK

parse_device = _cuda.parse_device
sync = _cuda.sync
tensor_problem = T.tensor_problem

# -- encoding ---------------------------------------------------------------------------------


def is_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (of any subclass)."""
    return isinstance(obj, torch.Tensor)


def fallback(enc: _Encoder, obj: Any) -> list[Any] | None:
    """The record for a subclass the exact-type table misses, or None."""
    if isinstance(obj, torch.Tensor) and obj.is_nested:  # jagged ones are a subclass
        return _nested(obj)
    if isinstance(obj, np.generic):
        return _ndarray(enc, np.asarray(obj), scalar=True)
    return None


def problem(obj: Any) -> str | None:
    """Why ``obj``, of a type the codec does not encode, is refused (None: no known reason)."""
    if isinstance(obj, torch.Tensor):
        return T.tensor_problem(obj) or f"cannot encode {type(obj).__qualname__}"
    if isinstance(obj, TensorDictBase):
        return f"cannot encode {type(obj).__qualname__} (convert it with .to_tensordict())"
    if isinstance(obj, np.ndarray):
        return f"cannot encode numpy array subclass {type(obj).__qualname__}"
    return None


def children(obj: Any) -> list[tuple[str, Any]] | None:
    """How the path finder descends into a TensorDict or non-tensor value, or None."""
    kind = type(obj)
    if kind is TensorDict:
        return [(f".{k}", v) for k, v in obj.items()]
    if kind is NonTensorData:
        return [("", obj.data)]
    if kind is NonTensorStack:
        return [(f"[{i}]", v) for i, v in enumerate(obj.tensordicts)]
    if kind is np.ndarray and obj.dtype.kind == "O":
        return [(str(list(i)).replace(" ", ""), obj[i]) for i in np.ndindex(obj.shape)]
    return None


def _tensor(enc: _Encoder, t: torch.Tensor) -> list[Any]:
    problem = T.tensor_problem(t)
    if problem:
        raise Unsupported(problem)
    if t.is_nested:
        return _nested(t)
    name = T.DTYPE_NAMES[t.dtype]
    if t.is_cuda:
        if enc.cuda_ipc:
            return [_MARK[CUDA_IPC], name, t.requires_grad, *_cuda.ipc_fields(t)]
        enc.staged.add(t.device)
        origin: str | None = str(t.device)
        data = _cuda.stage(t)
        ref: int | list[Any] = enc.frame(T.tensor_frame(data))
    else:
        origin, ref = None, _cpu_buffer(enc, T.tensor_frame(t))
    return [_MARK[TENSOR], name, list(t.shape), ref, origin, t.requires_grad]


def _cpu_buffer(enc: _Encoder, view: memoryview) -> int | list[Any]:
    """Where a CPU buffer travels: a frame index, or ``[segment name, size]`` (shared memory)."""
    if enc.shm:
        limit = shm.SHM_MIN_BYTES
        if 0 < limit <= view.nbytes:
            segment = shm.write(view)
            if segment is not None:
                try:
                    enc.segments.append(segment)
                except AttributeError:  # the first one
                    enc.segments = [segment]
                return [segment, view.nbytes]
    return enc.frame(view)


def _nested(t: torch.Tensor) -> list[Any]:
    if t.layout == torch.jagged:
        return [_MARK[JAGGED], t.values(), t.offsets(), t.lengths(), t._ragged_idx]  # type: ignore[attr-defined]
    name = T.DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise Unsupported(f"cannot encode nested tensor of dtype {t.dtype}")
    return [_MARK[NESTED], list(t.unbind()), name, str(t.device)]


def _ndarray(enc: _Encoder, a: np.ndarray, scalar: bool = False) -> list[Any]:
    if a.dtype.kind == "O":  # items encoded one by one (transport._foreign)
        return [_MARK[EXT], OBJECT_ARRAY, object_array_state(a)]
    problem = T.array_problem(a)
    if problem:
        raise Unsupported(problem)
    return [_MARK[NDARRAY], a.dtype.str, list(a.shape), _cpu_buffer(enc, T.array_frame(a)), scalar]


def _tensordict(enc: _Encoder, td: TensorDict) -> list[Any]:
    names = td.names
    named = names if any(n is not None for n in names) else None
    device = None if td.device is None else str(td.device)
    return [_MARK[TDICT], dict(td.items()), list(td.batch_size), device, named]


def _device_name(dev: torch.device | None) -> str | None:
    return None if dev is None else str(dev)


# -- decoding ---------------------------------------------------------------------------------


def _is_tensor(value: Any) -> bool:
    return type(value) is torch.Tensor


def _place(dec: Decoder, origin: Any, hint: torch.device | None = None) -> torch.device | None:
    """The device for a container sent with device ``origin`` (None stays None)."""
    if origin is None:
        return None
    dev = _cuda.origin_device(origin)
    if dev.type == "cpu" or dec.keep_origin:
        return dev
    if dec.device is not None:
        return dec.device
    return hint or _cuda.target_for(None)


def _build_tensor(dec: Decoder, r: list[Any]) -> torch.Tensor:
    expect(r, 6)
    dtype, shape = T.torch_dtype(r[1]), T.check_shape(r[2])
    t = T.tensor_from(dec.buffer(r[3]), dtype, shape)
    if r[4] is not None:
        origin = _cuda.origin_device(r[4])
        target = origin if dec.keep_origin else _cuda.target_for(dec.device)
        if target.type == "cuda":
            t = t.to(target)
    if r[5] is True:
        t.requires_grad_(True)
    return t


def _build_cuda_ipc(dec: Decoder, r: list[Any]) -> torch.Tensor:
    if len(r) < 3:
        raise ProtocolError("bad CUDA IPC record")
    t = _cuda.open_ipc(T.torch_dtype(r[1]), r[3:], dec.device)
    if r[2] is True:
        t.requires_grad_(True)
    return t


def _build_ndarray(dec: Decoder, r: list[Any]) -> Any:
    expect(r, 5)
    dtype, shape = T.numpy_dtype(r[1]), T.check_shape(r[2])
    array = T.array_from(dec.buffer(r[3]), dtype, shape)
    return array[()] if r[4] is True and not shape else array


def _build_jagged(dec: Decoder, r: list[Any]) -> torch.Tensor:
    expect(r, 5)
    values, offsets, lengths, ragged = r[1:]
    if not (_is_tensor(values) and _is_tensor(offsets)) or type(ragged) is not int:
        raise ProtocolError("bad jagged tensor record")
    if lengths is not None and not _is_tensor(lengths):
        raise ProtocolError("bad jagged tensor record")
    return torch.nested.nested_tensor_from_jagged(values, offsets, lengths, ragged)


def _build_nested(dec: Decoder, r: list[Any]) -> torch.Tensor:
    expect(r, 4)
    parts, dtype = r[1], T.torch_dtype(r[2])
    if type(parts) is not list or not all(_is_tensor(p) for p in parts):
        raise ProtocolError("bad nested tensor record")
    dev = parts[0].device if parts else _place(dec, r[3])
    with warnings.catch_warnings():  # the strided layout is "prototype": it was sent as is
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(parts, dtype=dtype, device=dev)


def _build_tensordict(dec: Decoder, r: list[Any]) -> TensorDict:
    expect(r, 5)
    source, batch, device, names = r[1:]
    if type(source) is not dict or not all(type(k) is str for k in source):
        raise ProtocolError("bad TensorDict record")
    if names is not None and (
        type(names) is not list or not all(n is None or type(n) is str for n in names)
    ):
        raise ProtocolError("bad TensorDict names")
    depth = 1 + max((dec.depths.get(id(v), 0) for v in source.values()), default=0)
    if depth > MAX_DEPTH:
        raise ProtocolError(f"TensorDicts nested deeper than {MAX_DEPTH}")
    hint = next((v.device for v in source.values() if _is_tensor(v) and v.is_cuda), None)
    td = TensorDict(
        source, batch_size=T.check_shape(batch), device=_place(dec, device, hint), names=names
    )
    dec.depths[id(td)] = depth
    return td


def _build_non_tensor(dec: Decoder, r: list[Any]) -> NonTensorData:
    expect(r, 4)
    return NonTensorData(data=r[1], batch_size=T.check_shape(r[2]), device=_place(dec, r[3]))


def _build_non_tensor_stack(dec: Decoder, r: list[Any]) -> NonTensorStack:
    expect(r, 3)
    items, dim = r[1], r[2]
    kinds = (NonTensorData, NonTensorStack)
    if type(items) is not list or not items or not all(type(i) in kinds for i in items):
        raise ProtocolError("bad NonTensorStack record")
    if type(dim) is not int:
        raise ProtocolError("bad NonTensorStack record")
    return NonTensorStack(*items, stack_dim=dim)


# -- registration (runs once, at import) ------------------------------------------------------

REGISTRY.add_encoders(
    {
        torch.dtype: lambda enc, obj: [_MARK[DTYPE], T.DTYPE_NAMES.get(obj, str(obj))],
        torch.device: lambda enc, obj: [_MARK[DEVICE], str(obj)],
        torch.Size: lambda enc, obj: [_MARK[SIZE], list(obj)],
        torch.Tensor: _tensor,
        torch.nn.Parameter: _tensor,
        np.ndarray: _ndarray,
        TensorDict: _tensordict,
        NonTensorData: lambda enc, obj: [
            _MARK[NTDATA],
            obj.data,
            list(obj.batch_size),
            _device_name(obj.device),
        ],
        NonTensorStack: lambda enc, obj: [_MARK[NTSTACK], list(obj.tensordicts), obj.stack_dim],
    }
)
_BUILT = {
    DTYPE: one(str, T.torch_dtype),
    DEVICE: one(str, torch.device),
    SIZE: one(list, lambda s: torch.Size(T.check_shape(s))),
    TENSOR: _build_tensor,
    CUDA_IPC: _build_cuda_ipc,
    NDARRAY: _build_ndarray,
    JAGGED: _build_jagged,
    NESTED: _build_nested,
    TDICT: _build_tensordict,
    NTDATA: _build_non_tensor,
    NTSTACK: _build_non_tensor_stack,
}
if set(_BUILT) != set(HEAVY_KINDS):
    raise ImportError("transport._heavy must build exactly _decoder.HEAVY_KINDS")
REGISTRY.set_builders(_BUILT)
REGISTRY.set_heavy(sys.modules[__name__])
