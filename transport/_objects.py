"""Instances of importable dataclasses and Enums, carried by their class's name (no pickle).

A dataclass instance travels as ``[OBJECT marker, module, qualname, "d", {attribute: value}]``
(its ``__dict__``, as pickle takes it, or its fields where it has slots; each value encoded as
any other value: tensors, nested dataclasses...); an Enum member as ``[OBJECT marker, module,
qualname, "e", name]``.
The receiver finds the class by its module and qualified name, importing the module if this
process has not yet (as a spawn request's class is imported: it runs no more code than a
token holder can run anyway), and rebuilds the instance without calling ``__init__`` (as
unpickling does): ``__new__``, then each field set with ``object.__setattr__`` (frozen and
slotted dataclasses included), or the member looked up by name.

A class of the sender's ``__main__`` or one defined inside a function has no name another
process can import: encoding one is a ``TypeError`` that says so. TensorDict's tensorclasses
(dataclasses that keep their fields in a TensorDict) are not carried this way.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import sys
from typing import Any

from rayless.transport.errors import ProtocolError

__all__ = ["by_name", "object_state", "rebuild"]

DATACLASS, ENUM = "d", "e"
_CLASSES: dict[tuple[str, str], type] = {}  # (module, qualname) -> class, once found


def by_name(kind: type) -> bool:
    """Whether values of ``kind`` travel by their class's name (a dataclass or an Enum)."""
    if issubclass(kind, enum.Enum):
        return True
    return dataclasses.is_dataclass(kind) and not hasattr(kind, "_is_tensorclass")


def object_state(obj: Any) -> list[Any]:
    """The record of ``obj`` after its marker: ``[module, qualname, tag, state]``.

    Raises:
        TypeError: its class has no importable name (``__main__``, or defined in a function).
    """
    kind = type(obj)
    module, qualname = kind.__module__, kind.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        where = "the sender's __main__" if module == "__main__" else "a function"
        raise TypeError(
            f"cannot encode {qualname}: a class defined in {where} has no name another "
            "process can import; define it in a module"
        )
    if isinstance(obj, enum.Enum):
        return [module, qualname, ENUM, obj.name]
    if hasattr(obj, "__dict__"):  # as pickle: the attributes __post_init__ set travel too
        state = dict(vars(obj))
    else:  # slots
        state = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return [module, qualname, DATACLASS, state]


def rebuild(module: Any, qualname: Any, tag: Any, state: Any) -> Any:
    """The instance :func:`object_state` described.

    Raises:
        ProtocolError: a malformed record, a module that cannot be imported here, a name
            that is not a dataclass or Enum of it, a field of the class missing, or an Enum
            member it does not have.
    """
    if type(module) is not str or type(qualname) is not str or tag not in (DATACLASS, ENUM):
        raise ProtocolError("bad object record")
    cls = _find(module, qualname)
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


def _find(module: str, qualname: str) -> type:
    cls = _CLASSES.get((module, qualname))
    if cls is not None:
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
    if not isinstance(found, type) or not by_name(found):
        raise ProtocolError(f"{module}.{qualname} is not a dataclass or Enum here"[:200])
    _CLASSES[(module, qualname)] = found
    return found
