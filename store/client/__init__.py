"""The store's client side: Store, its blocking face, the streaming loader and checkpoints."""

from typing import Any

# ``rayless.store.client`` was the module of the Store: its names still work from here, with
# a DeprecationWarning naming their place now.
_MOVED = {
    "Store": "rayless.store",
    "DEFAULT_NAME": "rayless.store",
    "PUT_TIMEOUT": "rayless.store.client.store",
    "KVBatchMeta": "rayless.store.client.store",
}


def __getattr__(name: str) -> Any:
    import importlib

    from rayless.store import moved

    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'rayless.store.client' has no attribute {name!r}")
    moved(f"rayless.store.client.{name}", f"{module}.{name}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # warned once (``from rayless.store.client import X`` looks twice)
    return value
