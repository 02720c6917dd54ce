"""``ray._private.services``: ``get_node_ip_address()``, which OpenRLHF, slime and NeMo-RL
call as if public for the master address of the process groups they build."""

from __future__ import annotations

from rayless.ray._resources import node_ip

__all__ = ["get_node_ip_address"]


def get_node_ip_address(address: str = "8.8.8.8:53") -> str:
    """This node's IP address, as ``ray.util.get_node_ip_address()`` gives it (an actor's
    node, or 127.0.0.1 in a local driver). ``address`` is accepted for Ray's signature and not
    used (Ray routes a UDP socket towards it to pick an interface; rayless knows its node's)."""
    del address
    return node_ip()
