"""verl's ``Worker``: the base class of a worker group's actors.

A Worker knows its place in its group from the environment the group gives it (the
torch.distributed variables of ``spawn_group``): ``self.rank``, ``self.world_size``,
``self.local_rank``, MASTER_ADDR/MASTER_PORT, so ``torch.distributed.init_process_group()``
with the default ``env://`` works in its ``__init__`` or in a registered ``init_model``.
Built outside a group (a unit test) it is rank 0 of 1.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rayless.actors import Actor
from rayless.single_controller.decorator import Dispatch, Execute, register


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class Worker(Actor):
    """A rank of a worker group (subclass it; decorate group methods with ``@register``)."""

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        self._rank = _env_int("RANK", 0)
        self._world_size = _env_int("WORLD_SIZE", 1)
        self._local_rank = _env_int("LOCAL_RANK", 0)
        self._local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if cuda_visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices

    @property
    def rank(self) -> int:
        """This worker's rank in its group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of workers in its group."""
        return self._world_size

    @property
    def local_rank(self) -> int:
        """Its rank among the group's workers on this node."""
        return self._local_rank

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        """The group's MASTER_ADDR and MASTER_PORT (None outside a group)."""
        return os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")

    def get_cuda_visible_devices(self) -> str:
        """This process's CUDA_VISIBLE_DEVICES (``""``: no GPU)."""
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    def get_node_id(self) -> str:
        """The rayless node this worker runs on (``""`` outside a cluster)."""
        return os.environ.get("RAYLESS_NODE_ID", "")

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run a driver's function ``func(self, *chunks)`` on this rank's chunk."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a driver's function ``func(*args)`` on rank 0; its result."""
        return func(*args, **kwargs)
