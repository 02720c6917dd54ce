"""Faithful remote errors, no silent exits (issue 13, item 2).

Before: ``sys.exit(3)`` in a method made the *driver* exit with status 0 (the caller's
``RemoteError[SystemExit]`` was a SystemExit); a method raising GeneratorExit or a custom
BaseException never replied; KeyboardInterrupt killed the actor; remote exceptions lost their
args (``KeyError('k').args[0]`` was ``'builtins.KeyError'``) and attributes.
"""

from __future__ import annotations

import asyncio

import pytest

from rayless.actors import ActorDiedError, Cluster, RemoteError
from rayless.transport.errors import BrokenError, Timeout
from tests.integration.error_classes import CodeErr, Custom, Faulty, Relay, Unencodable

pytestmark = pytest.mark.integration

BASE = {"KeyboardInterrupt": KeyboardInterrupt, "GeneratorExit": GeneratorExit, "Custom": Custom}


@pytest.mark.parametrize("method", ["exit", "aexit"])
async def test_sys_exit_in_a_method_ends_the_actor_with_its_exit_code(
    local_cluster: Cluster, method: str
) -> None:
    faulty = await local_cluster.spawn(Faulty)
    with pytest.raises(ActorDiedError) as info:
        await asyncio.wait_for(getattr(faulty, method)(3), 60)
    assert info.value.exitcode == 3 and "exit code 3" in str(info.value)
    with pytest.raises(ActorDiedError):  # dead for good: max_restarts=0
        await asyncio.wait_for(faulty.ok(), 60)


async def test_sys_exit_restarts_apply(local_cluster: Cluster) -> None:
    faulty = await local_cluster.spawn(Faulty, max_restarts=1)
    assert await faulty.ok() == 1
    with pytest.raises(ActorDiedError) as info:
        await asyncio.wait_for(faulty.exit(), 60)  # sys.exit() with no code: exit code 0
    assert info.value.exitcode == 0
    assert await asyncio.wait_for(faulty.ok(), 60) == 1  # a fresh instance
    with pytest.raises(ActorDiedError) as info:
        await asyncio.wait_for(faulty.aexit("bye"), 60)  # a message: exit code 1
    assert info.value.exitcode == 1
    with pytest.raises(ActorDiedError):  # its one restart is spent
        await asyncio.wait_for(faulty.ok(), 60)


@pytest.mark.parametrize("method", ["raise_base", "araise_base"])
@pytest.mark.parametrize("kind", sorted(BASE))
async def test_base_exceptions_reply_as_remote_errors_and_the_actor_survives(
    local_cluster: Cluster, method: str, kind: str
) -> None:
    faulty = await local_cluster.spawn(Faulty)
    with pytest.raises(RemoteError) as info:
        await asyncio.wait_for(getattr(faulty, method)(kind), 60)
    err = info.value
    assert not isinstance(err, BASE[kind]) and isinstance(err, Exception)
    assert err.remote_type.endswith(kind) and err.args == (f"a {kind}",)
    assert "raise _base(kind)" in str(err)  # the remote traceback
    assert await faulty.ok() == 1  # the actor is alive and answers


async def test_remote_exceptions_keep_args_and_attributes(local_cluster: Cluster) -> None:
    faulty = await local_cluster.spawn(Faulty, name="keeper")
    with pytest.raises(KeyError) as key:
        await faulty.key_err("k")
    assert key.value.args[0] == "k" and isinstance(key.value, RemoteError)
    with pytest.raises(CodeErr) as code:
        await faulty.code_err(42)
    err = code.value
    assert isinstance(err, RemoteError) and err.actor == "keeper"
    assert err.args == (42, "msg") and err.code == 42
    assert err.where == {"stage": "rollout", "step": 42}
    assert not hasattr(err, "opaque") and not hasattr(err, "_private")
    assert "raise CodeErr(code, " in str(err) and "Remote traceback" in str(err)
    with pytest.raises(Unencodable) as unenc:
        await faulty.unencodable()
    assert unenc.value.args == (repr({1, 2}), "plain")


async def test_an_actor_died_error_a_method_raises_reaches_its_caller_as_itself(
    local_cluster: Cluster,
) -> None:
    """ActorDiedError is a BrokenError: the one a method raises (an actor it called died) is
    its outcome, never taken for a break of the caller's connection to that method's actor,
    on the fast path (no timeout) as on the full one (a timeout); so is a Timeout it raises,
    never taken for the call's own deadline."""
    relay = await local_cluster.spawn(Relay)
    target = await local_cluster.spawn(Faulty, name="relayed-target")
    assert await relay.ok_of(target) == 1
    assert await local_cluster.kill(target)
    for path, ok_of in enumerate([relay.ok_of, relay.ok_of.options(timeout=60)]):
        with pytest.raises(ActorDiedError) as info:
            await asyncio.wait_for(ok_of(target), 60)
        assert info.value.actor == "relayed-target" and isinstance(info.value, BrokenError)
        assert await asyncio.wait_for(relay.count(), 60) == 2 + path  # the relay lives
    for lose_a_peer in [relay.lose_a_peer, relay.lose_a_peer.options(timeout=60)]:
        with pytest.raises(BrokenError, match="a peer of the relay broke") as broke:
            await asyncio.wait_for(lose_a_peer(), 60)
        assert type(broke.value) is BrokenError
    for time_out in [relay.time_out, relay.time_out.options(timeout=60)]:
        # a Timeout the method raises is its outcome, not this call's deadline
        with pytest.raises(Timeout, match="the relay's own wait ran out"):
            await asyncio.wait_for(time_out(), 60)
