"""TransferQueue's API on rayless: ``import rayless.transfer_queue as tq`` moves a program
written against ``import transfer_queue as tq`` (0.1.x) by changing one import. Its data
lives in a ``rayless.store`` Store on the ``rayless.ray`` session's cluster; no Ray and no
TransferQueue are installed or started.

    import rayless.transfer_queue as tq

    tq.init()  # the first process creates the store; every other one attaches
    meta = tq.kv_batch_put(keys=["a", "b"], partition_id="train", fields=td)
    td = tq.kv_batch_get(keys=["a", "b"], partition_id="train")
    tq.close()

What is supported, and every deliberate difference: docs/moving-from-transferqueue.md.
"""

from rayless.store import BatchMeta
from rayless.store import UnknownKeyError as StorageKeyNotFoundError
from rayless.store.data.kv_meta import KVBatchMeta
from rayless.transfer_queue.client import AsyncTransferQueueClient, TransferQueueClient
from rayless.transfer_queue.dataloader import StreamingDataLoader, StreamingDataset
from rayless.transfer_queue.interface import (
    async_kv_batch_get,
    async_kv_batch_get_by_meta,
    async_kv_batch_put,
    async_kv_clear,
    async_kv_list,
    async_kv_put,
    close,
    get_client,
    get_metrics_endpoint,
    init,
    kv_batch_get,
    kv_batch_get_by_meta,
    kv_batch_put,
    kv_clear,
    kv_list,
    kv_put,
    load_checkpoint,
    save_checkpoint,
)
from rayless.transfer_queue.samplers import (
    BaseSampler,
    GRPOGroupNSampler,
    RankAwareSampler,
    SeqlenBalancedSampler,
    SequentialSampler,
)

__all__ = [
    "AsyncTransferQueueClient",
    "BaseSampler",
    "BatchMeta",
    "GRPOGroupNSampler",
    "KVBatchMeta",
    "RankAwareSampler",
    "SeqlenBalancedSampler",
    "SequentialSampler",
    "StorageKeyNotFoundError",
    "StreamingDataLoader",
    "StreamingDataset",
    "TransferQueueClient",
    "async_kv_batch_get",
    "async_kv_batch_get_by_meta",
    "async_kv_batch_put",
    "async_kv_clear",
    "async_kv_list",
    "async_kv_put",
    "close",
    "get_client",
    "get_metrics_endpoint",
    "init",
    "kv_batch_get",
    "kv_batch_get_by_meta",
    "kv_batch_put",
    "kv_clear",
    "kv_list",
    "kv_put",
    "load_checkpoint",
    "save_checkpoint",
]
