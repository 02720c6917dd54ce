"""Collective groups of actors: ``init_collective_group`` in each member (or
``create_collective_group`` in the driver, the members joining at their first operation), then
``allreduce``, ``broadcast``, ``send``/``recv``... on torch tensors (numpy arrays too, in
place), as Ray's ``ray.util.collective``.

A group is a standalone torch.distributed process group (``ProcessGroupGloo`` for CPU tensors,
``ProcessGroupNCCL`` for CUDA ones): it never touches torch.distributed's default group, so a
member may also run its own ``init_process_group`` (DDP, FSDP). The members meet through a named
actor, ``info_<group>`` (as Ray's), which keeps the group's rendezvous keys
(``store.MeetingStore``: no ``TCPStore`` port is opened) and, for a group the driver declared,
which actor is which rank. Every wait is bounded by ``gloo_timeout`` (milliseconds; the NCCL
group's too).

Raises (as Ray's): RuntimeError for a call outside an actor or task, a group initialized twice
or not at all, an unavailable backend, a rank out of range, list operands of the wrong length.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from typing import Any

from rayless.ray import _internals
from rayless.ray.util.collective.types import Backend, ReduceOp

__all__ = [
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
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
]

_INFO = "info_"  # the meeting actor's name: info_<group> (Ray's)


class _CollectiveInfo:
    """The named actor through which a group's members meet: who is which rank (a group the
    driver declared) and the keys of the group's rendezvous (``store.MeetingStore``)."""

    def __init__(self) -> None:
        self.info: list[Any] | None = None
        self.keys: dict[str, bytes] = {}
        self.posted = asyncio.Event()  # replaced (and set) whenever a key changes

    async def set_info(
        self, actor_ids: list[str], world_size: int, ranks: list[int], backend: str, timeout: int
    ) -> None:
        self.info = [actor_ids, world_size, ranks, backend, timeout]

    async def get_info(self) -> list[Any] | None:
        return self.info

    def _changed(self) -> None:
        posted, self.posted = self.posted, asyncio.Event()
        posted.set()

    async def set_key(self, key: str, value: bytes) -> None:
        self.keys[key] = value
        self._changed()

    async def wait_keys(self, keys: list[str], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while missing := [k for k in keys if k not in self.keys]:
            left = deadline - loop.time()
            try:
                await asyncio.wait_for(self.posted.wait(), max(left, 0.0))
            except asyncio.TimeoutError:
                raise TimeoutError(
                    f"the group's rendezvous keys {missing} did not come within {timeout:g} s"
                ) from None

    async def get_key(self, key: str, timeout: float) -> bytes:
        await self.wait_keys([key], timeout)
        return self.keys[key]

    async def add_key(self, key: str, amount: int) -> int:
        total = int(self.keys.get(key, b"0")) + amount
        self.keys[key] = str(total).encode()
        self._changed()
        return total

    async def check_keys(self, keys: list[str]) -> bool:
        return all(k in self.keys for k in keys)

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.keys.get(key)
        if (current is None and expected == b"") or current == expected:
            self.keys[key] = desired
            self._changed()
            return desired
        return expected if current is None else current

    async def delete_key(self, key: str) -> bool:
        return self.keys.pop(key, None) is not None

    async def num_keys(self) -> int:
        return len(self.keys)


class _Group:
    """One member's side of a group: its rank, the group's size and process group."""

    def __init__(
        self, backend: str, world_size: int, rank: int, name: str, timeout_ms: int
    ) -> None:
        import torch.distributed as dist

        from rayless.ray.util.collective.store import MeetingStore

        self.backend, self.world_size, self.rank, self.name = backend, world_size, rank, name
        timeout = datetime.timedelta(milliseconds=timeout_ms)
        self.store = MeetingStore(_meeting_actor(name), timeout)
        if backend == Backend.NCCL:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg: Any = dist.ProcessGroupNCCL(self.store, rank, world_size, options)
        else:
            self.pg = dist.ProcessGroupGloo(self.store, rank, world_size, timeout)


_groups: dict[str, _Group] = {}
_lock = threading.Lock()


def nccl_available() -> bool:
    """Whether NCCL groups can be made here (CUDA and torch's NCCL)."""
    import torch
    import torch.distributed as dist

    return bool(torch.cuda.is_available() and dist.is_nccl_available())


def gloo_available() -> bool:
    """Whether gloo groups can be made here."""
    import torch.distributed as dist

    return bool(dist.is_gloo_available())


def _check_inside_actor() -> None:
    if not os.environ.get(_internals.ENV_ACTOR_ID):
        raise RuntimeError("The collective APIs shall be only used inside a Ray actor or task.")


def _check_backend(backend: str) -> str:
    name: str = Backend(backend)
    available = nccl_available() if name == Backend.NCCL else gloo_available()
    if not available:
        raise RuntimeError(f"Backend {name} is not available. Please check the installation.")
    return name


def _meeting_actor(group_name: str) -> Any:
    """The group's ``info_<group>`` actor: found, or started by the first member to ask."""
    from rayless import ray

    options = {"name": _INFO + group_name, "get_if_exists": True, "num_cpus": 0}
    return ray.remote(_CollectiveInfo).options(**options).remote()


def is_group_initialized(group_name: str) -> bool:
    """Whether this process is a member of ``group_name``."""
    with _lock:
        return group_name in _groups


def init_collective_group(
    world_size: int,
    rank: int,
    backend: str = Backend.NCCL,
    group_name: str = "default",
    gloo_timeout: int = 30000,
) -> None:
    """Join ``group_name`` as ``rank`` of ``world_size``; every member calls it (blocks until
    all have, at most ``gloo_timeout`` ms).

    Raises:
        RuntimeError: outside an actor or task, the group exists here already, the backend is
            not available, or the members did not all join in time.
        ValueError: an empty group name, ``world_size`` < 1 or ``rank`` out of range.
    """
    _check_inside_actor()
    if not group_name:
        raise ValueError(f"group_name '{group_name}' needs to be a string.")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a group of world_size {world_size}")
    name = _check_backend(backend)
    with _lock:
        if group_name in _groups:
            raise RuntimeError("Trying to initialize a group a second time.")
        _groups[group_name] = _join(name, world_size, rank, group_name, gloo_timeout)


def _join(backend: str, world_size: int, rank: int, group_name: str, timeout_ms: int) -> _Group:
    try:
        return _Group(backend, world_size, rank, group_name, timeout_ms)
    except Exception as exc:  # a store or process group that timed out, an unreachable peer
        raise RuntimeError(f"collective group '{group_name}' could not be formed: {exc}") from exc


def create_collective_group(
    actors: list[Any],
    world_size: int,
    ranks: list[int],
    backend: str = Backend.NCCL,
    group_name: str = "default",
    gloo_timeout: int = 30000,
) -> None:
    """Declare ``actors`` a group (from the driver): ``actors[i]`` is rank ``ranks[i]``. Each
    joins at its first collective call on ``group_name``.

    Raises:
        RuntimeError: the group was declared already, ranks and actors differ in number, the
            ranks are not 0..n-1, a bad world size, or an unavailable backend.
    """
    from rayless import ray

    name = _INFO + group_name
    try:
        ray.get_actor(name)
        raise RuntimeError("Trying to initialize a group twice.")
    except ValueError:
        pass
    if len(ranks) != len(actors):
        raise RuntimeError(
            f"Each actor should correspond to one rank. Got '{len(ranks)}' ranks but "
            f"'{len(actors)}' actors"
        )
    if set(ranks) != set(range(len(ranks))):
        raise RuntimeError(
            f"Ranks must be a permutation from 0 to '{len(ranks)}'. Got "
            f"'{''.join(str(r) for r in ranks)}'."
        )
    if world_size <= 0:
        raise RuntimeError(f"World size must be greater than zero. Got '{world_size}'.")
    if any(r >= world_size for r in ranks):
        raise RuntimeError("Ranks cannot be greater than world_size.")
    backend_name = _check_backend(backend)
    ids = [_actor_id(a) for a in actors]
    info = ray.remote(_CollectiveInfo).options(name=name, num_cpus=0).remote()
    ray.get(info.set_info.remote(ids, world_size, list(ranks), backend_name, gloo_timeout))


def _actor_id(actor: Any) -> str:
    """The rayless actor id of a Ray-style or rayless handle."""
    inner = getattr(actor, "_actor_id", None)
    if inner is not None:
        return str(inner.hex())
    return str(actor.actor_id)


def _group(group_name: str) -> _Group:
    """This process's member of ``group_name``; joined now if the driver declared it.

    Raises:
        RuntimeError: outside an actor or task, or the group is neither initialized here nor
            declared with this actor in it.
    """
    _check_inside_actor()
    with _lock:
        g = _groups.get(group_name)
        if g is not None:
            return g
        from rayless import ray

        try:
            info = ray.get(ray.get_actor(_INFO + group_name).get_info.remote())
        except ValueError:
            info = None
        me = os.environ.get(_internals.ENV_ACTOR_ID, "")
        if info is None or me not in info[0]:
            raise RuntimeError(
                f"The collective group '{group_name}' is not initialized in the process."
            )
        ids, world_size, ranks, backend, timeout_ms = info
        g = _groups[group_name] = _join(
            backend, world_size, ranks[ids.index(me)], group_name, timeout_ms
        )
        return g


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave ``group_name`` here (and end its meeting actor, as Ray does)."""
    from rayless import ray

    _check_inside_actor()
    with _lock:
        g = _groups.pop(group_name, None)
    if g is None:
        return
    del g
    try:
        ray.kill(ray.get_actor(_INFO + group_name))
    except ValueError:
        pass


def get_rank(group_name: str = "default") -> int:
    """This process's rank in ``group_name``; -1 if it is not a member."""
    _check_inside_actor()
    with _lock:
        g = _groups.get(group_name)
    return -1 if g is None else g.rank


def get_collective_group_size(group_name: str = "default") -> int:
    """The size of ``group_name``; -1 if this process is not a member."""
    _check_inside_actor()
    with _lock:
        g = _groups.get(group_name)
    return -1 if g is None else g.world_size


def _as_tensor(value: Any) -> Any:
    """A torch tensor sharing ``value``'s memory (a torch tensor, or a numpy array).

    Raises:
        RuntimeError: another type.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
        return torch.from_numpy(value)
    raise RuntimeError(
        f"Unrecognized tensor type '{type(value)}'. Supported types are: np.ndarray, torch.Tensor."
    )


def _reduce_op(op: ReduceOp) -> Any:
    import torch.distributed as dist

    return {
        ReduceOp.SUM: dist.ReduceOp.SUM,
        ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
        ReduceOp.MIN: dist.ReduceOp.MIN,
        ReduceOp.MAX: dist.ReduceOp.MAX,
    }[op]


def _check_rank(g: _Group, rank: int) -> None:
    if not 0 <= rank < g.world_size:
        raise ValueError(f"rank '{rank}' is greater than world size '{g.world_size}'")


def allreduce(tensor: Any, group_name: str = "default", op: ReduceOp = ReduceOp.SUM) -> None:
    """Combine ``tensor`` across the group with ``op``, in place on every member."""
    import torch.distributed as dist

    t = _as_tensor(tensor)
    g = _group(group_name)
    opts = dist.AllreduceOptions()
    opts.reduceOp = _reduce_op(op)
    g.pg.allreduce([t], opts).wait()


def barrier(group_name: str = "default") -> None:
    """Wait until every member of the group reached this call."""
    import torch.distributed as dist

    _group(group_name).pg.barrier(dist.BarrierOptions()).wait()


def reduce(
    tensor: Any, dst_rank: int = 0, group_name: str = "default", op: ReduceOp = ReduceOp.SUM
) -> None:
    """Combine ``tensor`` across the group into ``dst_rank``'s."""
    import torch.distributed as dist

    t = _as_tensor(tensor)
    g = _group(group_name)
    _check_rank(g, dst_rank)
    opts = dist.ReduceOptions()
    opts.reduceOp = _reduce_op(op)
    opts.rootRank = dst_rank
    opts.rootTensor = 0
    g.pg.reduce([t], opts).wait()


def broadcast(tensor: Any, src_rank: int = 0, group_name: str = "default") -> None:
    """Copy ``src_rank``'s ``tensor`` into every member's."""
    import torch.distributed as dist

    t = _as_tensor(tensor)
    g = _group(group_name)
    _check_rank(g, src_rank)
    opts = dist.BroadcastOptions()
    opts.rootRank = src_rank
    opts.rootTensor = 0
    g.pg.broadcast([t], opts).wait()


def _one_per_rank(tensors: list[Any], g: _Group, message: str) -> None:
    """Raise RuntimeError(``message``) unless ``tensors`` holds one tensor per rank of ``g``."""
    if len(tensors) != g.world_size:
        raise RuntimeError(message)


def allgather(tensor_list: list[Any], tensor: Any, group_name: str = "default") -> None:
    """Every member's ``tensor`` into ``tensor_list`` (one per rank), on every member.

    Raises:
        RuntimeError: ``tensor_list`` does not hold one tensor per rank.
    """
    t = _as_tensor(tensor)
    outs = [_as_tensor(x) for x in tensor_list]
    g = _group(group_name)
    _one_per_rank(
        outs, g, "The length of the tensor list operands to allgather must be equal to world_size."
    )
    g.pg.allgather([outs], [t]).wait()


def reducescatter(
    tensor: Any, tensor_list: list[Any], group_name: str = "default", op: ReduceOp = ReduceOp.SUM
) -> None:
    """Combine ``tensor_list`` across the group with ``op``; rank r gets element r in
    ``tensor``.

    Raises:
        RuntimeError: ``tensor_list`` does not hold one tensor per rank.
    """
    import torch.distributed as dist

    t = _as_tensor(tensor)
    ins = [_as_tensor(x) for x in tensor_list]
    g = _group(group_name)
    _one_per_rank(
        ins,
        g,
        "The length of the tensor list operands to reducescatter must not be equal to "
        "world_size.",  # (Ray's words)
    )
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = _reduce_op(op)
    g.pg.reduce_scatter([t], [ins], opts).wait()


def _to_peer(tensor: Any, peer: int, group_name: str) -> tuple[Any, _Group]:
    """``tensor`` as a torch tensor and the group, for a point-to-point call with ``peer``.

    Raises:
        RuntimeError: ``peer`` is this member. ValueError: it is not a rank of the group.
    """
    t = _as_tensor(tensor)
    g = _group(group_name)
    _check_rank(g, peer)
    if peer == g.rank:
        raise RuntimeError(f"The destination rank '{peer}' is self.")
    return t, g


def send(tensor: Any, dst_rank: int, group_name: str = "default") -> None:
    """Send ``tensor`` to ``dst_rank`` (which calls :func:`recv`).

    Raises:
        RuntimeError: ``dst_rank`` is this member.
    """
    t, g = _to_peer(tensor, dst_rank, group_name)
    g.pg.send([t], dst_rank, 0).wait()


def recv(tensor: Any, src_rank: int, group_name: str = "default") -> None:
    """Receive into ``tensor`` what ``src_rank`` sends.

    Raises:
        RuntimeError: ``src_rank`` is this member.
    """
    t, g = _to_peer(tensor, src_rank, group_name)
    g.pg.recv([t], src_rank, 0).wait()
