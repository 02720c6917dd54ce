"""LeaseTable: the allocations clients leased ahead of their next puts (store.client.leases).

Each is bound to the client's connection (``current_caller``) and named by the client's own
token, so a clear sent right behind the allocation (before its reply came back) can name it.
An entry goes when its put commits, when it is given back or renewed, or when its client's
connection goes (the controller then aborts what never committed).
"""

from __future__ import annotations

from rayless.store.data.meta import BatchMeta

__all__ = ["LeaseTable"]


class LeaseTable:
    """Leased allocations by (caller, token) and by allocation serial."""

    def __init__(self) -> None:
        self._by_caller: dict[str, dict[str, BatchMeta]] = {}
        self._owner: dict[int, tuple[str, str]] = {}  # serial -> (caller, token)

    def __len__(self) -> int:
        return len(self._owner)

    def serials(self) -> list[int]:
        """The serials of every leased allocation."""
        return list(self._owner)

    def add(self, caller: str, token: str, meta: BatchMeta) -> None:
        """Record ``meta`` (one allocation) as ``caller``'s lease ``token`` (replacing one
        of the same token)."""
        self.pop(caller, token)
        self._by_caller.setdefault(caller, {})[token] = meta
        self._owner[meta.generations[0]] = (caller, token)

    def get(self, caller: str, token: str) -> BatchMeta | None:
        """``caller``'s lease ``token``, None if there is none."""
        return self._by_caller.get(caller, {}).get(token)

    def pop(self, caller: str, token: str) -> BatchMeta | None:
        """Remove and return ``caller``'s lease ``token`` (None: none)."""
        held = self._by_caller.get(caller)
        meta = None if held is None else held.pop(token, None)
        if held is not None and not held:
            del self._by_caller[caller]
        if meta is not None:
            self._owner.pop(meta.generations[0], None)
        return meta

    def forget(self, serial: int) -> None:
        """Remove the lease of allocation ``serial`` (it committed or was given back)."""
        owner = self._owner.get(serial)
        if owner is not None:
            self.pop(*owner)

    def drop_caller(self, caller: str) -> list[BatchMeta]:
        """Remove and return every lease of ``caller`` (its connection is gone)."""
        held = self._by_caller.pop(caller, {})
        for meta in held.values():
            self._owner.pop(meta.generations[0], None)
        return list(held.values())
