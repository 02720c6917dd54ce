"""``rayless k8s manifest``'s pods without Kubernetes: each "pod" is a network namespace.

No Kubernetes cluster can run here, so this test plays the kubelet: for every pod the manifests
describe (a JobSet's leader and workers, or an Indexed Job's indices) it makes a network
namespace on a private bridge (tests/netns.py) and starts the container's command there, as
PID 1 of its own UTS and mount namespaces, with exactly what a kubelet gives a container:

* the environment: the container's ``env`` from the manifest, ``JOB_COMPLETION_INDEX`` (the
  Job controller's), ``KUBERNETES_SERVICE_HOST``/``_PORT``, ``HOSTNAME``, ``PATH``, ``HOME``;
* the host name ``<job>-<index>`` (JobSet: ``<jobset>-<replicatedJob>-<jobIndex>-<index>``);
* DNS names through each namespace's hosts file: every pod's ``<host>.<subdomain>`` and
  ``<host>.<subdomain>.<namespace>.svc.cluster.local``, as the headless Service publishes them;
* the Secret mounted read-only at the manifest's ``mountPath`` in the kubelet's layout
  (``token -> ..data/token``, ``..data -> ..<timestamp>``, the file 0400 root), under a
  ``/var/run`` of the pod's own (a tmpfs in its mount namespace, as a container's image has
  its own): nothing is made on the host, where another test's pods would share it.

Deleting a pod is what the kubelet does: SIGTERM to PID 1, up to
``terminationGracePeriodSeconds``, then SIGKILL to what is left and the namespace goes. Skips
(with the reason) where network namespaces cannot be had (not root, no iproute2).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rayless import k8s
from tests.netns import Net, cannot_make_namespaces, ns_pids, sh
from tests.waiting import eventually_sync, scaled, wait_until_sync

# xdist_group: the SSH, Slurm and pod tests build network namespaces and bridges (machine-wide)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.xdist_group("netns"),
]

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "scripts" / "rl_pipeline.py")
NAMESPACE = "default"
# Each pod's own /var/run (the Secret's mountPath lies under it): a tmpfs in its mount namespace.
POD_RUN = os.path.realpath("/var/run")

REJOIN_DRIVER = """
import asyncio, os, sys
import rayless.actors as actors

class Where(actors.Actor):
    def where(self):
        return os.environ["RAYLESS_NODE_ID"] + "@" + os.environ["RAYLESS_NODE_IP"]

async def where(cluster, node):
    handle = await cluster.spawn(Where, node=node)
    try:
        return await handle.where()
    finally:
        await cluster.kill(handle)

async def main(go, old):
    cluster = await actors.connect()
    nodes = sorted(n["node_id"] for n in await cluster.nodes())
    print("ACTORS", ",".join([await where(cluster, n) for n in nodes]), flush=True)
    while not os.path.exists(go):  # the test deletes the worker pod and starts its replacement
        await asyncio.sleep(0.2)
    while True:  # until the replacement has registered under the same node id
        try:
            found = await where(cluster, "ppo-1")
        except actors.RaylessError:
            found = ""
        if found and not found.endswith("@" + old):
            print("REJOINED", found, flush=True)
            break
        await asyncio.sleep(0.2)
    await cluster.aclose()
    return 0

if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2])))
"""


@dataclass
class Pod:
    """One pod as the kubelet would run it."""

    hostname: str
    subdomain: str
    env: dict[str, str]
    command: list[str]
    mount: str
    secret: str
    mode: int
    ns: str = ""
    addr: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""


def pods_of(objects: list[dict[str, Any]]) -> list[Pod]:
    """The pods a JobSet or an Indexed Job of ``objects`` makes, rank order."""
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    top = objects[-1]
    name = top["metadata"]["name"]
    jobs: list[tuple[str, int, dict[str, Any], str]] = []  # (host prefix, job spec, subdomain)
    if top["kind"] == "JobSet":
        subdomain = top["spec"].get("network", {}).get("subdomain", name)
        for rjob in top["spec"]["replicatedJobs"]:
            for j in range(rjob.get("replicas", 1)):
                prefix = f"{name}-{rjob['name']}-{j}"
                jobs.append((prefix, 0, rjob["template"]["spec"], subdomain))
    else:
        spec = top["spec"]
        jobs.append((name, 0, spec, spec["template"]["spec"]["subdomain"]))
    pods = []
    for prefix, _, spec, subdomain in jobs:
        pod_spec = spec["template"]["spec"]
        (container,) = pod_spec["containers"]
        (volume,) = pod_spec["volumes"]
        (mount,) = container["volumeMounts"]
        secret = secrets[volume["secret"]["secretName"]]["stringData"]["token"]
        for index in range(spec["completions"]):
            hostname = f"{prefix}-{index}"
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": "/root",
                "HOSTNAME": hostname,
                "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                "KUBERNETES_SERVICE_PORT": "443",
                "JOB_COMPLETION_INDEX": str(index),
            }
            env.update({e["name"]: e["value"] for e in container["env"]})
            pods.append(
                Pod(
                    hostname=hostname,
                    subdomain=subdomain,
                    env=env,
                    command=container["command"],
                    mount=mount["mountPath"],
                    secret=secret,
                    mode=volume["secret"]["defaultMode"],
                )
            )
    return pods


def secret_volume(root: Path, token: str, mode: int) -> Path:
    """A Secret volume in the kubelet's layout (the file owned by root, this test's uid)."""
    data = root / "..2026_12_06_05_00_00.000000001"
    data.mkdir(parents=True)
    (data / "token").write_text(token)
    os.chmod(data / "token", mode)
    os.symlink(data.name, root / "..data")
    os.symlink("..data/token", root / "token")
    return root


@dataclass
class Cluster:
    """The "kubelet": the namespaces of a job's pods and their processes."""

    net: Net
    tmp: Path
    pods: list[Pod] = field(default_factory=list)

    def start(self, objects: list[dict[str, Any]], late: tuple[int, ...] = ()) -> None:
        """Make the pods' namespaces and start every pod but those in ``late`` (not scheduled
        yet: no process, no DNS name; :meth:`run` starts one later)."""
        self.pods = pods_of(objects)
        for pod in self.pods:
            self.place(pod)
        for k in range(len(self.pods)):
            if k not in late:
                self.run(k)
        self.write_hosts()

    def place(self, pod: Pod) -> None:
        """A new namespace (and address) for ``pod``, with a default route as a pod has."""
        pod.ns = self.net.add(pod.hostname)
        pod.addr = self.net.addrs[-1]
        sh("ip", "-n", pod.ns, "route", "add", "default", "via", f"{self.net.subnet}.1")

    def write_hosts(self) -> None:
        """Every namespace's hosts file: the DNS names of the pods that run (a headless
        Service publishes a pod's names once it has an address)."""
        lines = ["127.0.0.1 localhost"]
        for pod in self.pods:
            if pod.proc is None:
                continue
            fqdn = f"{pod.hostname}.{pod.subdomain}.{NAMESPACE}.svc.cluster.local"
            lines.append(f"{pod.addr} {pod.hostname}.{pod.subdomain} {fqdn} {pod.hostname}")
        for pod in self.pods:
            os.makedirs(f"/etc/netns/{pod.ns}", exist_ok=True)
            Path(f"/etc/netns/{pod.ns}/hosts").write_text("\n".join(lines) + "\n")  # in place

    def run(self, k: int) -> None:
        """Start pod ``k``'s container: its own host name and mounts, the Secret read-only."""
        pod = self.pods[k]
        volume = secret_volume(self.tmp / f"secret-{k}-{os.urandom(3).hex()}", pod.secret, pod.mode)
        script = (
            'mount -t tmpfs -o mode=0755 pod-run "$3" && mkdir -p "$2" && mount --bind "$1" "$2" '
            '&& mount -o remount,bind,ro "$2" && hostname "$0" && shift 3 && exec "$@"'
        )
        argv = ["ip", "netns", "exec", pod.ns, "unshare", "--uts", "--mount", "sh", "-c", script]
        argv += [pod.hostname, str(volume), pod.mount, POD_RUN, *pod.command]
        pod.log = self.tmp / f"{pod.hostname}.log"
        os.makedirs(f"/etc/netns/{pod.ns}", exist_ok=True)
        Path(f"/etc/netns/{pod.ns}/hosts").touch()  # `ip netns exec` mounts it over /etc/hosts
        with open(pod.log, "ab") as log:
            pod.proc = subprocess.Popen(
                argv, env=pod.env, cwd=self.tmp, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self.write_hosts()

    def replace(self, k: int) -> None:
        """The Job controller's replacement of pod ``k``: same host name, a new namespace and
        address (the DNS names follow)."""
        self.place(self.pods[k])
        self.run(k)

    def delete(self, k: int, grace: float) -> int | None:
        """Delete pod ``k`` as the kubelet does: SIGTERM to PID 1, ``grace`` seconds, SIGKILL
        to the rest, the namespace gone. Returns PID 1's exit code (None: it was killed)."""
        pod = self.pods[k]
        assert pod.proc is not None
        pod.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = pod.proc.wait(grace)
        except subprocess.TimeoutExpired:
            code = None
        for pid in ns_pids(pod.ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if code is None:
            pod.proc.wait(10)
        subprocess.run(["ip", "netns", "del", pod.ns], capture_output=True, timeout=30)
        return code

    def left(self) -> dict[str, list[int]]:
        """Processes still in each pod's namespace (after waiting up to 20 s for them)."""

        def scan() -> dict[str, list[int]]:
            return {p.hostname: sorted(ns_pids(p.ns)) for p in self.pods if ns_pids(p.ns)}

        eventually_sync(lambda: not scan(), timeout=20, interval=0.3)
        return scan()

    def outputs(self) -> str:
        return "\n".join(f"== {p.hostname}\n{p.output()[-4000:]}" for p in self.pods)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    reason = cannot_make_namespaces()
    if reason is None and shutil.which("unshare") is None:
        reason = "util-linux's unshare is not installed"
    if reason is not None:
        pytest.skip(reason)
    assert k8s.TOKEN_DIR.startswith("/var/run/"), k8s.TOKEN_DIR  # under each pod's POD_RUN
    os.chmod(tmp_path, 0o755)
    cluster = Cluster(net=Net.for_test("rk"), tmp=tmp_path)
    try:
        cluster.net.up()
        yield cluster
    finally:
        for pod in cluster.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                pod.proc.kill()
                pod.proc.wait()
        cluster.net.teardown()


def demo_job(layout: k8s.Layout, iterations: int, tmp: Path) -> k8s.K8sJob:
    """Two pods of 2 fake GPUs each running the PPO demo's driver (scripts/rl_pipeline.py)."""
    return k8s.K8sJob(
        name="ppo",
        nodes=2,
        image="unused",
        layout=layout,
        python=sys.executable,
        launch_args=["--fake-gpus=2", "--node-timeout=5", "--grace=5"],
        command=[DEMO, "--iterations", str(iterations), "--output-dir", str(tmp / "out")],
    )


def test_a_jobset_runs_the_ppo_demo_and_rank_0s_code_is_the_jobs(
    cluster: Cluster, tmp_path: Path
) -> None:
    job = demo_job(k8s.Layout.JOBSET, 2, tmp_path)
    cluster.start(job.manifests(), late=(0,))  # the worker first: the leader is not scheduled
    leader, worker = cluster.pods
    assert worker.proc is not None
    # the worker waits for the leader's DNS name and port; then the leader's pod starts
    wait_until_sync(
        lambda: "actor logs in" in worker.output(), timeout=30, what="the worker's launch"
    )
    assert worker.proc.poll() is None, cluster.outputs()
    cluster.run(0)
    assert leader.hostname == "ppo-leader-0-0" and worker.hostname == "ppo-workers-0-0"
    assert leader.proc is not None and worker.proc is not None
    try:
        code = leader.proc.wait(scaled(200))
        worker_code = worker.proc.wait(scaled(30))
    except subprocess.TimeoutExpired:
        pytest.fail("the pods did not finish:\n" + cluster.outputs())
    out = cluster.outputs()
    # the demo's own code (2: 2 iterations do not solve CartPole) is the leader pod's, so the
    # JobSet's (its successPolicy targets the leader); the worker ends with the cluster: 0
    assert (code, worker_code) == (2, 0), out
    port = k8s.pod_env.master_port(job.master)
    assert f"all 2 nodes joined tcp://{job.master}:{port}" in leader.output(), out
    assert "placed" in leader.output() and "it   2/2" in leader.output(), out
    assert cluster.left() == {}


def test_deleting_a_worker_pod_mid_run_fails_the_indexed_job(
    cluster: Cluster, tmp_path: Path
) -> None:
    job = demo_job(k8s.Layout.JOB, 500, tmp_path)
    cluster.start(job.manifests())
    rank0, rank1 = cluster.pods
    assert (rank0.hostname, rank1.hostname) == ("ppo-0", "ppo-1")
    assert rank0.proc is not None
    wait_until_sync(
        lambda: "it   1/500" in rank0.output() or rank0.proc.poll() is not None,  # type: ignore[union-attr]
        timeout=200,
        what="the demo's first iteration",
        interval=0.5,
    )
    assert rank0.proc.poll() is None, cluster.outputs()
    # the kubelet deletes pod ppo-1: its launch stops everything of ours within the grace
    code = cluster.delete(1, grace=job.grace_s)
    assert code == 128 + signal.SIGTERM, cluster.outputs()
    try:
        code0 = rank0.proc.wait(scaled(60))
    except subprocess.TimeoutExpired:
        pytest.fail("rank 0 did not end after its worker was lost:\n" + cluster.outputs())
    out = cluster.outputs()
    # documented: the demo names the dead worker and exits 1; rank 0's pod fails with it, and
    # the Job (backoffLimit 0) fails
    assert code0 == 1, out
    # the pod held workers and a storage unit: the demo names whichever loss it met first
    died = rank0.output()
    assert "a worker died" in died or ("storage unit" in died and "is lost" in died), out
    assert cluster.left() == {}


def test_a_replaced_worker_pod_rejoins_under_its_node_id(cluster: Cluster, tmp_path: Path) -> None:
    driver, go = tmp_path / "driver.py", tmp_path / "go"
    driver.write_text(REJOIN_DRIVER)
    job = k8s.K8sJob(
        name="ppo",
        nodes=2,
        image="unused",
        layout=k8s.Layout.JOB,
        max_restarts=1,  # the Job may replace one failed pod
        python=sys.executable,
        launch_args=["--node-timeout=5", "--grace=5"],
        command=[str(driver), str(go), f"{cluster.net.subnet}.11"],  # ppo-1's first address
    )
    cluster.start(job.manifests())
    rank0, rank1 = cluster.pods
    assert rank0.proc is not None and rank1.addr == f"{cluster.net.subnet}.11"
    wait_until_sync(
        lambda: "ACTORS" in rank0.output() or rank0.proc.poll() is not None,  # type: ignore[union-attr]
        timeout=90,
        what="the driver's first actors",
        interval=0.3,
    )
    ids = f"ppo-0@{rank0.addr},ppo-1@{rank1.addr}"
    assert f"ACTORS {ids}" in rank0.output(), cluster.outputs()
    assert cluster.delete(1, grace=job.grace_s) == 128 + signal.SIGTERM, cluster.outputs()
    cluster.replace(1)  # backoffLimit 1: the Job controller starts a new pod ppo-1
    assert rank1.addr != f"{cluster.net.subnet}.11"
    go.touch()
    try:
        code0 = rank0.proc.wait(scaled(90))
        code1 = rank1.proc.wait(scaled(30))  # type: ignore[union-attr]
    except subprocess.TimeoutExpired:
        pytest.fail("the job did not finish:\n" + cluster.outputs())
    out = cluster.outputs()
    assert f"REJOINED ppo-1@{rank1.addr}" in rank0.output(), out
    assert (code0, code1) == (0, 0), out  # both pods succeed: the Job completes
    assert cluster.left() == {}
