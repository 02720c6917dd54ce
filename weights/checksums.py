"""Per-tensor checksums of a published version: what ``pull(verify=True)`` checks.

A tensor's sum is the CRC-32 of its bytes where they lie in the buckets; a tensor bigger than
:data:`PIECE` is hashed in pieces of that size (in parallel: ``zlib.crc32`` releases the GIL)
and its sum is the CRC-32 of its pieces' sums (little-endian, in order). The publisher computes
the sums over the bytes it has just written into its segment; a reader recomputes them over the
bytes it is about to copy, under its lease, and a mismatch raises
:class:`~rayless.weights.errors.WeightChecksumError` naming the tensor before anything is copied.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from rayless.weights.errors import WeightChecksumError, WeightSyncError
from rayless.weights.layout import Layout, by_bytes, executor, row_bytes
from rayless.weights.messages import Entry

__all__ = ["PIECE", "sums_in", "sums_of", "verify"]

PIECE = 8 << 20  # a tensor bigger than this is hashed in pieces of this size, in parallel
_SMALL = 1 << 20  # below this many bytes the sums are computed in the calling thread


def _crc_all(views: Sequence[memoryview]) -> list[int]:
    return [zlib.crc32(v) for v in views]


def sums_of(views: Sequence[memoryview]) -> list[int]:
    """The sum of each byte range in ``views`` (one per tensor), as defined in the module doc."""
    pieces: list[memoryview] = []
    spans: list[tuple[int, int]] = []  # per view: its first piece and how many
    for v in views:
        n = v.nbytes
        count = max(1, -(-n // PIECE))
        spans.append((len(pieces), count))
        pieces.extend(v[i * PIECE : (i + 1) * PIECE] for i in range(count))
    total = sum(p.nbytes for p in pieces)
    if total < _SMALL or len(pieces) == 1:
        crcs = _crc_all(pieces)
    else:  # tasks of about PIECE bytes each (many small tensors share one)
        tasks = by_bytes(pieces, lambda p: p.nbytes, PIECE)
        crcs = [c for part in executor().map(_crc_all, tasks) for c in part]
    out = []
    for first, count in spans:
        if count == 1:
            out.append(crcs[first])
        else:
            joined = b"".join(c.to_bytes(4, "little") for c in crcs[first : first + count])
            out.append(zlib.crc32(joined))
    return out


def sums_in(layout: Layout, payload: memoryview, starts: Sequence[int]) -> list[int]:
    """The sum of every row of ``layout`` in ``payload`` (bucket ``b`` at ``starts[b]``)."""
    return sums_of([row_bytes(payload, row, starts[row[3]]) for row in layout])


def verify(entry: Entry, payload: memoryview) -> None:
    """Check every row of ``entry`` against its published sum, over its bytes in ``payload``.

    Raises WeightChecksumError naming the first tensor that differs, WeightSyncError when the
    entry carries no sums (published without checksums, or on a path that has none).
    """
    if len(entry.sums) != len(entry.layout):
        raise WeightSyncError(
            f"version {entry.version} was published without checksums ({entry.kind.value} "
            "path, or a client with checksums=False): it cannot be verified"
        )
    got = sums_in(entry.layout, payload, entry.starts)
    for row, want, have in zip(entry.layout, entry.sums, got, strict=True):
        if want != have:
            raise WeightChecksumError(row[0], entry.version)
