"""``ray._private``: the few of Ray's private functions RL trainers call as if public
(verl's ``ResourcePoolManager`` checks GPUs with
``ray._private.state.available_resources_per_node()``; OpenRLHF takes its master address from
``ray._private.services.get_node_ip_address()``)."""

from rayless.ray._private import services, state

__all__ = ["services", "state"]
