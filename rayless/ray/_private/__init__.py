"""``ray._private``: the few of Ray's private functions RL trainers call as if public
(verl's ``ResourcePoolManager`` checks GPUs with
``ray._private.state.available_resources_per_node()``)."""

from rayless.ray._private import state

__all__ = ["state"]
