"""Instances of importable dataclasses and Enums, and classes themselves, carried by their
class's name (no pickle).

A dataclass instance travels as ``[OBJECT marker, module, qualname, "d", {attribute: value}]``
(its ``__dict__``, as pickle takes it, or its fields where it has slots; each value encoded as
any other value: tensors, nested dataclasses...); an Enum member as ``[OBJECT marker, module,
qualname, "e", name]``; a class (``worker_cls=MyWorker``, a sampler class in a config) as
``[OBJECT marker, module, qualname, "c", None]``.
The receiver finds the class by its module and qualified name, importing the module if this
process has not yet (as a spawn request's class is imported: it runs no more code than a
token holder can run anyway), and rebuilds the instance without calling ``__init__`` (as
unpickling does): ``__new__``, then each field set with ``object.__setattr__`` (frozen and
slotted dataclasses included), or the member looked up by name, or the class itself.

A class of the sender's ``__main__`` (a script, ``python -c``, a notebook) or one defined
inside a function has no name another process can import. Its instances travel the same way,
with the class itself pickled by value (cloudpickle) as a sixth field:
``[OBJECT marker, module, qualname, tag, state, class]``. The class is code, as an actor class
of ``__main__`` in a spawn request is, and comes only from an authenticated peer; the
instance's fields stay data, encoded as any other value. Processes that run no user code (the
head, node agents) refuse such records (:func:`refuse_classes_by_value`): they unpickle
nothing. cloudpickle keeps one class per
process for one sender's class, so an instance sent back arrives as the sender's own class.
A class cloudpickle cannot pickle is a ``TypeError`` that says so. TensorDict's tensorclasses
(dataclasses that keep their fields in a TensorDict) are not carried this way.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import sys
import weakref
from typing import Any

from rayless.transport.errors import ProtocolError

__all__ = [
    "by_name",
    "classes_by_value_refused",
    "object_state",
    "rebuild",
    "refuse_classes_by_value",
]

DATACLASS, ENUM, CLASS = "d", "e", "c"
_CLASSES: dict[tuple[str, str], type] = {}  # (module, qualname) -> class, once found
_CACHED = 256  # classes by value kept pickled (sender) and unpickled (receiver), each side
_PICKLED: dict[type, bytes] = {}  # a class of __main__ or a function -> its pickle
_UNPICKLED: dict[bytes, type] = {}  # the reverse, at the receiver
_REFUSED = False  # this process decodes no class by value
# a class that arrived by value -> its pickle: cloudpickle gives it a name another process
# may import (a function's class loses "<locals>"), so it goes on travelling by value
_ARRIVED: weakref.WeakKeyDictionary[type, bytes] = weakref.WeakKeyDictionary()


def refuse_classes_by_value() -> None:
    """From now on, a record carrying its class by value is a ``ProtocolError`` in this
    process (the head and node agents: processes that run no user code)."""
    global _REFUSED
    _REFUSED = True


def classes_by_value_refused() -> bool:
    """Whether this process refuses code that arrives by value (:func:`refuse_classes_by_value`)."""
    return _REFUSED


def by_name(kind: type) -> bool:
    """Whether values of ``kind`` travel by their class's name (a dataclass or an Enum)."""
    if issubclass(kind, enum.Enum):
        return True
    return dataclasses.is_dataclass(kind) and not hasattr(kind, "_is_tensorclass")


def object_state(obj: Any) -> list[Any]:
    """The record of ``obj`` (a dataclass instance, an Enum member or a class) after its
    marker: ``[module, qualname, tag, state]``, and the class pickled by value after them
    where it has no importable name.

    Raises:
        TypeError: its class has no importable name and cannot be pickled by value.
    """
    kind = obj if isinstance(obj, type) else type(obj)
    module, qualname = kind.__module__, kind.__qualname__
    record: list[Any]
    if kind is obj:
        record = [module, qualname, CLASS, None]
    elif isinstance(obj, enum.Enum):
        record = [module, qualname, ENUM, obj.name]
    elif hasattr(obj, "__dict__"):  # as pickle: the attributes __post_init__ set travel too
        record = [module, qualname, DATACLASS, dict(vars(obj))]
    else:  # slots
        state = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        record = [module, qualname, DATACLASS, state]
    arrived = _ARRIVED.get(kind)
    if arrived is not None:  # sent back by value: the sender maps it to its own class
        record.append(arrived)
    elif module in _MAIN or "<locals>" in qualname:
        record.append(_by_value(kind))
    return record


_MAIN = ("__main__", "__mp_main__")


def _by_value(kind: type) -> bytes:
    """``kind`` pickled by value (cloudpickle), kept for the next instance.

    Raises:
        TypeError: cloudpickle cannot pickle it (a global it uses cannot be pickled).
    """
    pickled = _PICKLED.get(kind)
    if pickled is not None:
        return pickled
    import cloudpickle

    try:
        pickled = cloudpickle.dumps(kind)
    except Exception as exc:
        where = "the sender's __main__" if kind.__module__ in _MAIN else "a function"
        raise TypeError(
            f"cannot encode {kind.__qualname__}: a class defined in {where} travels by value, "
            f"and this one cannot be pickled ({type(exc).__name__}: {exc}); define it in a "
            "module"
        ) from None
    if len(_PICKLED) >= _CACHED:
        _PICKLED.pop(next(iter(_PICKLED)))
    _PICKLED[kind] = pickled
    return pickled


def rebuild(module: Any, qualname: Any, tag: Any, state: Any, pickled: Any = None) -> Any:
    """The instance :func:`object_state` described (its class ``pickled`` by value where
    the record carries it).

    Raises:
        ProtocolError: a malformed record, a module that cannot be imported here, a name
            that is not a dataclass or Enum of it, a class by value that cannot be loaded, a
            field of the class missing, or an Enum member it does not have.
    """
    if type(module) is not str or type(qualname) is not str or tag not in (DATACLASS, ENUM, CLASS):
        raise ProtocolError("bad object record")
    any_class = tag == CLASS
    if pickled is None:
        cls = _find(module, qualname, any_class)
    else:
        cls = _loaded(module, qualname, pickled, any_class)
    if any_class:
        if state is not None:
            raise ProtocolError(f"bad class record for {module}.{qualname}"[:200])
        return cls
    if tag == ENUM:
        if not issubclass(cls, enum.Enum) or type(state) is not str:
            raise ProtocolError(f"bad Enum record for {module}.{qualname}")
        try:
            return cls[state]
        except KeyError:
            raise ProtocolError(f"{module}.{qualname} has no member {state!r:.100}") from None
    if not by_name(cls) or issubclass(cls, enum.Enum) or type(state) is not dict:
        raise ProtocolError(f"bad dataclass record for {module}.{qualname}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if not all(type(k) is str and k.isidentifier() for k in state) or not names <= set(state):
        raise ProtocolError(
            f"{module}.{qualname} record has attributes {sorted(map(str, state))!r:.200}, "
            f"the class's fields are {sorted(names)!r:.200}"
        )
    obj = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, value)
    return obj


def _loaded(module: str, qualname: str, pickled: Any, any_class: bool = False) -> type:
    """The class a record carries by value (unpickled once per distinct pickle): a dataclass
    or Enum, or any class for a class record (``any_class``)."""
    if type(pickled) is not bytes:
        raise ProtocolError(f"bad class record for {module}.{qualname}"[:200])
    if _REFUSED:
        raise ProtocolError(
            f"a {qualname} arrived with its class by value, which this process (it runs no "
            "user code) does not load"[:300]
        )
    cls = _UNPICKLED.get(pickled)
    if cls is not None:
        return cls
    import cloudpickle

    try:
        found = cloudpickle.loads(pickled)
    except Exception as exc:  # a module it imports is missing here, a corrupt pickle
        raise ProtocolError(
            f"a {qualname} arrived with its class by value, which cannot be loaded here: "
            f"{type(exc).__name__}: {exc}"[:400]
        ) from None
    if not isinstance(found, type) or not (any_class or by_name(found)):
        raise ProtocolError(f"{module}.{qualname} by value is not a dataclass or Enum"[:200])
    if len(_UNPICKLED) >= _CACHED:
        _UNPICKLED.pop(next(iter(_UNPICKLED)))
    _UNPICKLED[pickled] = found
    _ARRIVED[found] = pickled
    return found


def _find(module: str, qualname: str, any_class: bool = False) -> type:
    """The class ``module.qualname`` (imported here if need be): a dataclass or Enum, or any
    class for a class record (``any_class``)."""
    cls = _CLASSES.get((module, qualname))
    if cls is not None and (any_class or by_name(cls)):
        return cls
    if "<locals>" in qualname or not all(p.isidentifier() for p in module.split(".")):
        raise ProtocolError(f"bad class name {module}.{qualname}"[:200])
    found: Any = sys.modules.get(module)
    if found is None:
        try:
            found = importlib.import_module(module)
        except Exception as exc:  # ImportError, or the module's own error at import
            raise ProtocolError(
                f"a {qualname} arrived, but its module {module} cannot be imported here: {exc}"
            ) from None
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not isinstance(found, type):
        raise ProtocolError(f"{module}.{qualname} is not a class here"[:200])
    if not (any_class or by_name(found)):
        raise ProtocolError(f"{module}.{qualname} is not a dataclass or Enum here"[:200])
    _CLASSES[(module, qualname)] = found
    return found
