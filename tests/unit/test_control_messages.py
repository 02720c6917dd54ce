"""The typed control plane: every message round-trips through the codec; decoding checks each
field, builds only registered classes, and dispatch goes by message type."""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any

import msgpack
import pytest

from rayless.actors.control.agent import Agent
from rayless.actors.control.death import death_details
from rayless.actors.control.head import Head
from rayless.actors.control.spawner import ProcessSpawner
from rayless.actors.errors import ActorDiedError
from rayless.actors.protocol import messages as m
from rayless.actors.protocol import zygote_messages as z
from rayless.actors.protocol.wire import MESSAGES, Handlers, Request, check_reply, handles, message
from rayless.placement import discover_node
from rayless.transport import codec
from rayless.transport._registry import EXT, MARK
from rayless.transport.errors import ProtocolError, RemoteError

STEP = m.MethodInfo(is_async=True, params="batch, *, lr=", timeout=30.0)
GET = m.MethodInfo(is_async=False)
SPEC = m.SpawnSpec(
    cls=("pkg.mod", "Learner", None),
    cls_name="Learner",
    init=(b"\x92\x90\x80",),
    owner="session-1",
    name="learner",
    gpus=0.5,
    gpu_indices=(0, 3),
    max_concurrency=4,
    env={"A": "1"},
    methods={"step": STEP, "get": GET},
    cwd="/tmp",
    sys_path=("/a", "/b"),
)
PACKAGE = m.PackageRef("ab" * 32, 10, working_dir=True)
DEATH = m.ActorEvent(
    m.EventKind.DIED, "a1", name="learner", node="n0", pid=9, exitcode=-9,
    cause="killed by SIGKILL, killed by the kernel's OOM killer (...)", oom=True,
    log_tail=["loading", "allocating"], log="/tmp/logs/learner.log",
)  # fmt: skip
VIEW = m.ActorView(
    "a1", "learner", "Learner", "n0", "0", ((0, 0.5),), 1.0, m.ActorState.DEAD, "tcp://x:1",
    9, 0, 2, {"step": STEP}, DEATH,
)  # fmt: skip
GPU = m.GpuView(0, "GPU-1", "H100", 80 << 30, "0000:01:00.0", 0.5)
NODE = m.NodeView("n-0", "h", "127.0.0.1", 0, True, 16.0, 2.5, (GPU,), 1, 0, True, 1)
SAMPLES: list[Any] = [
    SPEC,
    m.Spawn(SPEC),
    m.StartActor("a1", "learner", SPEC, {"CUDA_VISIBLE_DEVICES": "0"}),
    m.Started("tcp://x:1", 9, {"step": STEP}),
    STEP,
    GET,
    m.Started("tcp://x:1", 9, None),
    m.Boot(("m", "C", b"pickled"), (b"h", b"b"), None, ("/a",)),
    m.Ready("a1", "tcp://x:1", 9, {}),
    m.Hello("s"),
    m.Hello("s", ("a1", "a2")),
    m.HelloReply(5.0, (VIEW,)),
    m.KeepSession("s"),
    m.EndSession("s"),
    m.GetActor("learner"),
    m.LookupActor("a1"),
    m.Kill("a1"),
    m.DebugRegister("a1", "tcp://x:2", None),
    m.DebugEndpoints(),
    m.RegisterNode({"node_id": "n0", "gpus": [{"index": 0}]}, "tcp://x:3"),
    m.NodeRegistered(5.0),
    m.ListNodes(),
    m.ListNodes(actors=False),
    m.ListActors(limit=None, offset=3),
    m.ActorPage((VIEW,), 7, 0),
    m.Summarize(),
    m.Summarize(limit=None),
    m.ClusterSummary(2, 1, 16.0, 2.5, 8, 6, 1, (NODE,), (VIEW,)),
    NODE,
    m.NodeView("n1", None, None, None, False, 1.0, 0.0, (), 0, 0, False, 1, (VIEW,)),
    GPU,
    m.FreePortOn("n0"),
    m.FreePort(),
    PACKAGE,
    m.SpawnSpec(("m", "C", None), "C", (), "s", packages=(PACKAGE,), detached=True),
    m.PackageUpload("ab" * 32, 10, 0, b"0123456789"),
    m.PackageFetch("ab" * 32, 0, 4096),
    m.Shutdown(),
    m.StopActor("a1", "killed by request"),
    m.AgentStatus(),
    m.Bootstrap("a1"),
    m.NodeHeartbeat("n0"),
    DEATH,
    m.ActorEvent(m.EventKind.READY, "a1", address="tcp://x:9", restarts=1),
    m.NodeDied("n0", "no heartbeat"),
    VIEW,
    m.LogLines("a1", "learner", 9, "n0", ("hello", "world")),
    z.Fork(1, {"A": "1"}, "/tmp/log", None, "tok"),
    z.Preload("pkg.mod"),
    z.Forked(1, 10),
    z.ForkFailed(1, "EAGAIN"),
    z.Exited(10, -9),
    z.Preloaded("pkg.mod", False, "ImportError: no"),
]


def _control() -> dict[str, type]:
    """The control plane's messages (``ctl.``, ``zyg.``): other packages register theirs in
    the same table once imported (the store's ``store.``, weight sync's ``weights.``)."""
    return {n: c for n, c in MESSAGES.items() if n.startswith(("ctl.", "zyg."))}


def _raw(name: str, state: Any) -> list[bytes]:
    """The frames of an extension record ``name`` with ``state``, as a peer could write it."""
    return [msgpack.packb([MARK[EXT], name, state])]


def test_every_registered_message_has_a_sample_and_round_trips() -> None:
    assert {type(s) for s in SAMPLES} | {m.Failed} == set(_control().values())
    for sample in SAMPLES:  # (Failed: an exception compares by identity, tested below)
        frames = codec.encode(sample)
        assert len(frames) == 1
        back = codec.decode(frames)
        assert type(back) is type(sample) and back == sample


def test_enums_travel_as_their_values_and_come_back_as_members() -> None:
    back = codec.decode(codec.encode(VIEW))
    assert back.state is m.ActorState.DEAD and back.death.kind is m.EventKind.DIED
    assert m.ActorState.DEAD == "dead" and VIEW.as_dict()["state"] == "dead"


def test_a_death_event_carries_why_to_the_caller_error() -> None:
    back = codec.decode(codec.encode(DEATH))
    error = ActorDiedError("learner", pid=back.pid, exitcode=back.exitcode, **death_details(back))
    assert back.oom is True and error.log_tail == ["loading", "allocating"]
    assert "OOM killer" in str(error) and "/tmp/logs/learner.log" in str(error)
    assert VIEW.as_dict()["death"]["cause"] == DEATH.cause  # what the dashboard shows


def test_an_error_field_arrives_as_itself() -> None:
    back = codec.decode(codec.encode(m.Failed("a1", RemoteError("builtins.KeyError", "boom"))))
    assert type(back) is m.Failed and isinstance(back.error, RemoteError)
    assert "boom" in str(back.error)


@pytest.mark.parametrize(
    ("name", "state", "match"),
    [
        ("ctl.Kill", [7], "ctl.Kill message: actor_id must be str, not int"),
        ("ctl.Kill", [], "expected 1 fields"),
        ("ctl.Kill", ["a", "b"], "expected 1 fields"),
        ("ctl.Kill", "a1", "expected 1 fields"),
        ("ctl.Hello", ["s", ["a1"]], "actor_ids must be tuple, not list"),
        ("ctl.NodeRegistered", ["5"], "node_timeout"),
        ("ctl.NodeHeartbeat", [True], "node_id must be str"),
        ("ctl.StopActor", ["a1", None], "reason must be str"),
        ("ctl.Started", ["tcp://x", True, None], "pid must be int, not bool"),
        ("ctl.Started", ["tcp://x", 1, {"f": "yes"}], "methods"),
        ("ctl.Started", ["tcp://x", 1, {1: True}], "methods"),
        (
            "ctl.ActorEvent",
            ["exploded", "a1", "", None, None, None, 0, "", "", "", False, [], ""],
            "EventKind",
        ),
        (
            "ctl.ActorEvent",
            ["died", "a1", "", None, None, None, 0, "", "", "", False, [3], ""],
            "log_tail",
        ),
        ("ctl.ActorEvent", ["died", "a1", "", None, None, None, 0, "", ""], "expected 13 fields"),
        ("zyg.Exited", [1, 2.5], "code must be int"),
        ("ctl.Spawn", [["x"]], "spec must be SpawnSpec, not list"),
        ("ctl.Failed", ["a1", "not an error"], "error must be RaylessError"),
    ],
)
def test_a_malformed_message_is_a_protocol_error_naming_the_field(
    name: str, state: Any, match: str
) -> None:
    with pytest.raises(ProtocolError, match=match):
        codec.decode(_raw(name, state))


def test_a_fixed_tuple_field_checks_its_length_and_items() -> None:
    good = codec.encode(SPEC)
    back = codec.decode(good)
    assert back.cls == ("pkg.mod", "Learner", None)
    state = [getattr(SPEC, f.name) for f in dataclasses.fields(SPEC)]
    state = [v.value if isinstance(v, enum.Enum) else v for v in state]  # (Enums: by value)
    state[0] = ("pkg.mod", "Learner")  # a tuple of two
    with pytest.raises(ProtocolError, match="cls must be a tuple of 3"):
        codec.decode(codec.encode([MARK[EXT], "ctl.SpawnSpec", state]))


def test_a_fixed_tuple_of_plain_fields_passes_whole_and_still_refuses_and_widens() -> None:
    from rayless.actors.protocol.wire import _Bad, _checker

    row = _checker(tuple[str, float, tuple[int, ...], int | None], "t")
    ok = ("w", 1.5, (2, 3), None)
    assert row(ok) is ok  # nothing to convert: the same tuple, no copy
    assert row(("w", 1, (2, 3), 4)) == ("w", 1.0, (2, 3), 4)  # an int widened to a float
    assert type(row(("w", 1, (2, 3), 4))[1]) is float
    for bad, says in [
        (("w", 1.5, (2, "3"), 4), "must be int"),
        ((1, 1.5, (2,), 4), "must be str"),
        (("w", 1.5, [2], 4), "must be tuple"),
        (("w", 1.5, (2,), 4.0), "int"),
        (("w", 1.5, (2,)), "tuple of 4"),
    ]:
        with pytest.raises(_Bad, match=says):
            row(bad)


@pytest.mark.parametrize(
    "name", ["ctl.NoSuch", "subprocess.Popen", "builtins.eval", "os.system", "", "ctl."]
)
def test_a_name_outside_the_table_builds_nothing(name: str) -> None:
    with pytest.raises(ProtocolError, match="unknown extension"):
        codec.decode(_raw(name, ["/bin/sh"]))


def test_only_frozen_dataclasses_with_supported_fields_register() -> None:
    class Plain:
        pass

    with pytest.raises(TypeError, match="frozen dataclass"):
        message("test.Plain")(Plain)

    @dataclasses.dataclass
    class Thawed:
        x: int

    with pytest.raises(TypeError, match="frozen dataclass"):
        message("test.Thawed")(Thawed)

    @dataclasses.dataclass(frozen=True)
    class Loose:
        x: set[int]

    with pytest.raises(TypeError, match="unsupported message field type"):
        message("test.Loose")(Loose)
    assert not {"test.Plain", "test.Thawed", "test.Loose"} & set(MESSAGES)


def test_a_wire_name_cannot_be_taken_twice() -> None:
    @dataclasses.dataclass(frozen=True)
    class Impostor:
        actor_id: str

    with pytest.raises(ValueError, match="taken"):
        message("ctl.Kill")(Impostor)
    assert MESSAGES["ctl.Kill"] is m.Kill


def test_no_message_field_is_typed_any_but_the_free_form_ones() -> None:
    """Bodies are typed: ``Any`` appears only inside the node's discovery record (and the
    node status records built from it, for people and the CLI)."""
    loose = []
    for name, cls in _control().items():
        for field, hint in typing.get_type_hints(cls).items():
            if "Any" in repr(hint):
                loose.append(f"{name}.{field}")
    assert sorted(loose) == ["ctl.RegisterNode.info"]


def test_dispatch_goes_by_type_and_names_what_it_does_not_answer() -> None:
    seen: list[Any] = []
    table: Handlers[str] = Handlers("head")
    table.on(m.Kill, lambda peer, msg: seen.append((peer, msg.actor_id)) or True)
    assert table.handle("p", m.Kill("a1")) is True and seen == [("p", "a1")]
    with pytest.raises(ProtocolError, match=r"unknown head request ctl\.Bootstrap"):
        table.handle("p", m.Bootstrap("a1"))
    with pytest.raises(ProtocolError, match="malformed head request \\('kill', 'a1'\\)"):
        table.handle("p", ("kill", "a1"))
    table.oneway("p", ("kill", "a1"))  # a one-way message has no reply: dropped
    table.oneway("p", m.Bootstrap("a1"))
    assert seen == [("p", "a1")] and table.dropped == 2
    table.oneway("p", m.Kill("a2"))
    assert seen == [("p", "a1"), ("p", "a2")] and table.dropped == 2


def test_zygote_frames_hold_one_codec_header() -> None:
    framed = z.pack(z.Forked(3, 44))
    (size,) = z.LENGTH.unpack_from(framed)
    assert size == len(framed) - 4
    assert z.unpack(framed[4:]) == z.Forked(3, 44)
    with pytest.raises(ProtocolError):
        z.unpack(b"\xc1")  # not msgpack


async def test_the_head_and_agents_answer_every_request_of_the_control_plane(
    tmp_path: Any,
) -> None:
    head = Head("t" * 32)
    assert m.NodeHeartbeat in head.requests.types  # a request: its reply keeps the session
    assert m.Spawn in head.requests.types and m.Hello in head.requests.types  # both owners'
    assert head.oneways.types == {m.ActorEvent, m.LogLines}
    node = discover_node(fake_gpus=1, node_id="n0", ip="127.0.0.1")
    agent = Agent(head.address, "t" * 32, node, spawner=ProcessSpawner(), log_dir=str(tmp_path))
    requests = {c for c in vars(m).values() if isinstance(c, type) and issubclass(c, Request)}
    requests.discard(Request)
    # every request message has a process that answers it, and nothing else is answered
    assert head.requests.types | agent.requests.types == requests
    assert head.requests.types & agent.requests.types == {m.Shutdown}
    assert m.StartActor in agent.requests.types and m.Hello not in agent.requests.types
    await agent.head.aclose()
    await agent.server.aclose()
    await head.server.aclose()


class _Answers:
    def __init__(self) -> None:
        self.seen: list[object] = []

    @handles(m.Kill)
    def kill(self, peer: str, msg: m.Kill) -> bool:
        self.seen.append(("kill", peer, msg.actor_id))
        return True

    @handles(m.GetActor)
    @handles(m.LookupActor)
    def look(self, peer: str, msg: m.GetActor | m.LookupActor) -> str:
        return type(msg).__name__

    @handles(m.LogLines, oneway=True)
    def logs(self, peer: str, msg: m.LogLines) -> None:
        self.seen.append(("logs", peer, msg.actor_id))


class _Overrides(_Answers):
    @handles(m.Kill)
    def kill(self, peer: str, msg: m.Kill) -> bool:
        return False


class _AlsoKills:
    @handles(m.Kill)
    def kill_too(self, peer: str, msg: m.Kill) -> bool:
        return True


def test_tables_are_built_from_the_marked_handlers_of_their_owners() -> None:
    owner = _Answers()
    requests: Handlers[str] = Handlers("head", owner)
    oneways: Handlers[str] = Handlers("head", owner, oneway=True)
    assert requests.types == {m.Kill, m.GetActor, m.LookupActor}
    assert oneways.types == {m.LogLines}
    assert requests.handle("p", m.Kill("a1")) is True  # bound to its owner
    assert requests.handle("p", m.GetActor("x")) == "GetActor"
    assert requests.handle("p", m.LookupActor("a1")) == "LookupActor"
    oneways.oneway("p", m.LogLines("a2", "w", 1, "n0", ("hi",)))
    assert owner.seen == [("kill", "p", "a1"), ("logs", "p", "a2")]
    with pytest.raises(ProtocolError, match=r"unknown head request ctl\.LogLines"):
        requests.handle("p", m.LogLines("a2", "w", 1, "n0", ("hi",)))  # one-way only
    # a subclass's override answers in its base's place, once
    assert Handlers[str]("head", _Overrides()).handle("p", m.Kill("a1")) is False
    with pytest.raises(ValueError, match="two handlers of Kill"):
        Handlers("head", owner, _AlsoKills())


def test_a_reply_of_the_wrong_kind_is_a_protocol_error() -> None:
    assert check_reply(m.Kill("a1"), False) is False
    assert check_reply(m.Ready("a1", "tcp://x:1", 9, {}), None) is None
    assert check_reply(m.Spawn(SPEC), VIEW) is VIEW
    assert check_reply(m.NodeHeartbeat("n0"), True) is True
    with pytest.raises(ProtocolError, match=r"ctl\.Spawn was answered with dict, not ActorView"):
        check_reply(m.Spawn(SPEC), VIEW.as_dict())  # the untyped record of before
    with pytest.raises(ProtocolError, match="answered with str, not NoneType"):
        check_reply(m.Ready("a1", "tcp://x:1", 9, {}), "ok")
