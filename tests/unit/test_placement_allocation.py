"""The head's placement decision (``placement.allocation``): the NodeTable index gives the
answers of a full scan, and a decision's cost does not grow with the cluster."""

from __future__ import annotations

import random
from typing import Any

import pytest

from rayless.actors.control.head import Head
from rayless.placement import allocation
from rayless.placement.allocation import Allocation, NodeState, NodeTable, choose, release
from rayless.placement.errors import PlacementError, ResourcesBusyError


def node(i: int, gpus: int = 8, cpus: int = 8) -> NodeState:
    info = {"node_id": f"n-{i}", "cpus": cpus, "gpus": [{"index": g} for g in range(gpus)]}
    return NodeState.create(info, f"tcp://10.0.0.{i}:1", 0.0)


def outcome(nodes: dict[str, NodeState], *args: Any, **kwargs: Any) -> Any:
    try:
        return choose(nodes, *args, **kwargs)
    except (PlacementError, ValueError) as exc:
        return type(exc)


@pytest.mark.parametrize("seed", range(6))
def test_the_index_chooses_what_a_full_scan_chooses(seed: int) -> None:
    rng = random.Random(seed)
    shapes = [(rng.choice([0, 2, 4, 8]), rng.choice([1, 4, 8])) for _ in range(12)]
    plain = {f"n-{i}": node(i, g, c) for i, (g, c) in enumerate(shapes)}
    table = NodeTable({f"n-{i}": node(i, g, c) for i, (g, c) in enumerate(shapes)})
    held: list[Allocation] = []
    for step in range(600):
        roll = rng.random()
        if roll < 0.35 and held:
            alloc = held.pop(rng.randrange(len(held)))
            release(plain, alloc)
            release(table, alloc)
            continue
        if roll < 0.37:  # a node dies; later it may register again as a new record
            victim = f"n-{rng.randrange(len(shapes))}"
            plain[victim].alive = False
            table[victim].alive = False
            continue
        if roll < 0.39:
            i = rng.randrange(len(shapes))
            plain[f"n-{i}"] = node(i, *shapes[i])
            table[f"n-{i}"] = node(i, *shapes[i])
            continue
        gpus = rng.choice([0, 0, 0.25, 0.5, 1, 2, 3, 9])
        cpus = rng.choice([0, 1, 2, 9])
        target = f"n-{rng.randrange(len(shapes))}" if rng.random() < 0.1 else None
        a = outcome(plain, gpus, cpus, node=target)
        b = outcome(table, gpus, cpus, node=target)
        assert a == b, f"step {step}: scan chose {a}, index chose {b}"
        if isinstance(a, Allocation):
            held.append(a)


def test_a_decision_looks_at_a_few_nodes_whatever_the_cluster_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head = Head("t" * 32)  # the table the head keeps (its server is never started)
    for i in range(2000):
        head.state.nodes[f"n-{i}"] = node(i)
    calls = 0
    real = allocation._fit_gpus

    def counting(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args)

    monkeypatch.setattr(allocation, "_fit_gpus", counting)
    for _ in range(500):
        choose(head.state.nodes, 0.5, 1)
    assert calls <= 2 * 500, f"{calls} nodes examined for 500 decisions over 2000 nodes"


def test_dead_nodes_are_skipped_and_a_rejoined_node_is_placed_again() -> None:
    table = NodeTable({f"n-{i}": node(i, gpus=1) for i in range(3)})
    for i in range(3):
        table[f"n-{i}"].alive = False
    with pytest.raises(PlacementError, match="no live nodes"):
        choose(table, 1, 0)
    table["n-1"] = node(1, gpus=1)
    assert choose(table, 1, 0).node_id == "n-1"
    with pytest.raises(ResourcesBusyError):
        choose(table, 1, 0)


def test_the_index_stays_the_size_of_the_cluster() -> None:
    table = NodeTable({f"n-{i}": node(i) for i in range(50)})
    for _ in range(5000):
        release(table, choose(table, 0.5, 1))
    assert len(table._heap) <= 4 * len(table) + 64
