"""Ray's placement groups, planned onto rayless placement.

``placement_group(bundles, strategy)`` plans each bundle onto a node and GPU indices at once
from the head's view of free GPUs (minus this driver's other groups): ``PACK`` fills as few
nodes as it can, ``STRICT_PACK`` needs one node for all, ``SPREAD`` puts each bundle on the
least used node, ``STRICT_SPREAD`` needs a node per bundle. An actor or task scheduled into
a bundle (``PlacementGroupSchedulingStrategy``) is spawned on that node with exactly the
bundle's GPUs (``gpu_indices``), so fractional-GPU actors of one bundle share its GPU.

Unlike Ray, a group that can never fit fails at once with ``PlacementError`` naming why (Ray
keeps it pending forever), and one whose GPUs are taken now fails with
``ResourcesBusyError``; GPUs are planned in this driver, not reserved at the head (another
driver's spawns may take them).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from rayless.errors import PlacementError, ResourcesBusyError
from rayless.ray import _worker
from rayless.ray.object_ref import ObjectRef, put_ref

__all__ = [
    "PlacementGroup",
    "get_current_placement_group",
    "placement_group",
    "placement_group_table",
    "remove_placement_group",
]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_EPS = 1e-9


@dataclass
class Bundle:
    """One planned bundle: its node, its GPUs (index → share), what its members use."""

    spec: dict[str, float]
    node_id: str
    gpus: dict[int, float]
    used: dict[int, float] = field(default_factory=dict)

    def take(self, gpus: float, index: int) -> tuple[int, ...]:
        """Reserve ``gpus`` of this bundle's GPUs for one member; their indices.

        Raises:
            PlacementError: the bundle has no room for it.
        """
        if gpus <= 0:
            return ()
        free = {i: cap - self.used.get(i, 0.0) for i, cap in self.gpus.items()}
        if gpus < 1:
            fits = [i for i, f in free.items() if f + _EPS >= gpus]
            chosen = [min(fits, key=lambda i: (free[i], i))] if fits else []
            share = gpus
        else:
            fits = [i for i, f in free.items() if f + _EPS >= 1.0]
            chosen = fits[: int(gpus)] if len(fits) >= int(gpus) else []
            share = 1.0
        if not chosen:
            raise PlacementError(
                f"bundle {index} ({self.spec}) has no room for num_gpus={gpus:g}: "
                f"{sum(free.values()):g} of its GPUs are left (Ray would wait forever)"
            )
        for i in chosen:
            self.used[i] = self.used.get(i, 0.0) + share
        return tuple(chosen)

    def give_back(self, gpus: float, indices: tuple[int, ...]) -> None:
        """Return what :meth:`take` reserved."""
        share = gpus if gpus < 1 else 1.0
        for i in indices:
            self.used[i] = max(0.0, self.used.get(i, 0.0) - share)


class PlacementGroupID:
    """The id of a placement group (``.hex()``)."""

    def __init__(self, value: str) -> None:
        self._value = value

    def hex(self) -> str:
        """The id as hex."""
        return self._value

    def __repr__(self) -> str:
        return f"PlacementGroupID({self._value})"


class PlacementGroup:
    """A planned set of bundles (``ray.util.placement_group``'s result)."""

    def __init__(self, bundles: list[Bundle], strategy: str, name: str, generation: int) -> None:
        self.bundles = bundles
        self.strategy = strategy
        self.name = name
        self.id = PlacementGroupID(uuid.uuid4().hex[:36])
        self.removed = False
        self.actors: list[Any] = []  # the rayless handles spawned into it
        self._generation = generation

    @property
    def bundle_specs(self) -> list[dict[str, float]]:
        """Each bundle's resources, as given."""
        return [dict(b.spec) for b in self.bundles]

    @property
    def bundle_count(self) -> int:
        """How many bundles."""
        return len(self.bundles)

    def ready(self) -> ObjectRef:
        """A ref that is ready at once (the group was planned when made); its value is the
        group."""
        return put_ref(self, self._generation)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """True: the group was planned when made (an unplaceable one raised then)."""
        return not self.removed

    def bundle(self, index: int) -> Bundle:
        """Bundle ``index``.

        Raises:
            ValueError: no such bundle, or the group was removed.
        """
        if self.removed:
            raise ValueError(f"placement group {self.name or self.id.hex()} was removed")
        if not -1 <= index < len(self.bundles):
            raise ValueError(
                f"placement_group_bundle_index {index} is out of range: the group has "
                f"{len(self.bundles)} bundles"
            )
        return self.bundles[index]

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id.hex()}, {self.strategy}, {self.bundle_specs})"


def _check_bundles(bundles: Any) -> list[dict[str, float]]:
    if not isinstance(bundles, list) or not bundles:
        raise ValueError("placement_group needs a non-empty list of bundles (dicts)")
    out = []
    for i, b in enumerate(bundles):
        if not isinstance(b, dict) or not b:
            raise ValueError(f"bundle {i} must be a non-empty dict of resources, got {b!r}")
        unknown = sorted(k for k in b if k not in ("CPU", "GPU", "memory"))
        if unknown:
            raise ValueError(
                f"bundle {i}: resources {unknown} are not supported by rayless.ray (only CPU, "
                "GPU and memory)"
            )
        if any(not isinstance(v, (int, float)) or v < 0 for v in b.values()):
            raise ValueError(f"bundle {i}: resource amounts must be numbers >= 0, got {b!r}")
        if all(v == 0 for v in b.values()):
            raise ValueError(f"bundle {i}: a bundle cannot be all zeros ({b!r})")
        gpus = float(b.get("GPU", 0))
        if gpus > 1 and gpus != int(gpus):
            raise ValueError(f"bundle {i}: GPU={gpus:g}: fractions only below one GPU")
        out.append({k: float(v) for k, v in b.items()})
    return out


def _fit(
    spec: dict[str, float], node: dict[str, Any], free: dict[int, float]
) -> dict[int, float] | None:
    """The GPUs (index → share) ``spec`` takes on ``node`` given ``free``, or None."""
    if spec.get("CPU", 0.0) > float(node.get("cpus", 0)) + _EPS:
        return None
    gpus = spec.get("GPU", 0.0)
    if gpus <= 0:
        return {}
    if gpus < 1:
        fits = [i for i, f in free.items() if f + _EPS >= gpus]
        return {min(fits, key=lambda i: (free[i], i)): gpus} if fits else None
    whole = [i for i, f in sorted(free.items()) if f + _EPS >= 1.0]
    return {i: 1.0 for i in whole[: int(gpus)]} if len(whole) >= int(gpus) else None


def plan(
    specs: list[dict[str, float]],
    strategy: str,
    nodes: list[dict[str, Any]],
    free: dict[str, dict[int, float]],
) -> list[tuple[str, dict[int, float]]] | None:
    """Each bundle's node and GPUs under ``strategy``, or None when they do not fit."""
    alive = [n for n in nodes if n.get("alive", True)]
    by_id = {n["node_id"]: n for n in alive}
    if strategy == "STRICT_PACK":
        for n in sorted(alive, key=lambda n: -sum(free[n["node_id"]].values())):
            left = dict(free[n["node_id"]])
            cpus = sum(s.get("CPU", 0.0) for s in specs)
            if cpus > float(n.get("cpus", 0)) + _EPS:
                continue
            out = []
            for s in specs:
                got = _fit(s, n, left)
                if got is None:
                    break
                for i, share in got.items():
                    left[i] -= share
                out.append((n["node_id"], got))
            else:
                return out
        return None
    left_by = {nid: dict(f) for nid, f in free.items()}
    count: dict[str, int] = {nid: 0 for nid in by_id}
    out = []
    for s in specs:
        if strategy in ("SPREAD", "STRICT_SPREAD"):
            order = sorted(by_id, key=lambda nid: (count[nid], -sum(left_by[nid].values()), nid))
            if strategy == "STRICT_SPREAD":
                order = [nid for nid in order if count[nid] == 0]
        else:  # PACK: the nodes already used first
            order = sorted(by_id, key=lambda nid: (-count[nid], -sum(left_by[nid].values()), nid))
        for nid in order:
            got = _fit(s, by_id[nid], left_by[nid])
            if got is not None:
                for i, share in got.items():
                    left_by[nid][i] -= share
                count[nid] += 1
                out.append((nid, got))
                break
        else:
            return None
    return out


def _free(nodes: list[dict[str, Any]], groups: list[PlacementGroup]) -> dict[str, dict[int, float]]:
    """Free GPU shares per node: the head's view less what other groups hold unused."""
    free = {
        n["node_id"]: {int(g["index"]): float(g.get("free", 1.0)) for g in n.get("gpus", [])}
        for n in nodes
    }
    for pg in groups:
        for b in pg.bundles:
            for i, cap in b.gpus.items():
                if b.node_id in free and i in free[b.node_id]:
                    free[b.node_id][i] -= cap - b.used.get(i, 0.0)
    return free


def _describe(nodes: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{n['node_id']}: {len(n.get('gpus', []))} GPUs, {float(n.get('cpus', 0)):g} CPUs"
        for n in nodes
    )


async def _create(
    s: _worker.Session, specs: list[dict[str, float]], strategy: str, name: str
) -> PlacementGroup:
    cluster = await s.cluster()
    nodes = [n for n in await cluster.nodes(actors=False) if n.get("alive", True)]
    planned = plan(specs, strategy, nodes, _free(nodes, list(s.groups.values())))
    if planned is None:
        empty = {n["node_id"]: {int(g["index"]): 1.0 for g in n.get("gpus", [])} for n in nodes}
        what = f"placement group {name!r} " if name else "placement group "
        if plan(specs, strategy, nodes, empty) is None:
            raise PlacementError(
                f"{what}{specs} with strategy {strategy} can never be placed on this cluster "
                f"({_describe(nodes)}); Ray would wait forever"
            )
        raise ResourcesBusyError(
            f"{what}{specs} with strategy {strategy} does not fit now: the GPUs it needs are "
            f"held by actors or other placement groups ({_describe(nodes)})"
        )
    bundles = [Bundle(spec, nid, gpus) for spec, (nid, gpus) in zip(specs, planned, strict=True)]
    pg = PlacementGroup(bundles, strategy, name, s.generation)
    s.groups[pg.id.hex()] = pg
    return pg


def placement_group(
    bundles: list[dict[str, float]],
    strategy: str = "PACK",
    name: str = "",
    lifetime: str | None = None,
    **_: Any,
) -> PlacementGroup:
    """Plan a placement group of ``bundles`` (each ``{"CPU": n, "GPU": g}``).

    Raises:
        ValueError: malformed bundles, an unknown strategy, ``lifetime="detached"``.
        PlacementError: the group can never fit this cluster (the reason in the message).
        ResourcesBusyError: it could, but the GPUs are taken now.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if lifetime not in (None, "non_detached"):
        raise ValueError(
            "lifetime='detached' placement groups are not supported by rayless.ray: a group "
            "lives as long as the driver's session"
        )
    specs = _check_bundles(bundles)
    s = _worker.session()
    return _worker.run(s, _create(s, specs, strategy, name))


async def _remove(s: _worker.Session, pg: PlacementGroup) -> None:
    cluster = await s.cluster()
    for handle in pg.actors:
        try:
            await cluster.kill(handle)
        except Exception:
            pass
    pg.actors.clear()


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Remove the group: its actors are killed and its GPUs planned for others again."""
    pg = placement_group
    s = _worker.session()
    if pg.removed:
        return
    pg.removed = True
    s.groups.pop(pg.id.hex(), None)
    _worker.run(s, _remove(s, pg))


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """This session's live placement group called ``placement_group_name`` (Ray's lookup;
    groups are planned per driver, so another driver's group is not found).

    Raises:
        ValueError: an empty name, or no live group of this session has it (Ray's messages).
    """
    if not placement_group_name:
        raise ValueError("Please supply a non-empty value to get_placement_group")
    for pg in _worker.session().groups.values():
        if pg.name == placement_group_name and not pg.removed:
            return pg
    raise ValueError(f"Failed to look up placement group with name: {placement_group_name}")


def get_current_placement_group() -> PlacementGroup | None:
    """None: rayless.ray does not capture child tasks into their parent's group."""
    return None


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict[str, Any]:
    """The group's record as Ray's (``bundles``, ``bundles_to_node_id``, ``strategy``...)."""
    groups = (
        [placement_group]
        if placement_group is not None
        else list(_worker.session().groups.values())
    )

    def record(pg: PlacementGroup) -> dict[str, Any]:
        return {
            "placement_group_id": pg.id.hex(),
            "name": pg.name,
            "bundles": dict(enumerate(pg.bundle_specs)),
            "bundles_to_node_id": {i: b.node_id for i, b in enumerate(pg.bundles)},
            "strategy": pg.strategy,
            "state": "REMOVED" if pg.removed else "CREATED",
        }

    if placement_group is not None:
        return record(placement_group)
    return {pg.id.hex(): record(pg) for pg in groups}
