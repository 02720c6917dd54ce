"""The cluster-wide pickle opt-in, ``RAYLESS_ALLOW_PICKLE=1``: values the codec has no record
for (an instance of a plain class, a lambda) travel pickled, as Ray sends them, between the
processes of a cluster started with it; without it they are a ``TypeError`` naming the fix,
and a process without it refuses a pickled value with a ``ProtocolError`` at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rayless.actors import Cluster
from rayless.actors.testing import LocalProcesses
from tests.drivers import ROOT
from tests.environ import without_rayless
from tests.integration.test_launch import free_port

pytestmark = pytest.mark.integration

DRIVER = """
import asyncio, sys
from rayless import actors, ray

class Plain:  # no dataclass: Ray pickles it, rayless only with the opt-in
    def __init__(self, x):
        self.x = x

class Keeper(actors.Actor):
    def __init__(self, p):
        self.p = p
    def add(self, q):
        return Plain(self.p.x + q.x)

def main():
    if sys.argv[1] == "join":
        ray.init(address=sys.argv[2])
    elif sys.argv[1] == "launched":  # rayless launch gives the address and token
        ray.init()
    else:
        ray.init(num_cpus=2)

    @ray.remote
    def apply(p, fn):
        return Plain(fn(p.x))

    @ray.remote
    class Holder:
        def __init__(self, p):
            self.p = p
        def add(self, q):
            return Plain(self.p.x + q.x)

    try:
        print("task", ray.get(apply.remote(Plain(2), lambda v: v * 10), timeout=60).x)
        print("actor", ray.get(Holder.remote(Plain(1)).add.remote(Plain(5)), timeout=60).x)
    except Exception as exc:
        print("ERROR", type(exc).__name__, str(exc).splitlines()[0])
        return
    async def actor_api():  # the actor API on the same cluster
        cluster = await actors.connect()
        keeper = await cluster.spawn(Keeper, Plain(3))
        return (await keeper.add(Plain(4))).x
    print("spawn", asyncio.run(actor_api()))

main()
"""


def _driver(tmp_path: Path, *argv: str, allow: bool, token: str = "") -> list[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**without_rayless(), "PYTHONPATH": str(ROOT)}
    if allow:
        env["RAYLESS_ALLOW_PICKLE"] = "1"
    if token:
        env["RAYLESS_TOKEN"] = token
    out = subprocess.run(
        [sys.executable, str(script), *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_plain_objects_and_lambdas_travel_with_the_opt_in(tmp_path: Path) -> None:
    assert _driver(tmp_path, "local", allow=True) == ["task 20", "actor 6", "spawn 7"]


def test_without_the_opt_in_a_plain_object_is_a_type_error_naming_it(tmp_path: Path) -> None:
    (line,) = _driver(tmp_path, "local", allow=False)
    assert line.startswith("ERROR TypeError argument 0: cannot encode Plain")
    assert "RAYLESS_ALLOW_PICKLE=1" in line


def test_a_cluster_without_the_opt_in_refuses_a_pickled_value_at_once(
    tmp_path: Path,
    local_cluster: Cluster,
    local_cluster_processes: LocalProcesses,
) -> None:
    # a driver with the opt-in joins the suite's cluster, whose processes have none: the
    # task worker refuses the pickled argument, and the call fails with that reason
    (line,) = _driver(
        tmp_path, "join", local_cluster.address, allow=True, token=local_cluster_processes.token
    )
    assert line.startswith("ERROR ProtocolError")
    assert "does not allow pickle" in line and "RAYLESS_ALLOW_PICKLE=1" in line


def test_launch_allow_pickle_opts_in_every_process_it_starts(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**without_rayless(), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "launch.py"), "--allow-pickle",
         "--master-port", str(free_port()), "--", str(script), "launched"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if not ln.startswith("[rayless launch]")]
    assert lines == ["task 20", "actor 6", "spawn 7"]


STRANGER_DRIVER = """
import json, os, pickle, sys, tempfile
import msgpack
from rayless.actors import Actor, Cluster
from rayless.transport._registry import MARK, PICKLE
from tests.integration.strangers import run_stranger

marker = os.path.join(tempfile.mkdtemp(), "unpickled")
os.chmod(os.path.dirname(marker), 0o777)

class Touch:
    def __reduce__(self):
        return (open, (marker, "w"))

class Echo(Actor):
    def echo(self, v):
        return v

record = msgpack.packb([MARK[PICKLE], pickle.dumps(Touch())], use_bin_type=True)
cluster = Cluster.local_sync()
echo = cluster.spawn(Echo)
ATTACK = '''
import socket, zmq
host, port = ARGS["addr"].replace("tcp://", "").rsplit(":", 1)
record = bytes.fromhex(ARGS["record"])
for payload in (record, b"\\\\xff\\\\xff\\\\xff\\\\xff" + record):
    s = socket.create_connection((host, int(port)), timeout=3)
    try:
        s.sendall(payload)
        s.settimeout(3)
        s.recv(100)
    except OSError:
        pass
    finally:
        s.close()
ctx = zmq.Context()
d = ctx.socket(zmq.DEALER)
d.setsockopt(zmq.LINGER, 0)
d.connect(ARGS["addr"])
d.send_multipart([b"", record])
RESULT = "answered" if d.poll(2000) else "no answer"
d.close()
ctx.term()
'''
run = run_stranger(ATTACK, {"addr": echo.address, "record": record.hex()})
print(json.dumps([run.result, os.path.exists(marker), echo.echo.call(7)]))
cluster.close()
"""


def test_with_the_opt_in_a_tokenless_strangers_pickle_is_never_loaded(tmp_path: Path) -> None:
    # the opt-in changes what authenticated peers may send; a stranger's bytes are still
    # never decoded (the handshake comes first)
    script = tmp_path / "driver.py"
    script.write_text(STRANGER_DRIVER)
    env = {**without_rayless(), "PYTHONPATH": str(ROOT), "RAYLESS_ALLOW_PICKLE": "1"}
    out = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == ["no answer", False, 7]
