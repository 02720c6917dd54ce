"""Values of other libraries that the codec carries as extension records, without pickle.

* numpy *object* arrays (``dtype=object``): a record of their shape and their items in C
  order; every item is encoded as any other value (str, int, float, None, lists, dicts,
  tensors, arrays...), so an item the codec cannot encode is a TypeError naming its path
  (``obj.non_tensor_batch['uid'][3]: cannot encode Foo``). They arrive as object arrays of the
  same shape. The send half is in ``transport._heavy`` (numpy is loaded there).
* verl's ``DataProto`` (``verl.protocol.DataProto``), recognised by its class's module and
  qualified name, so that neither side imports verl to send one: its ``batch`` (a TensorDict
  or None), ``non_tensor_batch`` (a dict of numpy arrays, object arrays included) and
  ``meta_info`` (a dict). The receiver imports ``verl.protocol`` to rebuild it (a
  ProtocolError where verl is not installed).
* OmegaConf's ``DictConfig`` and ``ListConfig`` (verl hands its workers their ``config`` as
  one): the container (``OmegaConf.to_container``; a root config keeps its interpolations,
  a node inside one has them resolved, since the nodes they point at do not travel) and its
  struct and read-only flags. The receiver imports ``omegaconf``.
* ``argparse.Namespace`` (the ``args`` of OpenRLHF's and many trainers' actors) and
  ``types.SimpleNamespace``: their attributes, a dict with string keys whose values are
  encoded as any other value.

An extension record carries an extension name, never a module path: through one, a peer can
make a receiver import nothing but the modules named here (:data:`FOREIGN`,
:data:`LAZY_EXTENSIONS`, and numpy for an object array). A dataclass or Enum record
(``transport._objects``) names its class's module, imported as a spawn request's class is.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from rayless.transport.errors import ProtocolError

__all__ = ["FOREIGN", "LAZY_EXTENSIONS", "OBJECT_ARRAY", "object_array", "object_array_state"]

OBJECT_ARRAY = "numpy.object_array"
_MAX_DIMS = 64
_DATAPROTO_FIELDS = ("batch", "non_tensor_batch", "meta_info")


def object_array_state(a: Any) -> list[Any]:
    """The record state of the numpy object array ``a``: ``[shape, items in C order]``."""
    return [list(a.shape), list(a.ravel(order="C"))]


def object_array(state: Any) -> Any:
    """Rebuild an object array from :func:`object_array_state`'s state.

    Raises:
        ProtocolError: a malformed state (a bad shape, or not as many items as it needs).
    """
    if type(state) is not list or len(state) != 2 or type(state[1]) is not list:
        raise ProtocolError("bad numpy object array record")
    shape, items = state
    if type(shape) is not list or len(shape) > _MAX_DIMS:
        raise ProtocolError(f"bad object array shape {shape!r:.200}")
    if any(type(d) is not int or d < 0 for d in shape) or math.prod(shape) != len(items):
        raise ProtocolError(f"bad object array shape {shape!r:.200} for {len(items)} items")
    import numpy as np

    flat = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        flat[i] = item  # one by one: a list item must stay one item, not broadcast
    return flat.reshape(shape)


def _dataproto_state(dp: Any) -> dict[str, Any]:
    return {
        "batch": dp.batch,
        "non_tensor_batch": dict(dp.non_tensor_batch or {}),
        "meta_info": dict(dp.meta_info or {}),
    }


def _dataproto(state: Any) -> Any:
    if type(state) is not dict or set(state) != set(_DATAPROTO_FIELDS):
        raise ProtocolError("bad verl DataProto record")
    if type(state["non_tensor_batch"]) is not dict or type(state["meta_info"]) is not dict:
        raise ProtocolError("bad verl DataProto record")
    try:
        module = importlib.import_module("verl.protocol")
    except ImportError as exc:
        raise ProtocolError(
            f"a verl DataProto arrived, but verl.protocol cannot be imported here: {exc}"
        ) from None
    return module.DataProto(**state)


def _omegaconf_state(cfg: Any) -> list[Any]:
    """``[container, struct, readonly, allow_objects]``: a root config keeps its
    interpolations (``${a.b}``, resolved where it arrives), a node inside one has them
    resolved (the nodes they point at stay behind); ``allow_objects`` (values OmegaConf
    does not type, such as TransferQueue's sampler class) is kept."""
    OmegaConf = importlib.import_module("omegaconf").OmegaConf  # the sender's: it has one
    root = cfg._get_parent() is None
    container = OmegaConf.to_container(cfg, resolve=not root, throw_on_missing=False)
    objects = bool(cfg._get_flag("allow_objects"))
    return [container, bool(OmegaConf.is_struct(cfg)), bool(OmegaConf.is_readonly(cfg)), objects]


def _omegaconf(kind: type) -> Callable[[Any], Any]:
    def build(state: Any) -> Any:
        if type(state) is not list or len(state) not in (3, 4) or type(state[0]) is not kind:
            raise ProtocolError("bad OmegaConf record")
        flags = {"allow_objects": True} if len(state) == 4 and state[3] is True else None
        try:
            OmegaConf = importlib.import_module("omegaconf").OmegaConf
        except ImportError as exc:
            raise ProtocolError(
                f"an OmegaConf config arrived, but omegaconf cannot be imported here: {exc}"
            ) from None
        try:
            cfg = OmegaConf.create(state[0], flags=flags)
        except Exception as exc:  # omegaconf's own errors: a key or value it refuses
            raise ProtocolError(f"bad OmegaConf record: {exc}"[:300]) from None
        OmegaConf.set_struct(cfg, bool(state[1]))
        OmegaConf.set_readonly(cfg, bool(state[2]))
        return cfg

    return build


def _namespace_state(ns: Any) -> dict[str, Any]:
    return dict(vars(ns))


def _namespace(module: str, name: str) -> Callable[[Any], Any]:
    def build(state: Any) -> Any:
        if type(state) is not dict or any(type(k) is not str for k in state):
            raise ProtocolError(f"bad {module}.{name} record")
        return getattr(importlib.import_module(module), name)(**state)

    return build


# qualified class name -> (extension name, to_state, from_state); a receiver imports the
# module of a class only in its from_state, only modules named here
FOREIGN: dict[str, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {
    "verl.protocol.DataProto": ("verl.DataProto", _dataproto_state, _dataproto),
    "omegaconf.dictconfig.DictConfig": ("omegaconf.DictConfig", _omegaconf_state, _omegaconf(dict)),
    "omegaconf.listconfig.ListConfig": ("omegaconf.ListConfig", _omegaconf_state, _omegaconf(list)),
    "argparse.Namespace": (
        "argparse.Namespace",
        _namespace_state,
        _namespace("argparse", "Namespace"),
    ),
    "types.SimpleNamespace": (
        "types.SimpleNamespace",
        _namespace_state,
        _namespace("types", "SimpleNamespace"),
    ),
}

# extension names of rayless's own upper layers -> the module that registers them, imported
# by a receiver that meets one before it imported that module (a worker group passed to an
# actor whose code never imported rayless.single_controller, a ray.util.queue.Queue passed to
# a task, an actor handle passed to a process that imported only part of rayless.actors)
LAZY_EXTENSIONS: dict[str, str] = {
    "rayless.actor_handle": "rayless.actors.api.handle",
    "ctl.MethodInfo": "rayless.actors.protocol.messages",  # inside a handle: decoded first
    "rayless.stream": "rayless.actors.api.streams",
    **{
        f"rayless.single_controller.{name}": "rayless.single_controller"
        for name in ("function_ref", "role_spec", "worker_group")
    },
    "rayless.ray.queue": "rayless.ray.util.queue",
    "rayless.ray.actor_handle": "rayless.ray.actor",
    "rayless.ray.object_ref": "rayless.ray.object_ref",
    "rayless.ray.custom": "rayless.ray.util.serialization",
    "rayless.store.batch_meta": "rayless.store.data.meta",
    "rayless.store.kv_batch_meta": "rayless.store.data.kv_meta",
}
