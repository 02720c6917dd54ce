"""The envelope format: one msgpack header plus one out-of-band frame per tensor or array buffer.

``encode(obj)`` returns ``[header, buf1, buf2, ...]``; the buffers share memory with the
tensors they come from (send them with ``copy=False`` and do not modify those tensors until
sent). ``decode(frames)`` rebuilds the value; its tensors and arrays are backed by the received
buffers without a copy (except buffers under 1 KiB, or buffers whose address is not aligned
for their dtype, which are copied). With ``shm=True`` (a peer on the same host), CPU buffers of
at least ``transport.shm.SHM_MIN_BYTES`` are instead copied once into ``/dev/shm`` segments
that the receiver maps and unlinks (``transport.shm``); the tensor may then be modified as soon
as ``encode`` returns.

Values msgpack has no type for travel as *records*: lists whose first item is a zero-length
msgpack ext marker naming the kind (tuple, tensor, TensorDict, error...). The packer runs in C
with ``strict_types=True`` and calls back into Python only for those; decoding rebuilds records
bottom-up in a ``list_hook``. Round trips are exact for: None, bool, int (any size), float,
str, bytes (bytearray and memoryview arrive as bytes), list, tuple, dict (any encodable keys),
OrderedDict, torch tensors of every non-quantized dtype (non-contiguous ones made contiguous,
``requires_grad`` kept, autograd history dropped, ``Parameter`` arrives as a plain tensor),
jagged and strided nested tensors, ``torch.dtype``/``device``/``Size``, numpy arrays and
scalars of bool and numeric dtypes (C order), numpy object arrays (item by item), verl's
``DataProto`` and OmegaConf's ``DictConfig``/``ListConfig`` (``transport._foreign``),
TensorDict (nesting, batch_size, device, names; the lock is not kept), NonTensorData and
NonTensorStack, every ``RaylessError`` (through ``errors.error_to_state``), set and frozenset,
instances of dataclasses and Enum members (by their class's name, or with the class by value
where it has no importable name: ``transport._objects``), and types added with
:func:`register_extension`. CUDA tensors: see
``transport._cuda``. Anything else is a ``TypeError`` naming its path, unless ``allow_pickle``.

Decoding never trusts the header: every malformed input raises ``ProtocolError`` (a header
over ``max_header`` raises its subclass ``LimitError``). Nesting is bounded by msgpack's
unpacker stack (1023 levels), TensorDict nesting by ``_decoder.MAX_DEPTH`` (128).

Importing the codec imports neither torch, numpy nor tensordict (processes that never see a
tensor do not pay for them): ``transport._heavy`` holds everything that needs them and is
imported the first time a value of theirs is encoded or a record of theirs is decoded; it then
adds its encoders and builders to the explicit registry ``transport._registry.REGISTRY``.
"""

from __future__ import annotations

import importlib
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Union

import msgpack

from rayless.transport import shm as _shm
from rayless.transport._decoder import Decoder
from rayless.transport._foreign import FOREIGN, OBJECT_ARRAY, object_array
from rayless.transport._objects import (
    by_name,
    classes_by_value_refused,
    object_state,
    refuse_classes_by_value,
)
from rayless.transport._registry import (
    BIGINT,
    ERROR,
    EXT,
    FROZENSET,
    HEAVY_MODULE,
    MARK,
    OBJECT,
    ODICT,
    PICKLE,
    REGISTRY,
    SET,
    TUPLE,
    Unsupported,
)
from rayless.transport.errors import LimitError, ProtocolError, RaylessError, error_to_state

if TYPE_CHECKING:
    import torch

__all__ = [
    "Buffer",
    "decode",
    "encode",
    "join_family",
    "leave_family",
    "refuse_classes_by_value",
    "register_extension",
    "register_family",
    "sweep_shm",
]

Buffer = Union[bytes, bytearray, memoryview]
MAX_HEADER = 16 << 20
_MAX_WALK = 500  # deepest level the path finder descends to
_MARK = MARK
_EXT_BY_TYPE: dict[type, tuple[str, Callable[[Any], Any]]] = {}
_EXT_BY_NAME: dict[str, tuple[type, Callable[[Any], Any]]] = {}
_FAMILIES: set[str] = set()  # extension names of register_family
# Top-level packages whose types ``transport._heavy`` handles.
_HEAVY_ROOTS = frozenset(("torch", "numpy", "tensordict"))
_SHM_LIVE = _shm.LIVE  # non-empty: encode may have segments to sweep


def _is_heavy(cls: type) -> bool:
    """Whether ``cls`` or one of its bases comes from torch, numpy or tensordict."""
    return any(
        getattr(base, "__module__", "").partition(".")[0] in _HEAVY_ROOTS for base in cls.__mro__
    )


def _load_heavy() -> ModuleType:
    """Import ``transport._heavy`` (once): it registers the torch/numpy/tensordict encoders."""
    if REGISTRY.heavy is None:
        importlib.import_module(HEAVY_MODULE)  # it records itself in REGISTRY
    assert REGISTRY.heavy is not None  # internal invariant: _heavy registers at import
    return REGISTRY.heavy


def register_extension(
    cls: type, name: str, to_state: Callable[[Any], Any], from_state: Callable[[Any], Any]
) -> None:
    """Make instances of exactly ``cls`` (not its subclasses) encodable under ``name``.

    ``to_state(obj)`` returns any encodable value; decode calls ``from_state(state)``.
    Registering the same class and name again replaces the functions. Raises ValueError when
    ``name`` is taken by another class, ``cls`` already has another name, or the codec handles
    ``cls`` itself.
    """
    if not isinstance(cls, type) or not isinstance(name, str) or not name:
        raise ValueError("register_extension needs a class and a non-empty name")
    if REGISTRY.heavy is None and _is_heavy(cls):
        _load_heavy()  # so that the check below sees the tensor types
    if cls in _ENCODERS or cls in _NATIVE or issubclass(cls, RaylessError):
        raise ValueError(f"the codec already encodes {cls.__qualname__}")
    taken = _EXT_BY_NAME.get(name)
    if taken is not None and (taken[0] is not cls or name in _FAMILIES):
        raise ValueError(f"extension name {name!r} is taken by {taken[0].__qualname__}")
    known = _EXT_BY_TYPE.get(cls)
    if known is not None and known[0] != name:
        raise ValueError(f"{cls.__qualname__} is registered as {known[0]!r}")
    _EXT_BY_TYPE[cls] = (name, to_state)
    _EXT_BY_NAME[name] = (cls, from_state)


def register_family(
    name: str, from_state: Callable[[Any], Any], *, runs_code: bool = False
) -> None:
    """Decode extension records named ``name`` with ``from_state``, whatever class each came
    from: a family of classes (:func:`join_family`) whose records carry what rebuilds them,
    so that a receiver needs no registration of its own. ``runs_code``: ``from_state`` loads
    code the record carries, refused (``ProtocolError``) in a process that loads no class by
    value (:func:`refuse_classes_by_value`). Registering the name again replaces the function.

    Raises:
        ValueError: ``name`` is an extension of one class (:func:`register_extension`).
    """
    taken = _EXT_BY_NAME.get(name)
    if taken is not None and name not in _FAMILIES:
        raise ValueError(f"extension name {name!r} is taken by {taken[0].__qualname__}")
    _FAMILIES.add(name)
    _EXT_BY_NAME[name] = (object, _guarded(from_state) if runs_code else from_state)


def join_family(cls: type, name: str, to_state: Callable[[Any], Any]) -> None:
    """Encode instances of exactly ``cls`` as records of family ``name`` (its state
    ``to_state(obj)``, any encodable value); joining again replaces ``to_state``.

    Raises:
        ValueError: ``name`` is no family, ``cls`` has an extension of its own, or the codec
            encodes ``cls`` itself (a builtin, a tensor).
    """
    if not isinstance(cls, type) or name not in _FAMILIES:
        raise ValueError(f"join_family needs a class and a registered family, not {name!r}")
    if REGISTRY.heavy is None and _is_heavy(cls):
        _load_heavy()  # so that the check below sees the tensor types
    if cls in _ENCODERS or cls in _NATIVE or issubclass(cls, RaylessError):
        raise ValueError(f"the codec already encodes {cls.__qualname__}")
    known = _EXT_BY_TYPE.get(cls)
    if known is not None and known[0] != name:
        raise ValueError(f"{cls.__qualname__} is registered as {known[0]!r}")
    _EXT_BY_TYPE[cls] = (name, to_state)


def leave_family(cls: type, name: str) -> None:
    """Stop encoding ``cls`` as family ``name`` (nothing happens if it is not a member)."""
    known = _EXT_BY_TYPE.get(cls)
    if known is not None and known[0] == name:
        del _EXT_BY_TYPE[cls]


def _guarded(from_state: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def guarded(state: Any) -> Any:
        if classes_by_value_refused():
            raise ProtocolError(
                "a value arrived with the code that rebuilds it, which this process (it "
                "runs no user code) does not load"
            )
        return from_state(state)

    return guarded


class _Encoder:
    """Per-call state of :func:`encode`: the out-of-band frames and the packer's hook."""

    __slots__ = ("allow_pickle", "cuda_ipc", "frames", "segments", "shm", "staged")
    segments: list[str]  # shared memory segments written; set by the first one only

    def __init__(self, allow_pickle: bool, cuda_ipc: bool, shm: bool = False) -> None:
        self.allow_pickle = allow_pickle
        self.cuda_ipc = cuda_ipc
        self.shm = shm
        self.frames: list[Buffer] = []
        self.staged: set[torch.device] = set()

    def frame(self, buf: memoryview) -> int:
        self.frames.append(buf)
        return len(self.frames)

    def default(self, obj: Any) -> Any:
        """msgpack's hook: turn ``obj`` into a record or raise ``Unsupported``."""
        kind = type(obj)
        encoder = _ENCODERS.get(kind)
        if encoder is not None:
            return encoder(self, obj)
        ext = _EXT_BY_TYPE.get(kind)
        if ext is not None:
            return [_MARK[EXT], ext[0], ext[1](obj)]
        foreign = FOREIGN.get(_qualified(kind))
        if foreign is not None:
            return [_MARK[EXT], foreign[0], foreign[1](obj)]
        if isinstance(obj, RaylessError):
            return [_MARK[ERROR], error_to_state(obj)]
        if by_name(kind) or issubclass(kind, type):
            # a dataclass or Enum of an importable module, or a class (transport._objects)
            try:
                return [_MARK[OBJECT], *object_state(obj)]
            except TypeError as exc:
                raise Unsupported(str(exc)) from None
        heavy = REGISTRY.heavy
        if heavy is None and _is_heavy(kind):
            heavy = _load_heavy()
            encoder = _ENCODERS.get(kind)
            if encoder is not None:
                return encoder(self, obj)
        problem = None
        if heavy is not None:  # subclasses: jagged nested tensors, numpy scalars...
            record = heavy.fallback(self, obj)
            if record is not None:
                return record
            problem = heavy.problem(obj)
        if problem is None and self.allow_pickle:
            try:  # cloudpickle, as Ray: a lambda or a class of the script travels too
                import cloudpickle

                return [_MARK[PICKLE], cloudpickle.dumps(obj, protocol=5)]
            except Exception as exc:
                problem = f"cannot pickle {type(obj).__qualname__}: {exc}"
        raise Unsupported(problem or _refusal(kind))


def _refusal(kind: type) -> str:
    """Why a value of ``kind`` cannot be sent: its class's own ``__rayless_refusal__`` (a
    higher layer's type that must not travel says what to do instead), else for an instance
    of a class of the program or a library (not of Python's own) what travels instead."""
    reason = f"cannot encode {kind.__qualname__}"
    own = getattr(kind, "__rayless_refusal__", None)
    if isinstance(own, str):
        return f"{reason} ({own})"
    if kind.__module__.partition(".")[0] in sys.stdlib_module_names:
        return reason
    return (
        f"{reason} (values travel without pickle: send a dataclass or plain values instead, "
        "or start every process of the cluster with RAYLESS_ALLOW_PICKLE=1)"
    )


_ENCODERS = REGISTRY.encoders  # transport._heavy adds the torch, numpy and tensordict types
REGISTRY.add_encoders(
    {
        tuple: lambda enc, obj: [_MARK[TUPLE], *obj],
        int: lambda enc, obj: [
            _MARK[BIGINT],
            obj.to_bytes(obj.bit_length() // 8 + 1, "little", signed=True),
        ],
        OrderedDict: lambda enc, obj: [_MARK[ODICT], dict(obj)],
        set: lambda enc, obj: [_MARK[SET], *obj],
        frozenset: lambda enc, obj: [_MARK[FROZENSET], *obj],
    }
)
_NATIVE = (type(None), bool, int, float, str, bytes, bytearray, memoryview, list, dict)
# extensions of other libraries' values (transport._foreign): decoded by name only
_EXT_BY_NAME[OBJECT_ARRAY] = (object, object_array)
for _ext_name, _to_state, _from_state in FOREIGN.values():
    _EXT_BY_NAME[_ext_name] = (object, _from_state)


def _qualified(kind: type) -> str:
    return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', '')}"


def encode(
    obj: Any,
    *,
    allow_pickle: bool = False,
    cuda_ipc: bool = False,
    shm: bool = False,
    root: str = "obj",
) -> list[Buffer]:
    """Encode ``obj`` as ``[msgpack header, *buffers]``, one buffer per tensor or array.

    ``cuda_ipc=True`` sends CUDA tensors as IPC handles (peer on the same host); otherwise they
    are staged through pinned host memory. ``shm=True`` (peer on the same host) writes CPU
    tensor and array buffers of at least ``transport.shm.SHM_MIN_BYTES`` into shared memory
    segments instead of frames (falling back to frames when ``/dev/shm`` is unusable). Raises
    TypeError naming the path of the first value that cannot be encoded, e.g.
    ``args[1]['obs'].foo: cannot encode set`` (``root`` names the top level); the error's
    ``path`` holds the parts below the root (``("[1]", "['obs']", ".foo")``), its
    ``reason`` the rest, so that a higher layer can name the value in its own terms.
    """
    enc = _Encoder(allow_pickle, cuda_ipc, shm)
    try:
        header = msgpack.Packer(default=enc.default, strict_types=True).pack(obj)
    except BaseException as exc:
        if shm and hasattr(enc, "segments"):
            _shm.discard(enc.segments)
        if not isinstance(exc, (TypeError, ValueError, OverflowError)):
            raise
        found = _locate(obj, (), _Encoder(allow_pickle, False), 0, set())
        parts, reason = found if found is not None else ((), str(exc))
        error = TypeError(f"{root}{_shown_path(parts)}: {reason}")
        error.path, error.reason = parts, reason  # type: ignore[attr-defined]
        raise error from None
    if enc.staged:
        _load_heavy().sync(enc.staged)
    if shm and _SHM_LIVE:
        _shm.maybe_sweep()
    return [header, *enc.frames]


def sweep_shm(max_age: float | None = None) -> int:
    """Unlink this process's shared memory segments older than ``max_age`` seconds (default
    ``transport.shm.SHM_MAX_AGE``) that no receiver consumed; returns how many there were.
    """
    return _shm.sweep(max_age)


def _shown_path(parts: tuple[str, ...]) -> str:
    """A path for a message: a long one (a value nested hundreds deep) with its middle cut."""
    if len(parts) <= 16:
        return "".join(parts)
    return f"{''.join(parts[:8])}...({len(parts) - 12} levels)...{''.join(parts[-4:])}"


def _locate(
    obj: Any, path: tuple[str, ...], enc: _Encoder, depth: int, above: set[int]
) -> tuple[tuple[str, ...], str] | None:
    """Find the first value under ``obj`` that encode rejects: (its path below the root, as
    ``("[1]", "['obs']", ".foo")``, and the reason), or None. ``above``: the ids of the
    containers on the path (a container met again under itself is a cycle)."""
    kind = type(obj)
    if kind is str:
        try:
            obj.encode()
        except UnicodeEncodeError:
            return path, "cannot encode str that is not valid UTF-8"
        return None
    if kind in _SCALARS:
        return None
    if depth > _MAX_WALK:
        return path, f"nested deeper than {_MAX_WALK} levels"
    heavy = REGISTRY.heavy
    if heavy is None and _is_heavy(kind):
        heavy = _load_heavy()
    if heavy is not None and heavy.is_tensor(obj):
        problem = heavy.tensor_problem(obj)
        return (path, problem) if problem else None
    try:
        children = _children(obj, heavy)
        if children is None:
            enc.default(obj)
            return None
    except (TypeError, ValueError, OverflowError) as exc:
        return path, str(exc)
    if id(obj) in above:
        return path, f"{kind.__qualname__} contains itself (a cycle cannot be sent)"
    above.add(id(obj))
    try:
        if kind is dict or kind is OrderedDict:
            for key in obj:
                found = _locate(key, (*path, f"[{key!r}]"), enc, depth + 1, above)
                if found:
                    return found[0], f"{found[1]} (as a dict key)"
        for suffix, child in children:
            found = _locate(child, (*path, suffix) if suffix else path, enc, depth + 1, above)
            if found:
                return found
        return None
    finally:
        above.discard(id(obj))


_SCALARS = (type(None), bool, int, float, bytes, bytearray, memoryview)


def _children(obj: Any, heavy: ModuleType | None) -> list[tuple[str, Any]] | None:
    """How the path finder descends into ``obj``: (path suffix, child) pairs, or None."""
    kind = type(obj)
    if kind is list or kind is tuple:
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    if kind is dict or kind is OrderedDict:
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if heavy is not None:
        found: list[tuple[str, Any]] | None = heavy.children(obj)
        if found is not None:
            return found
    ext = _EXT_BY_TYPE.get(kind)
    if ext is not None:
        return [("", ext[1](obj))]
    foreign = FOREIGN.get(_qualified(kind))
    if foreign is not None:
        state = foreign[1](obj)
        return [(f".{k}", v) for k, v in state.items()] if type(state) is dict else [("", state)]
    return None


def decode(
    frames: Sequence[Any],
    *,
    allow_pickle: bool = False,
    device: str | int | torch.device | None = None,
    max_header: int = MAX_HEADER,
) -> Any:
    """Rebuild the value that :func:`encode` turned into ``frames``.

    Frames may be bytes, bytearray, memoryview, ``zmq.Frame`` or anything with the buffer
    protocol; tensors are backed by them (decode takes ownership). ``device``: where tensors
    that were on CUDA land (see ``transport._cuda``; ``"origin"``: on the device each was
    sent from, for a copy made in one process); CPU tensors stay on the CPU. Raises
    ProtocolError for anything malformed (LimitError for a header over ``max_header`` bytes),
    including a pickled value when ``allow_pickle`` is false; ValueError for a bad ``device``.
    """
    keep_origin = device == "origin"
    target = (
        None
        if device is None or device == "keep" or keep_origin
        else _load_heavy().parse_device(device)
    )
    if not frames:
        raise ProtocolError("empty message")
    header = frames[0]
    try:
        size = memoryview(header).nbytes
    except TypeError:
        raise ProtocolError("header frame is not a buffer") from None
    if size > max_header:
        raise LimitError(f"header of {size} bytes is over the limit of {max_header}")
    dec = Decoder(frames, allow_pickle, target, _EXT_BY_NAME)
    dec.keep_origin = keep_origin
    try:
        value = msgpack.unpackb(
            header, ext_hook=dec.ext_hook, list_hook=dec.list_hook, strict_map_key=False
        )
    except ProtocolError:
        raise
    except Exception as exc:
        raise ProtocolError(f"malformed message: {type(exc).__name__}: {exc}") from exc
    dec.check()
    return value
