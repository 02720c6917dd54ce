"""TransferQueue's ``transfer_queue.metadata`` path: its ``BatchMeta`` and ``KVBatchMeta``
are ``rayless.store``'s (``from rayless.transfer_queue.metadata import BatchMeta``)."""

from rayless.store import BatchMeta
from rayless.store.data.kv_meta import KVBatchMeta

__all__ = ["BatchMeta", "KVBatchMeta"]
