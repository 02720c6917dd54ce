"""Every public error of rayless, from every layer, in one place.

One root, :class:`RaylessError`; each layer defines its own children (transport:
``rayless.transport.errors``, placement: ``rayless.placement.errors``, actors:
``rayless.actors.errors``, store: ``rayless.store.errors``, weight sync:
``rayless.weights.errors``). This module only re-exports them and stays light: it imports the
error modules and nothing heavy (no torch, numpy, tensordict).

    RaylessError
    ├── TransportError: ClosedError, BrokenError, AuthError, ProtocolError (LimitError), Timeout
    ├── RemoteError                an exception raised inside an actor, with its traceback
    ├── PlacementError             a request no node, pool or plan can satisfy
    │   ├── InsufficientResourcesError (ValueError), ManualPoolError (ValueError)
    │   ├── EpisodeIndexError (IndexError), NodeAffinityError (RuntimeError, ValueError)
    │   ├── AllocationError (RuntimeError, ValueError) → NodeCapacityError
    │   └── ResourcesBusyError         feasible, but the GPUs are taken right now
    ├── ActorNotFoundError, NameTakenError, StartError, ConnectError, LaunchError, DebugBusyError,
    │   PackageError
    ├── BrokenError (a lost peer) → ActorDiedError (an actor is gone), ClusterLostError (the head)
    ├── StoreError: StoreInputError (SchemaError, Unknown*Error, StaleMetaError,
    │   ForeignMetaError, CheckpointError (CheckpointNotFoundError)), StoreFullError
    │   (WriteTooLargeError), StoreTimeoutError, UnitLostError (PartialResultError)
    └── WeightSyncError: WeightInputError (ValueError; WeightMismatchError, WeightVersionError),
        WeightChecksumError, WeightTimeoutError (TimeoutError), PublisherLostError
"""

from rayless.actors.errors import (
    ActorDiedError,
    ActorNotFoundError,
    ClusterLostError,
    ConnectError,
    DebugBusyError,
    LaunchError,
    NameTakenError,
    PackageError,
    StartError,
)
from rayless.placement.errors import (
    AllocationError,
    EpisodeIndexError,
    InsufficientResourcesError,
    ManualPoolError,
    NodeAffinityError,
    NodeCapacityError,
    PlacementError,
    ResourcesBusyError,
)
from rayless.store.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    ForeignMetaError,
    PartialResultError,
    SchemaError,
    StaleMetaError,
    StoreError,
    StoreFullError,
    StoreInputError,
    StoreTimeoutError,
    UnitLostError,
    UnknownFieldError,
    UnknownKeyError,
    UnknownPartitionError,
    WriteTooLargeError,
)
from rayless.transport.errors import (
    AuthError,
    BrokenError,
    ClosedError,
    LimitError,
    ProtocolError,
    RaylessError,
    RemoteError,
    Timeout,
    TransportError,
)
from rayless.weights.errors import (
    PublisherLostError,
    WeightChecksumError,
    WeightInputError,
    WeightMismatchError,
    WeightSyncError,
    WeightTimeoutError,
    WeightVersionError,
)

__all__ = [
    "ActorDiedError",
    "ActorNotFoundError",
    "AllocationError",
    "ClusterLostError",
    "EpisodeIndexError",
    "ManualPoolError",
    "NodeAffinityError",
    "NodeCapacityError",
    "AuthError",
    "BrokenError",
    "ClosedError",
    "ConnectError",
    "DebugBusyError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ForeignMetaError",
    "PartialResultError",
    "InsufficientResourcesError",
    "LaunchError",
    "LimitError",
    "NameTakenError",
    "PackageError",
    "PlacementError",
    "ResourcesBusyError",
    "ProtocolError",
    "RaylessError",
    "RemoteError",
    "SchemaError",
    "StaleMetaError",
    "StartError",
    "StoreError",
    "StoreFullError",
    "StoreInputError",
    "StoreTimeoutError",
    "Timeout",
    "TransportError",
    "UnitLostError",
    "PublisherLostError",
    "WeightChecksumError",
    "WeightInputError",
    "WeightMismatchError",
    "WeightSyncError",
    "WeightTimeoutError",
    "WeightVersionError",
    "UnknownFieldError",
    "UnknownKeyError",
    "UnknownPartitionError",
    "WriteTooLargeError",
]
