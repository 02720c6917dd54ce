"""The typed messages between the store's client, controller and storage units.

Each is a frozen dataclass registered with the codec (``actors.protocol.wire.message``) under a
stable wire name (``store.<Name>``): a peer's value is checked field by field on decode, and a
malformed one is a ProtocolError naming the message and the field. The field schema
(:class:`~rayless.store.data.fields.FieldSchema`, ``store.FieldSchema``) is one too.

- :class:`UnitView`: a registered unit as the controller tells it (``register_unit``,
  ``units``), with its handle.
- :class:`LocalInfo`: where a unit runs and how its dense columns are shared (``local_info``).
- :class:`Reservation`, :class:`Slots`: a same-host put's reserved rows (``reserve``).
- :class:`Located`, :class:`Place`: where a same-host get's rows are (``locate``).
- :class:`ColumnPut`: a staged column-wise put (``begin_column_put``).
- :class:`WaitingFetch`: a fetch that waits, described (``waiting``).
- :class:`FetchMode`: whether a fetch consumes what it gets.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from rayless.actors.ext import message
from rayless.store.errors import StoreInputError

__all__ = [
    "ColumnPut",
    "FetchMode",
    "LocalInfo",
    "Located",
    "Place",
    "Reservation",
    "Slots",
    "UnitView",
    "WaitingFetch",
]


class FetchMode(str, enum.Enum):
    """What a fetch does to the samples it gets: ``FETCH`` marks them consumed by its task,
    ``PEEK`` does not. Equal to its string (``FetchMode.FETCH == "fetch"``)."""

    FETCH = "fetch"
    PEEK = "peek"

    @classmethod
    def of(cls, value: Any) -> FetchMode:
        """``value`` (a FetchMode or its string) as a FetchMode. Raises StoreInputError."""
        try:
            return cls(value)
        except (ValueError, TypeError):
            modes = tuple(m.value for m in cls)
            raise StoreInputError(f"mode must be one of {modes}, got {value!r}") from None


@message("store.UnitView")
@dataclass(frozen=True)
class UnitView:
    """A registered storage unit: id, shard number, node, device, byte capacity, liveness,
    and its actor handle (None until the store's creator recorded it)."""

    unit_id: str
    shard: int
    node_id: str | None = None
    device: str = "cpu"
    capacity_bytes: int | None = None
    alive: bool = True
    handle: Any = None  # an ActorHandle (the codec carries it as one)

    def as_dict(self) -> dict[str, Any]:
        """The unit as :attr:`Store.units <rayless.store.Store.units>` shows it: a dict of the
        fields above."""
        return {
            "unit_id": self.unit_id,
            "shard": self.shard,
            "node_id": self.node_id,
            "device": self.device,
            "capacity_bytes": self.capacity_bytes,
            "alive": self.alive,
            "handle": self.handle,
        }


@message("store.LocalInfo")
@dataclass(frozen=True)
class LocalInfo:
    """Where a unit runs (``host``: its host id) and how same-host clients reach its dense
    columns: ``shm`` (in shared memory), ``cuda_ipc`` (in GPU memory exported by CUDA IPC,
    on the GPU of ``gpu_uuid``)."""

    host: str
    shm: bool
    cuda_ipc: bool = False
    gpu_uuid: str | None = None


@message("store.Slots")
@dataclass(frozen=True)
class Slots:
    """One dense field's reserved rows on a unit: its column's ``segment`` (None: rows of zero
    bytes) of ``rows`` slots, the ``fence`` a writer must find in its header, the ``slots``
    (one per row), and for a CUDA column the IPC share the client opens (``ipc``; None when
    the client has opened it already, or for a CPU column)."""

    segment: str | None
    rows: int
    fence: int
    slots: list[int]
    ipc: list[Any] | None = None


@message("store.Reservation")
@dataclass(frozen=True)
class Reservation:
    """A same-host put's reserved rows: the ``token`` its commit or release names, and each
    dense field's :class:`Slots`."""

    token: str
    fields: dict[str, Slots]


@message("store.Place")
@dataclass(frozen=True)
class Place:
    """Where some of a get's rows of one dense field are: the column's ``segment`` (None: rows
    of zero bytes) of ``rows`` slots at ``generation``, their ``slots``, the per-sample
    ``shape`` of that column, the IPC share of a CUDA column (``ipc``, as in :class:`Slots`),
    and for a field whose rows sit in several column parts, ``at``: the positions (in the
    located indexes) of this part's rows. ``to``: the client's own note of where the rows go
    in the tensor it copies them into (None: the located order); never sent by a unit."""

    segment: str | None
    rows: int
    generation: int
    slots: list[int]
    shape: list[int]
    ipc: list[Any] | None = None
    at: list[int] | None = None
    to: list[int] | None = None


@message("store.Located")
@dataclass(frozen=True)
class Located:
    """A unit's answer to ``locate``: for each dense field, where its rows are (one
    :class:`Place` per column part holding some: one for a field of one shape); for each
    other field, its rows (one flat tensor of a ragged field, a list of a plain one)."""

    fields: dict[str, list[Place]]
    rest: dict[str, Any]


@message("store.ColumnPut")
@dataclass(frozen=True)
class ColumnPut:
    """A staged column-wise put: the ``put_id`` its writes carry and the rows it adds
    (``fresh``: ``{partition: {field: [indexes]}}``, for ``abort_fields`` if it fails)."""

    put_id: int
    fresh: dict[str, dict[str, list[int]]]


@message("store.WaitingFetch")
@dataclass(frozen=True)
class WaitingFetch:
    """A fetch that waits: its partition (whether it ``exists`` yet), ``fields`` (those not
    written yet: ``missing_fields``), ``task``, how many samples are ``ready`` of those
    ``asked`` (None: all), how long it ``waited_s``, and all that in a sentence (``text``)."""

    partition: str
    exists: bool
    fields: list[str]
    missing_fields: list[str]
    task: str
    ready: int
    asked: int | None
    waited_s: float
    text: str

    def as_dict(self) -> dict[str, Any]:
        """The fields above as a dict (the controller's metrics show it so)."""
        return {
            "partition": self.partition,
            "exists": self.exists,
            "fields": list(self.fields),
            "missing_fields": list(self.missing_fields),
            "task": self.task,
            "ready": self.ready,
            "asked": self.asked,
            "waited_s": self.waited_s,
            "text": self.text,
        }
