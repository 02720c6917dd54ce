"""verl's ``@register``: how a worker method's call is split over the ranks and collected.

A method decorated with ``@register(dispatch_mode=..., execute_mode=..., blocking=...)`` is a
*group method*: ``worker_group.method(*args)`` runs the mode's ``dispatch_fn(wg, *args,
**kwargs)`` on the controller (it returns per-rank argument lists, or arguments every rank gets
as they are), calls the ranks (all of them, or rank 0 for ``Execute.RANK_ZERO``), and runs the
mode's ``collect_fn(wg, outputs)`` over the results in rank order.

The modes are verl's: ``RANK_ZERO`` (rank 0 runs it, its result is the result),
``ONE_TO_ALL`` (every rank gets the same arguments; a list of results), ``ALL_TO_ALL`` (the
arguments go as given: lists of one item per rank are split, anything else is broadcast),
``DP_COMPUTE`` (every argument is a list of one item per rank), ``DP_COMPUTE_PROTO`` (every
argument is a batch — a TensorDict, or a verl DataProto-shaped object with ``chunk`` and a
``concat`` — split into one equal chunk per rank; the results are concatenated),
``DP_COMPUTE_PROTO_WITH_FUNC`` (the same, after a first argument every rank gets) and
``DP_COMPUTE_METRIC`` (split as DP_COMPUTE_PROTO, results as a list). A batch that does not
split evenly raises ValueError naming its size and the ranks, unless padding is on: for a
DataProto whose ``is_padding_enabled()`` is true (verl's auto padding), or for any batch with
``register(..., auto_padding=True)``; the batch is then padded with its first rows and the
padded rows are removed from the collected result. A dict ``{"dispatch_fn": f, "collect_fn":
g}`` is a custom mode; :func:`register_dispatch_mode` names one.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Union

from rayless.actors.ext import dumps_by_value, loads_by_value
from rayless.transport import register_extension
from rayless.transport.errors import ProtocolError

if TYPE_CHECKING:
    from rayless.single_controller.worker_group import WorkerGroup

# verl's attribute name, so that a verl tool that looks for it finds it
MAGIC_ATTR = "attrs_3141562937"
# the key a dispatch function sets in the kwargs it returns to say how many rows it padded
PADDING_SIZE_KEY = "_padding_size_key_x123d"


class _Mode:
    """A named member of :class:`Dispatch` or :class:`Execute` (verl's DynamicEnum)."""

    __slots__ = ("name", "value")
    _registry: ClassVar[dict[str, Any]]

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (getattr, (type(self), self.name))

    @classmethod
    def _add(cls, name: str) -> Any:
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"a mode name must be a public identifier, got {name!r}")
        if name in cls._registry:
            return cls._registry[name]
        member = cls(name, len(cls._registry))
        cls._registry[name] = member
        setattr(cls, name, member)
        return member

    @classmethod
    def members(cls) -> list[Any]:
        """Every member, in the order they were added."""
        return list(cls._registry.values())


class Dispatch(_Mode):
    """How a group method's arguments are split over the ranks (verl's names)."""

    _registry: ClassVar[dict[str, Any]] = {}
    RANK_ZERO: ClassVar[Dispatch]
    ONE_TO_ALL: ClassVar[Dispatch]
    ALL_TO_ALL: ClassVar[Dispatch]
    DP_COMPUTE: ClassVar[Dispatch]
    DP_COMPUTE_PROTO: ClassVar[Dispatch]
    DP_COMPUTE_PROTO_WITH_FUNC: ClassVar[Dispatch]
    DP_COMPUTE_METRIC: ClassVar[Dispatch]

    @classmethod
    def register(cls, name: str) -> Dispatch:
        """The member called ``name``, added if new (verl's ``Dispatch.register``).

        Raises:
            ValueError: ``name`` is not a public identifier.
        """
        member: Dispatch = cls._add(name)
        return member


class Execute(_Mode):
    """Which ranks run a group method: ``ALL`` or ``RANK_ZERO``."""

    _registry: ClassVar[dict[str, Any]] = {}
    ALL: ClassVar[Execute]
    RANK_ZERO: ClassVar[Execute]


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
):
    Dispatch._add(_name)
Execute._add("ALL")
Execute._add("RANK_ZERO")

DispatchFn = Callable[..., tuple[Sequence[Any], dict[str, Any]]]
CollectFn = Callable[[Any, Any], Any]
DispatchMode = Union[Dispatch, dict[str, Callable[..., Any]]]


@dataclass(frozen=True)
class MethodAttrs:
    """What ``@register`` recorded on a method."""

    dispatch_mode: DispatchMode
    execute_mode: Execute
    blocking: bool
    auto_padding: bool = False


# ----------------------------------------------------------------- splitting and joining


def batch_len(value: Any) -> int:
    """The number of rows of a batch (a TensorDict's first batch dimension, or ``len``).

    Raises:
        TypeError: ``value`` is not a batch.
    """
    batch_size = getattr(value, "batch_size", None)
    if batch_size is not None and not callable(batch_size):
        if len(batch_size) == 0:
            raise TypeError(f"a {type(value).__name__} with an empty batch_size cannot be split")
        return int(batch_size[0])
    if not hasattr(value, "chunk"):
        raise TypeError(
            f"DP_COMPUTE_PROTO splits TensorDicts or DataProto-like batches (with chunk and "
            f"concat); got {type(value).__name__}"
        )
    return len(value)


def _chunk(value: Any, n: int) -> list[Any]:
    if getattr(value, "batch_size", None) is not None and hasattr(value, "split"):
        size = batch_len(value) // n
        return list(value.split(size, dim=0)) if size else [value[0:0] for _ in range(n)]
    return list(value.chunk(n))  # DataProto.chunk(chunks), BatchMeta.chunk(n)


def _pad(value: Any, padding: int) -> Any:
    """``value`` with its first ``padding`` rows appended again (cycling a short batch)."""
    if hasattr(value, "padding") and callable(value.padding):  # verl's DataProto, in place
        value.padding(padding_size=padding)
        return value
    n = batch_len(value)
    if n == 0:
        raise ValueError("an empty batch cannot be padded")
    import torch

    index = torch.arange(padding) % n
    return concat([value, value[index]])


def _padding_wanted(value: Any, auto_padding: bool) -> bool:
    enabled = getattr(value, "is_padding_enabled", None)
    return auto_padding or (callable(enabled) and bool(enabled()))


def split_batches(
    chunks: int,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    auto_padding: bool = False,
    what: str = "DP_COMPUTE_PROTO",
) -> tuple[list[list[Any]], dict[str, Any]]:
    """Split every batch in ``args``/``kwargs`` into ``chunks`` equal parts (one per rank).

    Returns per-rank lists; with padding, ``kwargs`` also holds ``PADDING_SIZE_KEY``.

    Raises:
        ValueError: batches of different sizes, or a size that ``chunks`` does not divide
            while padding is off (naming the size and the ranks).
        TypeError: an argument is not a batch.
    """
    items = [(f"argument {i}", v) for i, v in enumerate(args)]
    items += [(f"argument {k!r}", v) for k, v in kwargs.items()]
    sizes = {name: batch_len(v) for name, v in items}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in sizes.items())
        raise ValueError(f"{what} needs batches of one size, got {listed}")
    padding = 0
    values = dict(items)
    if items:
        n = next(iter(sizes.values()))
        if n % chunks:
            if not any(_padding_wanted(v, auto_padding) for v in values.values()):
                raise ValueError(
                    f"{what}: a batch of {n} rows does not split evenly over {chunks} ranks "
                    f"({n} % {chunks} = {n % chunks}); pass a multiple of {chunks}, or turn "
                    "padding on (register(..., auto_padding=True), or a DataProto with "
                    "padding enabled)"
                )
            padding = chunks - n % chunks
            values = {k: _pad(v, padding) for k, v in values.items()}
    out_args = [_chunk(values[f"argument {i}"], chunks) for i in range(len(args))]
    out_kwargs: dict[str, Any] = {k: _chunk(values[f"argument {k!r}"], chunks) for k in kwargs}
    if padding:
        out_kwargs[PADDING_SIZE_KEY] = padding
    return out_args, out_kwargs


def concat(outputs: Sequence[Any]) -> Any:
    """Join per-rank batches along rows: ``type.concat`` (DataProto) or ``torch.cat``.

    Raises:
        TypeError: the outputs are not all of one batch type.
    """
    if not outputs:
        raise TypeError("nothing to concatenate")
    first = type(outputs[0])
    if any(type(o) is not first for o in outputs):
        kinds = sorted({type(o).__name__ for o in outputs})
        raise TypeError(f"per-rank outputs must be of one type to be concatenated, got {kinds}")
    join = getattr(first, "concat", None)
    if callable(join):
        return join(list(outputs))
    if getattr(outputs[0], "batch_size", None) is not None:
        import torch

        return torch.cat(list(outputs), dim=0)
    raise TypeError(
        f"DP_COMPUTE_PROTO concatenates TensorDicts or DataProto-like batches; a rank "
        f"returned {first.__name__}"
    )


def trim(output: Any, padding: int) -> Any:
    """``output`` without its last ``padding`` rows (the rows padding added)."""
    if padding <= 0:
        return output
    select = getattr(output, "select_idxs", None)
    if callable(select):
        return select(list(range(len(output) - padding)))
    if isinstance(output, list):
        return output[:-padding]
    return output[: batch_len(output) - padding]


# ----------------------------------------------------------- the dispatch/collect functions


def _check_per_rank(wg: WorkerGroup, value: Any, what: str, mode: str) -> None:
    if not isinstance(value, (list, tuple)) or len(value) != wg.world_size:
        got = f"a {type(value).__name__}"
        if isinstance(value, (list, tuple)):
            got += f" of {len(value)}"
        raise ValueError(
            f"{mode} needs every argument to be a list of one item per rank "
            f"({wg.world_size}); {what} is {got}"
        )


def dispatch_one_to_all(wg: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Every rank gets the same arguments."""
    n = wg.world_size
    return [[a] * n for a in args], {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(wg: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The arguments go as given."""
    return args, kwargs


def collect_all_to_all(wg: WorkerGroup, output: Any) -> Any:
    """The outputs as they came (a list in rank order)."""
    return output


def collect_rank_zero(wg: WorkerGroup, output: Any) -> Any:
    """Rank 0's output (from a list of outputs, or the one output)."""
    return output[0] if isinstance(output, list) else output


def dispatch_dp_compute(wg: WorkerGroup, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """Every argument is already a list of one item per rank.

    Raises:
        ValueError: an argument is not such a list.
    """
    for i, a in enumerate(args):
        _check_per_rank(wg, a, f"argument {i}", "DP_COMPUTE")
    for k, v in kwargs.items():
        _check_per_rank(wg, v, f"argument {k!r}", "DP_COMPUTE")
    return args, kwargs


def collect_dp_compute(wg: WorkerGroup, output: Any) -> Any:
    """One output per rank, as a list.

    Raises:
        ValueError: not one output per rank.
    """
    if len(output) != wg.world_size:
        raise ValueError(f"expected {wg.world_size} outputs, got {len(output)}")
    return output


def dispatch_dp_compute_data_proto(
    wg: WorkerGroup, *args: Any, auto_padding: bool = False, **kwargs: Any
) -> tuple[Any, Any]:
    """Split every batch argument into one equal chunk per rank (see :func:`split_batches`)."""
    return split_batches(wg.world_size, args, kwargs, auto_padding=auto_padding)


def dispatch_dp_compute_data_proto_with_func(
    wg: WorkerGroup, *args: Any, auto_padding: bool = False, **kwargs: Any
) -> tuple[Any, Any]:
    """The first argument (a function) goes to every rank; the batches after it are split.

    Raises:
        TypeError: the first argument is not a function.
    """
    if not args or not (inspect.isfunction(args[0]) or isinstance(args[0], functools.partial)):
        raise TypeError("DP_COMPUTE_PROTO_WITH_FUNC needs a function as its first argument")
    split_args, split_kwargs = split_batches(
        wg.world_size, args[1:], kwargs, auto_padding=auto_padding, what="DP_COMPUTE_PROTO"
    )
    return [[FunctionRef.of(args[0])] * wg.world_size, *split_args], split_kwargs


def collect_dp_compute_data_proto(wg: WorkerGroup, output: Any) -> Any:
    """The per-rank batches concatenated in rank order."""
    return concat(collect_dp_compute(wg, output))


_REGISTRY: dict[Dispatch, dict[str, Callable[..., Any]]] = {
    Dispatch.RANK_ZERO: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_rank_zero},
    Dispatch.ONE_TO_ALL: {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": dispatch_dp_compute, "collect_fn": collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {
        "dispatch_fn": dispatch_dp_compute_data_proto,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": dispatch_dp_compute_data_proto_with_func,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {
        "dispatch_fn": dispatch_dp_compute_data_proto,
        "collect_fn": collect_dp_compute,
    },
}
# the built-in modes whose dispatch takes ``auto_padding``
_PADDED = frozenset(
    {Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, Dispatch.DP_COMPUTE_METRIC}
)


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict[str, Callable[..., Any]]:
    """The ``{"dispatch_fn", "collect_fn"}`` of a named mode.

    Raises:
        KeyError: no functions are registered for it.
    """
    try:
        return _REGISTRY[dispatch_mode]
    except KeyError:
        raise KeyError(f"no dispatch functions registered for {dispatch_mode!r}") from None


def register_dispatch_mode(
    dispatch_mode_name: str, dispatch_fn: Callable[..., Any], collect_fn: Callable[..., Any]
) -> Dispatch:
    """Add a named dispatch mode (verl's ``register_dispatch_mode``); returns it.

    Raises:
        ValueError: the name is taken by a mode with functions already.
        TypeError: a function is not callable.
    """
    _check_fns(dispatch_fn, collect_fn)
    mode = Dispatch.register(dispatch_mode_name)
    if mode in _REGISTRY:
        raise ValueError(f"dispatch mode {dispatch_mode_name!r} already exists")
    _REGISTRY[mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return mode


def update_dispatch_mode(
    dispatch_mode: Dispatch, dispatch_fn: Callable[..., Any], collect_fn: Callable[..., Any]
) -> None:
    """Replace the functions of an existing mode (verl's ``update_dispatch_mode``).

    Raises:
        KeyError: the mode has no functions yet.
    """
    _check_fns(dispatch_fn, collect_fn)
    get_predefined_dispatch_fn(dispatch_mode)
    _REGISTRY[dispatch_mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def _check_fns(*fns: Any) -> None:
    for fn in fns:
        if not callable(fn):
            raise TypeError(f"dispatch and collect functions must be callable, got {fn!r}")


def check_dispatch_mode(dispatch_mode: Any) -> None:
    """Raises TypeError unless ``dispatch_mode`` is a Dispatch or a dict with callable
    ``dispatch_fn`` and ``collect_fn``."""
    if isinstance(dispatch_mode, Dispatch):
        return
    if isinstance(dispatch_mode, dict):
        missing = [k for k in ("dispatch_fn", "collect_fn") if k not in dispatch_mode]
        if missing:
            raise TypeError(f"a dict dispatch_mode needs the keys {missing}")
        _check_fns(dispatch_mode["dispatch_fn"], dispatch_mode["collect_fn"])
        return
    raise TypeError(f"dispatch_mode must be a Dispatch or a dict, got {dispatch_mode!r}")


def mode_functions(attrs: MethodAttrs) -> dict[str, Callable[..., Any]]:
    """The ``{"dispatch_fn", "collect_fn"}`` of a registered method's mode (padding not bound).

    Raises:
        KeyError: a named mode without functions in this process.
    """
    mode = attrs.dispatch_mode
    return mode if isinstance(mode, dict) else get_predefined_dispatch_fn(mode)


def resolve_mode(
    attrs: MethodAttrs, fns: dict[str, Callable[..., Any]] | None = None
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The (dispatch_fn, collect_fn) of a registered method (``fns``: its mode's functions,
    when they are not this process's own); padding bound in."""
    fns = fns if fns is not None else mode_functions(attrs)
    dispatch_fn = fns["dispatch_fn"]
    mode = attrs.dispatch_mode
    if isinstance(mode, Dispatch) and mode in _PADDED and attrs.auto_padding:
        dispatch_fn = functools.partial(dispatch_fn, auto_padding=True)
    return dispatch_fn, fns["collect_fn"]


# ------------------------------------------------------------------ functions as arguments


@dataclass(frozen=True)
class FunctionRef:
    """A driver's function as it travels to the workers, as code, never as data.

    A module-level function of an importable module travels by name (``module``,
    ``qualname``); any other (a lambda, a closure, a function defined inside a function or in
    the driver's ``__main__``, a ``functools.partial``) travels by value: ``pickled`` holds it
    pickled with cloudpickle (``actors.api.actor.dumps_by_value``). The codec never unpickles
    it: only :meth:`load` does, which a registered method's wrapper calls on the worker for
    its own top-level arguments (a group call's function argument, between authenticated
    peers; docs/security.md).
    """

    module: str
    qualname: str
    pickled: bytes | None = None

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> FunctionRef:
        """The reference of ``fn``: by name where the workers can import it, else by value.

        Raises:
            TypeError: ``fn`` is not callable, or (by value) cannot be pickled (a global it
                references cannot, say); the message names it.
        """
        if not callable(fn):
            raise TypeError(f"{fn!r} is not a function")
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", None)
        if importable(fn):
            return cls(str(module), str(qualname))
        name = qualname if isinstance(qualname, str) else type(fn).__qualname__
        try:
            pickled = dumps_by_value(fn)
        except TypeError as exc:
            raise TypeError(
                f"{name} cannot travel to the workers: it is not importable by name, and "
                f"pickling it by value failed ({exc.__cause__ or exc})"
            ) from None
        return cls(module if isinstance(module, str) else "", name, pickled)

    def load(self) -> Callable[..., Any]:
        """Import (by name) or unpickle (by value) the function.

        Raises:
            ImportError / AttributeError: it cannot be found here; TypeError: not callable;
            anything unpickling a by-value function raises.
        """
        obj: Any
        if self.pickled is not None:
            obj = loads_by_value(self.pickled)
        else:
            obj = importlib.import_module(self.module)
            for part in self.qualname.split("."):
                obj = getattr(obj, part)
        if not callable(obj):
            raise TypeError(f"{self.module}.{self.qualname} is not callable")
        fn: Callable[..., Any] = obj
        return fn


def importable(fn: Any) -> bool:
    """Whether ``fn`` is what its module and qualified name find (a module-level function of
    a module other than the driver's ``__main__``)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return False
    if module in ("__main__", "__mp_main__") or "<" in qualname:
        return False
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj is fn


def _ref_from_state(state: Any) -> FunctionRef:
    if not isinstance(state, (list, tuple)) or len(state) not in (2, 3):
        raise ProtocolError("bad function reference")
    pickled = state[2] if len(state) == 3 else None
    if not isinstance(pickled, (bytes, type(None))):
        raise ProtocolError("bad function reference")
    return FunctionRef(str(state[0]), str(state[1]), pickled)


register_extension(
    FunctionRef,
    "rayless.single_controller.function_ref",
    lambda ref: [ref.module, ref.qualname, ref.pickled],
    _ref_from_state,
)


def _materialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    if any(isinstance(a, FunctionRef) for a in args):
        args = tuple(a.load() if isinstance(a, FunctionRef) else a for a in args)
    if any(isinstance(v, FunctionRef) for v in kwargs.values()):
        kwargs = {k: v.load() if isinstance(v, FunctionRef) else v for k, v in kwargs.items()}
    return args, kwargs


def register(
    dispatch_mode: DispatchMode = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
    *,
    auto_padding: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Make a Worker method a group method (verl's ``register``).

    ``blocking=False``: the group call returns a future of the collected result instead of
    the result. ``auto_padding=True``: a DP_COMPUTE_PROTO batch that does not split evenly is
    padded (see the module docstring). ``materialize_futures`` is accepted for verl's
    signature; futures are always resolved before dispatch.

    Raises:
        TypeError: a malformed ``dispatch_mode`` or ``execute_mode``.
    """
    check_dispatch_mode(dispatch_mode)
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute, got {execute_mode!r}")
    attrs = MethodAttrs(dispatch_mode, execute_mode, bool(blocking), bool(auto_padding))

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_inner(*args: Any, **kwargs: Any) -> Any:
                args, kwargs = _materialize(args, kwargs)
                return await func(*args, **kwargs)

            wrapper = async_inner
        else:

            @functools.wraps(func)
            def inner(*args: Any, **kwargs: Any) -> Any:
                args, kwargs = _materialize(args, kwargs)
                return func(*args, **kwargs)

            wrapper = inner
        setattr(wrapper, MAGIC_ATTR, attrs)
        return wrapper

    return decorator


def method_attrs(cls: type) -> dict[str, MethodAttrs]:
    """The registered methods of ``cls``: name -> what ``@register`` recorded."""
    found: dict[str, MethodAttrs] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name, None)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        attrs = getattr(attr, MAGIC_ATTR, None)
        if isinstance(attrs, MethodAttrs):
            found[name] = attrs
    return found
