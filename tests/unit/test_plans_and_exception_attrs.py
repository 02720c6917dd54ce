"""Unknown plan components and remote exception attributes, without processes."""

from __future__ import annotations

import threading

import pytest

from rayless.actors.api.components import slots_of
from rayless.actors.api.remote_errors import materialize
from rayless.errors import PlacementError
from rayless.placement import ComponentScheduling, ResourcePoolPlanner, Scheduling
from rayless.transport import codec
from rayless.transport.errors import RemoteError


def _planner() -> ResourcePoolPlanner:
    info = {
        "n_nodes": 1,
        "node_id_to_resources": {
            "node-0": {"ip": "", "CPU": 8, "GPU": 4, "gpu_indices": [0, 1, 2, 3]}
        },
    }
    scheduling = ComponentScheduling(
        train_worker=Scheduling(worker_num=2, num_cpus=0.25, num_gpus=1),
        eval_worker=Scheduling(worker_num=1, num_cpus=0.25, num_gpus=1),
    )
    planner = ResourcePoolPlanner(scheduling, info)
    planner.plan_resource_pools("disaggregate")
    return planner


def test_an_unknown_component_lists_the_plans_components() -> None:
    planner = _planner()
    assert [s.worker_id for s in slots_of(planner, "train")] == [0, 1]
    with pytest.raises(PlacementError, match=r"component 'actor'; its components: 'eval', 'train'"):
        slots_of(planner, "actor")
    with pytest.raises(PlacementError, match=r"scheduling key 'train_worker' packs as 'train'"):
        slots_of(planner, "train_worker")


class ShapeError(ValueError):
    """An exception with attributes, as a user's code raises them."""


def test_exception_attributes_keep_tuples_and_name_what_was_not_sent() -> None:
    exc = ShapeError("bad shape", (3, 4))
    exc.shape = (3, 4)  # type: ignore[attr-defined]
    exc.nested = {"dims": (1, [2, (3,)])}  # type: ignore[attr-defined]
    exc.lock = threading.Lock()  # type: ignore[attr-defined]
    sent = RemoteError.from_exception(exc, "a")
    back = materialize(codec.decode(codec.encode(sent)))
    assert isinstance(back, ShapeError)
    assert back.args == ("bad shape", (3, 4))
    assert back.shape == (3, 4)  # type: ignore[attr-defined]
    assert back.nested == {"dims": (1, [2, (3,)])}  # type: ignore[attr-defined]
    assert not hasattr(back, "lock")
    assert "attribute 'lock' (lock) not sent" in str(back)
