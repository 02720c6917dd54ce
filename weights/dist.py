"""Weight sync over an existing torch.distributed group: buckets broadcast from one rank.

For trainers and rollout workers that already share a process group (``spawn_group(...,
torch_distributed=True)``): the publishing rank broadcasts a header (version and layout,
msgpack in a uint8 tensor; no pickle) and then every bucket (``async_op``: all in flight at
once); every other rank receives them and copies them into its tensors. A collective: each
member calls once per published version, in the same order. Gloo buckets live on the CPU,
NCCL buckets on the rank's current CUDA device.

Blocking (run it in a thread).
"""

from __future__ import annotations

from typing import Any

import msgpack
import torch

from rayless.transport.errors import ProtocolError
from rayless.weights.layout import Layout, bucket_sizes, rows_of, write_from

__all__ = ["receive", "send"]


def _device(group: Any) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_bytes(data: bytes | None, src: int, group: Any, device: torch.device) -> bytes:
    import torch.distributed as dist

    size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if data is not None:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buf, src, group=group)
    return bytes(buf.cpu().numpy().tobytes())


def send(
    tensors: dict[str, torch.Tensor], layout: Layout, version: int, src: int, group: Any
) -> None:
    """Broadcast ``version`` of ``tensors`` (placed by ``layout``) from this rank, ``src``."""
    import torch.distributed as dist

    device = _device(group)
    _broadcast_bytes(msgpack.packb([version, layout]), src, group, device)
    buckets = [torch.empty(n, dtype=torch.uint8, device=device) for n in bucket_sizes(layout)]
    write_from(tensors, layout, buckets)
    works = [dist.broadcast(b, src, group=group, async_op=True) for b in buckets]
    for work in works:
        work.wait()


def receive(src: int, group: Any) -> tuple[int, Layout, list[torch.Tensor]]:
    """Receive one broadcast from ``src``: its version, layout and buckets.

    Raises ProtocolError for a header that is not ``[version, layout]`` (rows checked).
    """
    import torch.distributed as dist

    device = _device(group)
    header = msgpack.unpackb(_broadcast_bytes(None, src, group, device))
    if not (isinstance(header, list) and len(header) == 2 and type(header[0]) is int):
        raise ProtocolError(f"malformed weight broadcast header {header!r:.80}")
    version, layout = header[0], rows_of(header[1])
    buckets = [torch.empty(n, dtype=torch.uint8, device=device) for n in bucket_sizes(layout)]
    works = [dist.broadcast(b, src, group=group, async_op=True) for b in buckets]
    for work in works:
        work.wait()
    return int(version), layout, buckets
