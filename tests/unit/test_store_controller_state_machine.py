"""ControllerState against a simple model: a hypothesis state machine of random
allocate/update/fetch/clear/release sequences, atomic and column-wise puts."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rayless.store.controller.state import ControllerState
from rayless.store.data.meta import BatchMeta
from rayless.store.data.schema import DataUpdate
from rayless.store.errors import StoreInputError
from tests.unit.controller_state_helpers import I64


class ControllerMachine(RuleBasedStateMachine):
    """Random allocate/update/fetch/clear/release sequences against a simple model.

    Atomic allocations (a put) show no field of any of their samples until every sample was
    written once; then all the fields written meanwhile show at once. Column-wise puts show
    the field they add on none of their samples until every sample's unit reported; an
    aborted one never shows, and refuses later reports.
    """

    FIELDS = ("a", "b")
    TASKS = ("t1", "t2")

    def __init__(self) -> None:
        super().__init__()
        self.c = ControllerState("prop")
        for i in range(3):
            self.c.register_unit(f"u{i}")
        self.live: dict[int, str] = {}  # index -> partition
        self.written: dict[int, set[str]] = {}
        self.consumed: dict[str, set[int]] = {t: set() for t in self.TASKS}
        self.pending: list[int] = []
        self.ever: set[int] = set()
        self.staged: dict[int, int] = {}  # index -> its atomic put's serial
        self.waiting: dict[int, set[int]] = {}  # serial -> indexes not written yet
        self.held: dict[int, set[str]] = {}  # staged index -> fields written, not shown yet
        self.gen: dict[int, int] = {}  # live index -> its allocation's generation
        # column-wise put id -> (partition, field, {index: generation}, indexes not reported)
        self.col: dict[int, tuple[str, str, dict[int, int], set[int]]] = {}
        self.aborted: list[tuple[int, str, str, int, int]] = []  # put id, part, field, i, gen

    @rule(partition=st.sampled_from(["p", "q"]), n=st.integers(1, 5))
    def allocate_atomic(self, partition: str, n: int) -> None:
        meta = self.c.allocate(partition, n, schemas={"a": I64}, atomic=True)
        for i in meta.global_indexes:
            assert i not in self.live, "an index was handed out twice"
            self.live[i] = partition
            self.written[i] = set()
            self.ever.add(i)
            self.staged[i] = meta.generations[0]
            self.held[i] = set()
            self.gen[i] = meta.generations[0]
        self.waiting[meta.generations[0]] = set(meta.global_indexes)

    @rule(partition=st.sampled_from(["p", "q"]), n=st.integers(0, 5))
    def allocate(self, partition: str, n: int) -> None:
        meta = self.c.allocate(partition, n)
        for i, g in zip(meta.global_indexes, meta.generations, strict=True):
            assert i not in self.live, "an index was handed out twice"
            self.live[i] = partition
            self.written[i] = set()
            self.ever.add(i)
            self.gen[i] = g

    def _in_column_put(self, i: int) -> bool:
        return any(i in members for _, _, members, _ in self.col.values())

    @precondition(lambda self: any(i not in self.staged for i in self.live))
    @rule(data=st.data(), field=st.sampled_from(FIELDS))
    def begin_column_put(self, data: st.DataObject, field: str) -> None:
        free = [i for i in sorted(self.live) if i not in self.staged and not self._in_column_put(i)]
        if not free:
            return
        partition = self.live[data.draw(st.sampled_from(free))]
        pool = [i for i in free if self.live[i] == partition]
        chosen = data.draw(st.lists(st.sampled_from(pool), min_size=1, unique=True))
        put_id, fresh = self.c.begin_column_put(self._meta(partition, chosen), {field: I64})
        assert set(fresh.get(partition, {}).get(field, [])) == {
            i for i in chosen if field not in self.written[i]
        }
        self.col[put_id] = (partition, field, {i: self.gen[i] for i in chosen}, set(chosen))

    @precondition(lambda self: self.col)
    @rule(data=st.data())
    def column_update(self, data: st.DataObject) -> None:
        put_id = data.draw(st.sampled_from(sorted(self.col)))
        partition, field, members, waiting = self.col[put_id]
        # a unit reports its own samples that are still the put's (a cleared one: never)
        sendable = [i for i in sorted(waiting) if self.gen.get(i) == members[i]]
        if not sendable:
            return
        shard = self.c.shard_of(data.draw(st.sampled_from(sendable)))
        idx = [i for i in sendable if self.c.shard_of(i) == shard]
        upd = DataUpdate(partition, idx, {field: I64}, put_id=put_id)
        ready = self.c.on_data_update(f"u{shard}", upd)
        waiting -= set(idx)
        if waiting:
            assert ready == []
            return
        del self.col[put_id]
        still = [i for i, g in members.items() if self.gen.get(i) == g]  # not cleared meanwhile
        assert sorted(ready) == sorted(still)
        for i in still:
            self.written[i].add(field)

    @precondition(lambda self: self.col)
    @rule(data=st.data())
    def abort_column_put(self, data: st.DataObject) -> None:
        put_id = data.draw(st.sampled_from(sorted(self.col)))
        partition, field, members, waiting = self.col.pop(put_id)
        rows = self.c.abort_column_put(put_id)
        named = {i for plan in rows.values() for i in plan.get(partition, {}).get(field, [])}
        assert named == {
            i for i, g in members.items() if self.gen.get(i) == g and field not in self.written[i]
        }
        for i in sorted(waiting):
            self.aborted.append((put_id, partition, field, i, members[i]))

    @precondition(lambda self: self.aborted)
    @rule(data=st.data())
    def late_report_of_an_aborted_put(self, data: st.DataObject) -> None:
        put_id, partition, field, i, gen = self.aborted.pop(
            data.draw(st.integers(0, len(self.aborted) - 1))
        )
        if self.gen.get(i) != gen:
            return  # the sample is gone: a report would be refused for that already
        with pytest.raises(StoreInputError):
            upd = DataUpdate(partition, [i], {field: I64}, put_id=put_id)
            self.c.on_data_update(f"u{self.c.shard_of(i)}", upd)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), field=st.sampled_from(FIELDS))
    def update(self, data: st.DataObject, field: str) -> None:
        index = data.draw(st.sampled_from(sorted(self.live)))
        shard = self.c.shard_of(index)
        self.c.on_data_update(f"u{shard}", DataUpdate(self.live[index], [index], {field: I64}))
        serial = self.staged.get(index)
        if serial is None:
            self.written[index].add(field)
            return
        self.held[index].add(field)
        self.waiting[serial].discard(index)
        if not self.waiting[serial]:  # the put's last write: all of it shows
            del self.waiting[serial]
            for i in [i for i, s in self.staged.items() if s == serial]:
                self.written[i] |= self.held.pop(i)
                del self.staged[i]

    @rule(
        partition=st.sampled_from(["p", "q"]),
        fields=st.sampled_from([("a",), ("b",), ("a", "b")]),
        task=st.sampled_from(TASKS),
        size=st.integers(1, 4),
        mode=st.sampled_from(["fetch", "peek"]),
    )
    def fetch(
        self, partition: str, fields: tuple[str, ...], task: str, size: int, mode: str
    ) -> None:
        expect = [
            i
            for i, p in self.live.items()
            if p == partition and set(fields) <= self.written[i] and i not in self.consumed[task]
        ]
        got = self.c.try_fetch(partition, list(fields), size, task=task, mode=mode)
        if len(expect) < size:
            assert got is None
            return
        assert got is not None and len(got) == size
        for i in got.global_indexes:
            assert i in expect, "fetched a sample not ready, or already consumed by the task"
        if mode == "fetch":
            self.consumed[task].update(got.global_indexes)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def clear(self, data: st.DataObject) -> None:
        partition = data.draw(st.sampled_from(sorted(set(self.live.values()))))
        idx = [i for i, p in self.live.items() if p == partition]
        chosen = data.draw(st.lists(st.sampled_from(idx), min_size=1, unique=True))
        plan = self.c.clear(self._meta(partition, chosen))
        assert sorted(plan.indexes) == sorted(chosen)
        for i in chosen:
            del self.live[i]
            del self.written[i]
            del self.gen[i]
            serial = self.staged.pop(i, None)
            if serial is not None:
                del self.held[i]
                self.waiting[serial].discard(i)
                if not any(s == serial for s in self.staged.values()):
                    del self.waiting[serial]
            for s in self.consumed.values():
                s.discard(i)
        self.pending.extend(chosen)

    def _meta(self, partition: str, indexes: list[int]) -> BatchMeta:
        return self.c.meta_of(partition, indexes, fields=None)

    @precondition(lambda self: self.pending)
    @rule()
    def release(self) -> None:
        self.c.release(self.pending)
        self.pending = []

    @rule(task=st.sampled_from(TASKS))
    def reset(self, task: str) -> None:
        self.c.reset_consumption(task)
        self.consumed[task] = set()

    @invariant()
    def ready_iff_all_fields_written(self) -> None:
        for partition in ("p", "q"):
            for fields in (["a"], ["b"], ["a", "b"]):
                model = sorted(
                    i
                    for i, p in self.live.items()
                    if p == partition and set(fields) <= self.written[i]
                )
                assert sorted(self.c.ready_indexes(partition, fields)) == model

    @invariant()
    def indexes_stay_compact(self) -> None:
        stats = self.c.stats()
        assert stats.allocated == len(self.live)
        assert stats.pending_release == len(self.pending)
        assert stats.high_water == len(self.ever)
        assert stats.staged == len(self.staged)
        assert stats.column_puts == len(self.col)


ControllerMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None
)
TestControllerMachine = ControllerMachine.TestCase
