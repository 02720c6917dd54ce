"""ControllerState against a simple model: a hypothesis state machine of KV puts by key,
group puts with group sizes, sequential and grouped fetches, hand-backs, clears and releases.

Invariants: every sample is fetched at most once per task until it is handed back or the
task's consumption is reset; a sequential fetch takes the oldest candidates; keys map to
their sample's index (kv_lookup, kv_meta, kv_list); a grouped fetch takes whole groups, never
part of one; a group put that would overfill a group, or name another group size than the
partition's, is refused with the state unchanged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayless.store.controller.state import ControllerState
from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import DataUpdate
from rayless.store.errors import StoreInputError
from tests.unit.controller_state_helpers import I64

KEYS = [f"k{i}" for i in range(8)]
GROUPS = ["g0", "g1", "g2", "g3", ("t", 1)]
TASKS = ("t1", "t2")


class KvGroupMachine(RuleBasedStateMachine):
    """Partition "kv" holds KV samples (by key), partition "g" grouped samples."""

    def __init__(self) -> None:
        super().__init__()
        self.c = ControllerState("kvg")
        for i in range(2):
            self.c.register_unit(f"u{i}")
        self.order: dict[str, list[int]] = {"kv": [], "g": []}  # allocation order
        self.keys: dict[str, int] = {}  # key -> index (partition "kv")
        self.key_of: dict[int, str] = {}
        self.group_of: dict[int, Hashable] = {}  # index -> group (partition "g")
        self.group_size: int | None = None  # partition "g"'s fixed size
        self.gen: dict[int, int] = {}
        self.consumed: dict[tuple[str, str], set[int]] = {
            (p, t): set() for p in self.order for t in TASKS
        }
        self.pending: list[int] = []

    def _write(self, meta: BatchMeta) -> None:
        for shard, positions in meta.by_shard().items():
            idx = [meta.global_indexes[p] for p in positions]
            self.c.on_data_update(f"u{shard}", DataUpdate(meta.partition_id, idx, {"a": I64}))

    def _added(self, partition: str, meta: BatchMeta) -> None:
        for i, g in zip(meta.global_indexes, meta.generations, strict=True):
            assert i not in self.gen, "an index was handed out twice"
            self.gen[i] = g
            self.order[partition].append(i)

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def kv_put(self, keys: list[str]) -> None:
        tags = [{"tag": k} for k in keys]
        if any(k in self.keys for k in keys):
            before = self.c.stats()
            with pytest.raises(StoreInputError):
                self.c.allocate("kv", len(keys), keys=keys, custom_meta=tags, schemas={"a": I64})
            assert self.c.stats() == before
            return
        meta = self.c.allocate("kv", len(keys), keys=keys, custom_meta=tags, schemas={"a": I64})
        self._write(meta)
        self._added("kv", meta)
        for k, i in zip(keys, meta.global_indexes, strict=True):
            self.keys[k] = i
            self.key_of[i] = k

    @rule(
        groups=st.lists(st.sampled_from(GROUPS), min_size=1, max_size=6),
        size=st.sampled_from([None, 2, 3]),
    )
    def group_put(self, groups: list[Hashable], size: int | None) -> None:
        fixed = self.group_size
        limit = fixed if fixed is not None else size
        have = {g: list(self.group_of.values()).count(g) for g in set(groups)}
        refused = (size is not None and fixed is not None and size != fixed) or (
            limit is not None and any(have[g] + groups.count(g) > limit for g in set(groups))
        )
        if refused:
            with pytest.raises(StoreInputError):
                self.c.allocate("g", len(groups), group_ids=groups, group_size=size)
            assert self.c.group_size("g") == fixed if "g" in self.c.partitions() else True
            return
        meta = self.c.allocate("g", len(groups), group_ids=groups, group_size=size, schemas={})
        self._write(meta)
        self._added("g", meta)
        self.group_of.update(zip(meta.global_indexes, groups, strict=True))
        if limit is not None:
            self.group_size = limit
        assert self.c.group_size("g") == self.group_size

    def _candidates(self, partition: str, task: str) -> list[int]:
        done = self.consumed[(partition, task)]
        return [i for i in self.order[partition] if i not in done]

    @rule(
        partition=st.sampled_from(["kv", "g"]),
        task=st.sampled_from(TASKS),
        size=st.integers(1, 5),
        mode=st.sampled_from(["fetch", "peek"]),
    )
    def fetch(self, partition: str, task: str, size: int, mode: str) -> None:
        expect = self._candidates(partition, task)
        got = self.c.try_fetch(partition, ["a"], size, task=task, mode=mode)
        if len(expect) < size:
            assert got is None
            return
        assert got is not None
        assert list(got.global_indexes) == expect[:size], "not the oldest candidates"
        if mode == "fetch":
            self.consumed[(partition, task)].update(got.global_indexes)

    @precondition(lambda self: self.order["g"])
    @rule(task=st.sampled_from(TASKS), n=st.sampled_from([2, 3]), k=st.integers(1, 2))
    def grouped_fetch(self, task: str, n: int, k: int) -> None:
        spec = {"name": "grouped", "n": n}
        if self.group_size is not None and self.group_size != n:
            with pytest.raises(StoreInputError):
                self.c.try_fetch("g", ["a"], n * k, task=task, sampler=spec)
            return
        sizes = Counter(self.group_of[i] for i in self.order["g"])
        if any(count > n for count in sizes.values()):  # consumed samples count too
            with pytest.raises(StoreInputError):
                self.c.try_fetch("g", ["a"], n * k, task=task, sampler=spec)
            assert self.c.group_size("g") == self.group_size
            return
        self.group_size = n  # the first grouped fetch fixes the partition's group size
        cands = self._candidates("g", task)
        members: dict[Hashable, list[int]] = {}
        for i in cands:
            members.setdefault(self.group_of[i], []).append(i)
        got = self.c.try_fetch("g", ["a"], n * k, task=task, sampler=spec)
        complete = [m for m in members.values() if len(m) == n]
        if len(cands) < n * k or len(complete) < k:
            assert got is None
            return
        assert got is not None
        assert list(got.global_indexes) == [i for m in complete[:k] for i in m]
        fetched = set(got.global_indexes)
        for g in {self.group_of[i] for i in fetched}:
            whole = {i for i in self.order["g"] if self.group_of[i] == g}
            assert whole <= fetched, f"group {g!r} was split"
        self.consumed[("g", task)].update(fetched)

    @precondition(lambda self: any(self.consumed.values()))
    @rule(data=st.data())
    def hand_back(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(k for k, v in self.consumed.items() if v)))
        chosen = data.draw(st.lists(st.sampled_from(sorted(self.consumed[key])), unique=True))
        partition, task = key
        assert sorted(self.c.unconsume(task, partition, chosen)) == sorted(chosen)
        self.consumed[key] -= set(chosen)

    @rule(task=st.sampled_from(TASKS))
    def reset(self, task: str) -> None:
        self.c.reset_consumption(task)
        for p in self.order:
            self.consumed[(p, task)] = set()

    @precondition(lambda self: self.order["kv"] or self.order["g"])
    @rule(data=st.data())
    def clear(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from([p for p, o in self.order.items() if o]))
        chosen = data.draw(
            st.lists(st.sampled_from(self.order[partition]), min_size=1, unique=True)
        )
        plan = self.c.clear(self.c.meta_of(partition, chosen))
        assert sorted(plan.indexes) == sorted(chosen)
        for i in chosen:
            self.order[partition].remove(i)
            del self.gen[i]
            key = self.key_of.pop(i, None)
            if key is not None:
                del self.keys[key]
            self.group_of.pop(i, None)
            for s in self.consumed.values():
                s.discard(i)
        self.pending.extend(chosen)

    @precondition(lambda self: self.pending)
    @rule()
    def release(self) -> None:
        self.c.release(self.pending)
        self.pending = []

    @invariant()
    def keys_map_to_their_samples(self) -> None:
        meta, missing = self.c.kv_lookup("kv", KEYS)
        assert [KEYS[p] for p in missing] == [k for k in KEYS if k not in self.keys]
        assert list(meta.global_indexes) == [self.keys[k] for k in KEYS if k in self.keys]
        if self.keys:
            names = sorted(self.keys)
            kv = self.c.kv_meta("kv", names, ["a"])
            assert list(kv.global_indexes) == [self.keys[k] for k in names]
            assert [c["tag"] for c in kv.custom_meta] == names
            listed = self.c.kv_list("kv").as_dict()
            assert listed == {"kv": {k: {"tag": k} for k in self.keys}}
        else:
            assert self.c.kv_list("kv").keys == {}

    @invariant()
    def counts_match(self) -> None:
        for p, order in self.order.items():
            if p not in self.c.partitions():
                assert not order
                continue
            assert self.c.ready_indexes(p, ["a"]) == order
            for t in TASKS:
                status = self.c.consumption_status(p, t)
                assert status == {"samples": len(order), "consumed": len(self.consumed[(p, t)])}
                assert self.c.ready_indexes(p, ["a"], t) == self._candidates(p, t)
        assert self.c.stats().allocated == len(self.gen)
        assert self.c.stats().pending_release == len(self.pending)


KvGroupMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestKvGroupMachine = KvGroupMachine.TestCase
