"""The few rayless internals the Ray layer needs, imported in this one place.

* ``home_loop``: the event loop sync calls of this process run on (a driver's sync facade, or
  an actor's own loop), where the Ray layer runs its work inside an actor.
* ``joined_address``: the cluster a driver already started or joined itself (``ray.init``
  joins it rather than starting a second one: a process belongs to one cluster).
* ``current_handle``: an actor process's own handle (``get_runtime_context().current_actor``).
* The environment variable names an actor process finds its id, node, node IP and GPUs in.
"""

from __future__ import annotations

from rayless.actors.ext import (
    ENV_ACTOR_ID,
    ENV_ACTOR_NAME,
    ENV_GPU_IDS,
    ENV_NODE_ID,
    ENV_NODE_IP,
    current_handle,
    home_loop,
    joined_address,
)

__all__ = [
    "ENV_ACTOR_ID",
    "ENV_ACTOR_NAME",
    "ENV_GPU_IDS",
    "ENV_NODE_ID",
    "ENV_NODE_IP",
    "current_handle",
    "home_loop",
    "joined_address",
]
