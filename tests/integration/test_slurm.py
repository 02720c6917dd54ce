"""scripts/launch.py under a real Slurm: munge, slurmctld and two slurmd "nodes".

Each daemon runs in its own network namespace on a private bridge (tests/netns.py) under its own
host name (a UTS namespace), with an /etc/hosts that names the nodes; one slurm.conf, the
namespaces' own addresses only. srun/sbatch/scancel run here, in the root namespace, and reach
slurmctld over the bridge. Daemons, namespaces and files go in ``finally``.

Slurm set-up quirks (Debian's 22.05): slurmctld must find its own host name in SlurmctldHost
(hence the UTS namespaces), slurmd wants its spool directory to exist and a cgroup plugin that
initialises even with proctrack/linuxproc (cgroup/v1 on a hybrid hierarchy), and
``SlurmdParameters=config_overrides`` lets a 2-core machine declare 4 CPUs per node so two jobs
fit on the same nodes at once. Skips (with the reason) only where namespaces or the Slurm and
munge packages cannot be had; .ci/run installs slurm-wlm and munge.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

import rayless.actors as actors
from rayless.slurm import SlurmJob
from tests.netns import Net, cannot_make_namespaces, ns_pids
from tests.waiting import eventually_sync

# xdist_group: the SSH and Slurm tests build network namespaces and bridges (machine-wide)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(150),
    pytest.mark.xdist_group("netns"),
]

REPO = Path(__file__).resolve().parents[2]
MARK = "RAYLESS_TEST_SLURM_MARK"
TOOLS = ("slurmctld", "slurmd", "srun", "sbatch", "scancel", "sinfo", "munged", "mungekey")
DRIVER_EXIT = 3

DRIVER = f"""
import asyncio, os, sys
import rayless.actors as actors
class Where(actors.Actor):
    def where(self):
        return os.environ["RAYLESS_NODE_ID"] + "@" + os.environ["RAYLESS_NODE_IP"]

async def main(mode, go):
    cluster = await actors.connect()
    nodes = await cluster.nodes()
    handles = [await cluster.spawn(Where, node=n["node_id"]) for n in nodes]
    print("ACTORS", ",".join(sorted([await h.where() for h in handles])), flush=True)
    if mode == "hold":  # until the test says go
        while not os.path.exists(go):
            await asyncio.sleep(0.1)
    await cluster.aclose()
    return {DRIVER_EXIT}

if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")))
"""


class Where(actors.Actor):
    """Where it runs: ``node id@node address``."""

    def where(self) -> str:
        return os.environ["RAYLESS_NODE_ID"] + "@" + os.environ["RAYLESS_NODE_IP"]


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


@dataclass
class Slurm:
    """The test cluster: its directory, config, network and daemons."""

    dir: Path
    net: Net
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self, mark: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAYLESS"))}
        return {**env, "SLURM_CONF": str(self.conf), MARK: mark}

    def nodes(self) -> list[tuple[str, str]]:
        """(Slurm node name, address) of the compute nodes."""
        return list(zip(self.net.hostnames[1:], self.net.addrs[1:], strict=True))

    def leftovers(self, timeout: float = 20.0) -> list[str]:
        """Processes other than the daemons left in the namespaces (waits up to ``timeout``)."""
        keep = {d.pid for d in self.daemons}
        for d in self.daemons:  # the daemon behind each `ip netns exec` / `unshare`
            try:
                keep |= {c.pid for c in psutil.Process(d.pid).children(recursive=True)}
            except psutil.Error:
                pass

        def scan() -> list[str]:
            left = []
            for ns in self.net.names:
                for pid in ns_pids(ns) - keep:
                    try:
                        proc = psutil.Process(pid)
                        if proc.status() != psutil.STATUS_ZOMBIE:
                            left.append(f"{ns} {pid}: {' '.join(proc.cmdline())}")
                    except psutil.Error:
                        continue
            return left

        eventually_sync(lambda: not scan(), timeout=timeout, interval=0.2)
        return scan()

    def log(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.dir.glob("*.log"))
        )


def marked(mark: str) -> list[str]:
    """Live processes anywhere that carry ``mark`` in their environment."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARK) == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid}: {' '.join(proc.cmdline())}")
        except psutil.Error:
            continue
    return found


def assert_none_left(mark: str, timeout: float = 20.0) -> None:
    if not eventually_sync(lambda: not marked(mark), timeout=timeout, interval=0.2):
        left = marked(mark)
        assert left == [], "left running:\n" + "\n".join(left)


def _cannot_run() -> str | None:
    if os.geteuid() == 0:
        missing = [t for t in (*TOOLS, "unshare") if _tool(t) is None]
        if missing:
            return (
                f"Slurm/munge not installed (no {', '.join(missing)}); .ci/run installs "
                "slurm-wlm and munge"
            )
    return cannot_make_namespaces()


def _write_config(slurm: Slurm) -> None:
    d, net = slurm.dir, slurm.net
    ctl, ctl_addr = net.hostnames[0], net.addrs[0]
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={addr} CPUs=4 RealMemory=1000 State=UNKNOWN"
        for name, addr in slurm.nodes()
    )
    slurm.conf.write_text(
        f"""ClusterName=rayless
SlurmctldHost={ctl}({ctl_addr})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")  # cgroup v2 only
    plugin = "autodetect" if unified else "cgroup/v1"
    (d / "cgroup.conf").write_text(f"CgroupPlugin={plugin}\nIgnoreSystemd=yes\n")
    (d / "state").mkdir()
    for name, _ in slurm.nodes():
        (d / f"spool-{name}").mkdir()


def _wait_idle(slurm: Slurm, timeout: float = 60.0) -> None:
    states = ""

    def idle() -> bool:
        nonlocal states
        for d in slurm.daemons:
            if d.poll() is not None:
                pytest.fail(f"a Slurm daemon exited ({d.args}):\n{slurm.log()}")
        result = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            capture_output=True,
            text=True,
            timeout=30,
            env=slurm.env("-"),
        )
        states = result.stdout + result.stderr
        return result.returncode == 0 and states.count("idle") == len(slurm.nodes())

    if not eventually_sync(idle, timeout=timeout, interval=0.3):
        pytest.fail(f"the Slurm nodes did not come up: {states}\n{slurm.log()}")


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    reason = _cannot_run()
    if reason is not None:
        pytest.skip(reason)
    slurm = Slurm(dir=Path(tempfile.mkdtemp(prefix="rayless-slurm-")), net=Net.for_test("rs"))
    munged: subprocess.Popen[bytes] | None = None
    try:
        os.chmod(slurm.dir, 0o755)
        net = slurm.net
        net.up()
        for k in range(3):  # the controller, then two compute nodes
            net.add(f"{net.tag}{'ctl' if k == 0 else f'n{k:02d}'}")  # rsNNNNn01: node[01-02]
        net.write_hosts()
        _write_config(slurm)
        d = slurm.dir
        subprocess.run(["mungekey", "-c", "-k", str(d / "munge.key")], check=True, timeout=30)
        os.chmod(d / "munge.key", 0o600)
        munge_argv = ["munged", "-F", "-f", f"--socket={d}/munge.sock"]
        munge_argv += [f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid"]
        munge_argv += [f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"]
        munged = subprocess.Popen(munge_argv, stdin=subprocess.DEVNULL)

        def munge_up() -> bool:
            if munged.poll() is not None:
                pytest.fail(f"munged exited:\n{slurm.log()}")
            return (d / "munge.sock").exists()

        if not eventually_sync(munge_up, timeout=20):
            pytest.fail(f"munged did not start:\n{slurm.log()}")
        daemons = [["slurmctld", "-D", "-i", "-f", str(slurm.conf)]]
        daemons += [["slurmd", "-D", "-f", str(slurm.conf)]] * len(slurm.nodes())
        for k, argv in enumerate(daemons):
            out = open(d / f"daemon{k}.out", "wb")  # noqa: SIM115 (closed with the process)
            slurm.daemons.append(
                subprocess.Popen(
                    net.exec_in(k, argv), stdin=subprocess.DEVNULL, stdout=out, stderr=out
                )
            )
            out.close()
        _wait_idle(slurm)
        yield slurm
    finally:
        for proc in slurm.daemons:
            proc.terminate()
        for proc in slurm.daemons:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        slurm.net.teardown()  # with anything a failed test left in the namespaces
        if munged is not None:
            munged.terminate()
            try:
                munged.wait(10)
            except subprocess.TimeoutExpired:
                munged.kill()
                munged.wait()
        shutil.rmtree(slurm.dir, ignore_errors=True)
        left = [
            p
            for p in psutil.process_iter(["cmdline"])
            if str(slurm.dir) in " ".join(p.info["cmdline"] or [])
        ]
        assert left == [], f"left running: {left}"


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    path = tmp_path / "driver.py"
    path.write_text(DRIVER)
    return path


def _actors_line(slurm: Slurm) -> str:
    return "ACTORS " + ",".join(f"{name}@{addr}" for name, addr in slurm.nodes())


def test_srun_runs_a_driver_on_both_nodes(slurm: Slurm, tmp_path: Path, driver: Path) -> None:
    mark = uuid.uuid4().hex
    argv = ["srun", "-N2", "--ntasks-per-node=1", sys.executable, str(REPO / "scripts/launch.py")]
    argv += ["--token-file", str(tmp_path / "token"), "--", str(driver), "done"]
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=90, env=slurm.env(mark), cwd=tmp_path
    )
    out = result.stdout + result.stderr
    assert result.returncode == DRIVER_EXIT, out  # the driver's exit code, through srun
    assert _actors_line(slurm) in out, out  # node ids: Slurm's; addresses: the namespaces'
    match = re.search(r"all 2 nodes joined tcp://(\S+):(\d+)", out)
    assert match is not None and match.group(1) == slurm.nodes()[0][0], out
    assert_none_left(mark)
    assert slurm.leftovers() == []


def docs_sbatch_example() -> str:
    """The sbatch script of docs/launching.md's Slurm section."""
    text = (REPO / "docs" / "launching.md").read_text()
    match = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", text, re.S)
    assert match is not None, "docs/launching.md has no sbatch example"
    return match.group(1)


def _sbatch_script(tmp: Path, driver: Path, go: Path) -> Path:
    script = docs_sbatch_example()
    for old, new in {
        "#SBATCH --gpus-per-node=8\n": "",  # no GPUs (GRES) in the test cluster
        "--cpus-per-task=64": "--cpus-per-task=1",
        "source ~/proj/.venv/bin/activate": f"source {sys.prefix}/bin/activate",
        "cd ~/proj": f"cd {tmp}",
        "python scripts/launch.py": f"python {REPO}/scripts/launch.py",
        "train.py --config configs/ppo.yaml": f"{driver} hold {go}",
        "~/.rayless/": f"{tmp}/.rayless/",
    }.items():
        assert old in script, f"the docs' sbatch example changed: no {old!r}"
        script = script.replace(old, new)
    path = tmp / "job.sbatch"
    path.write_text(script)
    return path


def test_the_docs_sbatch_example_two_jobs_at_once_and_scancel(
    slurm: Slurm, tmp_path: Path, driver: Path
) -> None:
    go = tmp_path / "go"
    script = _sbatch_script(tmp_path, driver, go)
    marks, jobs, ids = [uuid.uuid4().hex, uuid.uuid4().hex], [], []
    try:
        for mark in marks:  # two jobs at once on the same two nodes
            argv = ["sbatch", "--wait", "--parsable", "-o", f"{tmp_path}/job-%j.out", str(script)]
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, text=True, env=slurm.env(mark), cwd=tmp_path
            )
            assert proc.stdout is not None
            ids.append(int(proc.stdout.readline().split(";")[0]))
            jobs.append(proc)
        outs = [tmp_path / f"job-{i}.out" for i in ids]

        def all_up() -> bool:
            if all(o.exists() and "ACTORS" in o.read_text() for o in outs):
                return True
            if any(j.poll() is not None for j in jobs):
                pytest.fail("\n".join(o.read_text() for o in outs if o.exists()) + slurm.log())
            return False

        if not eventually_sync(all_up, timeout=90, interval=0.2):
            pytest.fail("\n".join(o.read_text() for o in outs if o.exists()) + slurm.log())
        for job_id, out in zip(ids, outs, strict=True):
            text = out.read_text()
            assert _actors_line(slurm) in text, text
            port = 20000 + job_id % 10000  # the documented rule: each job its own port
            assert f"all 2 nodes joined tcp://{slurm.nodes()[0][0]}:{port}" in text, text

        # scancel stops every process of the first job on both nodes; the second one goes on
        subprocess.run(["scancel", str(ids[0])], check=True, timeout=30, env=slurm.env("-"))
        assert jobs[0].wait(60) != 0
        assert_none_left(marks[0])
        assert marked(marks[1]), "the other job went down with the cancelled one"

        go.touch()
        assert jobs[1].wait(60) == DRIVER_EXIT, outs[1].read_text()  # sbatch --wait: job's code
        assert not (tmp_path / ".rayless" / f"token-{ids[1]}").exists()  # the script's trap
        assert_none_left(marks[1])
        assert slurm.leftovers() == []
    finally:
        for job_id in ids:
            subprocess.run(["scancel", str(job_id)], timeout=30, env=slurm.env("-"))
        for proc in jobs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _slurm_job(slurm: Slurm, tmp: Path, mark: str) -> SlurmJob:
    env = {**slurm.env(mark), "PYTHONPATH": str(REPO)}  # the actors import this module
    return SlurmJob(
        nodes=2,
        sbatch_args=["--cpus-per-task=1"],
        launch_args=["--node-timeout=5", "--grace=5"],
        workdir=tmp,
        token_dir=tmp / ".rayless",
        env=env,
    )


def test_slurm_job_attaches_this_process_as_the_driver_and_cancels_at_the_end(
    slurm: Slurm, tmp_path: Path
) -> None:
    mark = uuid.uuid4().hex
    job = _slurm_job(slurm, tmp_path, mark)

    async def drive() -> list[str]:
        async with job:
            cluster = await job.connect()
            try:
                nodes = await cluster.nodes()
                handles = [await cluster.spawn(Where, node=n["node_id"]) for n in nodes]
                return sorted([await h.where() for h in handles])
            finally:
                await cluster.aclose()

    seen = asyncio.run(drive())
    assert "ACTORS " + ",".join(seen) == _actors_line(slurm), job.output_path.read_text()
    host, port = slurm.nodes()[0][1], 20000 + (job.job_id or 0) % 10000
    assert job.address == f"tcp://{host}:{port}"  # the first node's NodeAddr, the job's port
    assert not job._in_queue()  # cancelled, and gone from the queue
    assert list((tmp_path / ".rayless").iterdir()) == []  # the token went with it
    assert_none_left(mark)
    assert slurm.leftovers() == []


def test_slurm_job_is_cancelled_by_ctrl_c_in_its_block(slurm: Slurm, tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    job = _slurm_job(slurm, tmp_path, mark)
    with pytest.raises(KeyboardInterrupt), job:
        assert job.address and marked(mark)  # the cluster is up
        raise KeyboardInterrupt
    assert not job._in_queue()
    assert_none_left(mark)
    assert slurm.leftovers() == []
