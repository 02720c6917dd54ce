"""``ray.util.collective``: collective groups of actors (and tasks) over torch.distributed's
gloo (CPU tensors) and NCCL (CUDA tensors) backends, with Ray's functions, arguments and
errors (``from rayless.ray.util import collective`` or
``from rayless.ray.util.collective import collective``). See
``rayless.ray.util.collective.collective``."""

from __future__ import annotations

from rayless.ray.util.collective import collective, types
from rayless.ray.util.collective.collective import (
    allgather,
    allreduce,
    barrier,
    broadcast,
    create_collective_group,
    destroy_collective_group,
    get_collective_group_size,
    get_rank,
    gloo_available,
    init_collective_group,
    is_group_initialized,
    nccl_available,
    recv,
    reduce,
    reducescatter,
    send,
)

__all__ = [
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "collective",
    "create_collective_group",
    "destroy_collective_group",
    "get_collective_group_size",
    "get_rank",
    "gloo_available",
    "init_collective_group",
    "is_group_initialized",
    "nccl_available",
    "recv",
    "reduce",
    "reducescatter",
    "send",
    "types",
]
