"""The rendezvous store of a collective group: a ``torch.distributed.Store`` whose keys live in
the group's meeting actor (``info_<group>``), reached over rayless' authenticated calls.

torch's ``TCPStore`` would be a listener on the node's address that any process able to reach
it may read and write (and so point gloo's or NCCL's connections elsewhere); this store opens
no port. gloo's rendezvous asks it for ``set``/``get``/``wait`` only (a few keys per rank);
the rest of the interface is there for NCCL and torch's own helpers. Every wait is bounded by
the group's timeout.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

__all__ = ["MeetingStore"]

_MARGIN = 30.0  # seconds a call may take beyond the wait it asks the actor for


class MeetingStore(dist.Store):
    """The keys of a group's rendezvous, kept by its meeting actor ``info``."""

    def __init__(self, info: Any, timeout: datetime.timedelta) -> None:
        super().__init__()
        self._info = info
        self._wait = timeout.total_seconds()

    def _ask(self, ref: Any) -> Any:
        from rayless import ray

        return ray.get(ref, timeout=self._wait + _MARGIN)

    def set(self, key: str, value: Any) -> None:
        self._ask(self._info.set_key.remote(key, bytes(value)))

    def get(self, key: str) -> bytes:
        value: bytes = self._ask(self._info.get_key.remote(key, self._wait))
        return value

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        wait = self._wait if timeout is None else timeout.total_seconds()
        self._ask(self._info.wait_keys.remote(list(keys), wait))

    def add(self, key: str, amount: int) -> int:
        total: int = self._ask(self._info.add_key.remote(key, int(amount)))
        return total

    def check(self, keys: list[str]) -> bool:
        return bool(self._ask(self._info.check_keys.remote(list(keys))))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        value: bytes = self._ask(
            self._info.compare_set.remote(key, bytes(expected), bytes(desired))
        )
        return value

    def delete_key(self, key: str) -> bool:
        return bool(self._ask(self._info.delete_key.remote(key)))

    def num_keys(self) -> int:
        count: int = self._ask(self._info.num_keys.remote())
        return count
