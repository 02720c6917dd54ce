"""verl's fused workers: several roles (actor, critic, ...) in one process per rank.

``create_colocated_worker_cls({"actor": ClassWithInitArgs(A, ...), "critic": ...})`` gives a
``ClassWithInitArgs`` of :class:`FusedWorker`; a WorkerGroup of it starts one process per
bundle that builds every role's instance, and binds each role's group methods as
``{role}_{method}`` (verl's names). ``wg.spawn(prefix_set={"actor", "critic"})`` returns role
views whose methods are the role's own names; all views run in the same processes. A role
class of an importable module travels by name; one defined in the driver's ``__main__`` or
inside a function travels by value (cloudpickle, in the spawn request's ``RoleSpec``, the way
``spawn`` ships a class of ``__main__``).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from rayless.actors.ext import dumps_by_value, loads_by_value
from rayless.single_controller.worker import Worker
from rayless.single_controller.worker_group import ClassWithInitArgs
from rayless.transport import register_extension
from rayless.transport.errors import ProtocolError


@dataclass(frozen=True)
class RoleSpec:
    """One role of a fused worker as it travels: its key, its class (by name, or by value in
    ``pickled``), its constructor arguments."""

    key: str
    module: str
    qualname: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    pickled: bytes | None = None

    @classmethod
    def of(cls, key: str, cia: ClassWithInitArgs) -> RoleSpec:
        """The spec of role ``key``: its class by name where importable, else by value.

        Raises:
            TypeError: a class of ``__main__`` or of a function that cannot be pickled.
        """
        klass = cia.cls
        module, qualname = klass.__module__, klass.__qualname__
        pickled = None
        if module in ("__main__", "__mp_main__") or "<locals>" in qualname:
            try:
                pickled = dumps_by_value(klass)
            except TypeError as exc:
                raise TypeError(
                    f"role {key!r}: {qualname} is not importable and cannot be pickled by "
                    f"value to be fused ({exc.__cause__ or exc})"
                ) from None
        return cls(key, module, qualname, cia.args, cia.kwargs, pickled)

    def load(self) -> type:
        """Import (by name) or unpickle (by value) the role's class.

        Raises:
            ImportError / AttributeError: it cannot be found; TypeError: not a class.
        """
        obj: Any
        if self.pickled is not None:
            obj = loads_by_value(self.pickled)
        else:
            obj = importlib.import_module(self.module)
            for part in self.qualname.split("."):
                obj = getattr(obj, part)
        if not isinstance(obj, type):
            raise TypeError(f"{self.module}.{self.qualname} is not a class")
        return obj


def _spec_from_state(s: Any) -> RoleSpec:
    if not isinstance(s, list) or len(s) not in (5, 6):
        raise ProtocolError("bad fused role spec")
    pickled = s[5] if len(s) == 6 else None
    if not isinstance(pickled, (bytes, type(None))):
        raise ProtocolError("bad fused role spec")
    return RoleSpec(str(s[0]), str(s[1]), str(s[2]), tuple(s[3]), dict(s[4]), pickled)


register_extension(
    RoleSpec,
    "rayless.single_controller.role_spec",
    lambda r: [r.key, r.module, r.qualname, list(r.args), dict(r.kwargs), r.pickled],
    _spec_from_state,
)


class FusedWorker(Worker):
    """One process holding several roles; ``execute_role`` runs a role's method.

    Each role instance gets ``fused_worker_dict`` (every role by key), as in verl. Sync role
    methods run one at a time in a worker thread, async ones on the actor's loop.
    """

    def __init__(self, roles: list[RoleSpec]) -> None:
        super().__init__()
        self.fused_worker_dict: dict[str, Any] = {}
        for spec in roles:
            instance = spec.load()(*spec.args, **spec.kwargs)
            self.fused_worker_dict[spec.key] = instance
        for instance in self.fused_worker_dict.values():
            instance.fused_worker_dict = self.fused_worker_dict
        self._sync_lock = asyncio.Lock()

    async def execute_role(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``role``'s public ``method(*args, **kwargs)``; its result.

        Raises:
            KeyError: no such role; AttributeError: no such public method.
        """
        if role not in self.fused_worker_dict:
            raise KeyError(f"no role {role!r}; roles: {sorted(self.fused_worker_dict)}")
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is not a public method of role {role!r}")
        fn = getattr(self.fused_worker_dict[role], method)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        async with self._sync_lock:
            return await asyncio.to_thread(fn, *args, **kwargs)

    def roles(self) -> list[str]:
        """The role keys of this process."""
        return list(self.fused_worker_dict)


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> ClassWithInitArgs:
    """A ``ClassWithInitArgs`` of a FusedWorker holding every role of ``class_dict``.

    Raises:
        TypeError: a value is not a ClassWithInitArgs, or a role class that is not
            importable (defined in ``__main__`` or inside a function) cannot be pickled.
        ValueError: no roles, or a key that is not an identifier.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    specs = []
    raw: dict[str, type] = {}
    for key, cia in class_dict.items():
        if not isinstance(cia, ClassWithInitArgs):
            raise TypeError(f"role {key!r}: expected a ClassWithInitArgs, got {cia!r}")
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"role keys must be identifiers, got {key!r}")
        specs.append(RoleSpec.of(key, cia))
        raw[key] = cia.cls
    fused = ClassWithInitArgs(FusedWorker, specs)
    fused.fused_worker_used = True
    fused.raw_cls_dict = raw
    return fused
