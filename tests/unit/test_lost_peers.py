"""One lost-peer family: an actor, a storage unit or a weight publisher that is gone is a
``BrokenError`` (trio's Broken, against Closed: our own side closed), so code that handles a
lost peer catches all three; each still travels the wire as itself."""

from __future__ import annotations

import pytest

from rayless.actors import ActorDiedError
from rayless.store.errors import StoreError, UnitLostError
from rayless.transport import codec
from rayless.transport.errors import BrokenError, ClosedError
from rayless.weights.errors import PublisherLostError, WeightSyncError

LOST = [
    (ActorDiedError("learner", pid=7, exitcode=-9), ActorDiedError),
    (UnitLostError("unit-0", "its node died"), StoreError),
    (PublisherLostError("the publisher died"), WeightSyncError),
]


@pytest.mark.parametrize(("error", "family"), LOST, ids=lambda e: type(e).__name__)
def test_a_lost_peer_is_a_broken_error_and_keeps_its_own_family(
    error: BaseException, family: type[BaseException]
) -> None:
    assert isinstance(error, BrokenError) and not isinstance(error, ClosedError)
    assert isinstance(error, family)


@pytest.mark.parametrize(("error", "family"), LOST, ids=lambda e: type(e).__name__)
def test_a_lost_peer_travels_the_wire_as_itself(
    error: BaseException, family: type[BaseException]
) -> None:
    back = codec.decode(codec.encode(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert isinstance(back, BrokenError) and isinstance(back, family)
    if isinstance(error, UnitLostError):
        assert isinstance(back, UnitLostError) and back.unit == "unit-0"
