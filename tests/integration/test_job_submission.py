"""Jobs handed to a running cluster: verl's and EasyR1's multi-node lines
(``ray job submit --no-wait ...`` then ``ray job logs -f``, ``status``, ``stop``) with
``rayless`` in place of ``ray``, against a ``rayless launch`` that stays up without a driver
command, and ``rayless.ray.job_submission.JobSubmissionClient`` on the same cluster. Ray's own
behaviour for the same calls: tests/integration/test_ray_parity.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.drivers import ROOT
from tests.environ import without_rayless
from tests.integration.test_job_submit import VERL_MAIN
from tests.integration.test_launch import Node, assert_none_left, free_port
from tests.waiting import eventually_sync, wait_until_sync

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(240),
    pytest.mark.xdist_group("rayless_jobs"),  # one launch for the module, its tests in order
]

TRAIN = """
import os, sys, time
from rayless import ray

ray.init()

@ray.remote
def look():
    import job_helper
    return job_helper.VALUE, os.environ.get("FROM_JOB")

print("driver", os.environ.get("FROM_JOB"), sys.argv[1:], flush=True)
print("task", *ray.get(look.remote()), flush=True)
for i in range(int(os.environ.get("STEPS", "2"))):
    print("step", i, flush=True)
    time.sleep(0.2)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


class Launched:
    """A two-node ``rayless launch`` kept up (two ranks on this host), and the environment
    that reaches it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.tmpdir = tmp / "tmp"  # the cluster's temporary directories, to look for leftovers
        self.tmpdir.mkdir()
        self.port = free_port()
        token = tmp / "job.token"
        # `python` in an entrypoint is this interpreter, as in a user's activated venv
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        self.node, self.other = (
            Node(tmp, rank, 2, self.port, "--token-file", str(token),
                 env={"TMPDIR": str(self.tmpdir), "PATH": path})
            for rank in (0, 1)
        )  # fmt: skip
        self.node.wait_for("all 2 nodes joined")
        self.env = {
            **without_rayless(),
            "PYTHONPATH": str(ROOT),
            "PATH": path,
            "RAYLESS_ADDRESS": f"127.0.0.1:{self.port}",
            "RAYLESS_TOKEN_FILE": str(token),
        }
        self.project = tmp / "project"
        self.project.mkdir()
        (self.project / "job_helper.py").write_text("VALUE = 'shipped'\n")
        (self.project / "train.py").write_text(TRAIN)

    def job(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [sys.executable, "-m", "rayless.cli", "job", *argv],
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert out.returncode == 0, f"{argv}: {out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        return out


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    cluster = Launched(tmp_path_factory.mktemp("jobs"))
    yield cluster
    for node in (cluster.node, cluster.other):
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
            node.wait()


def _running(text: str, *, exact: bool = False) -> list[psutil.Process]:
    """Live processes with ``text`` in an argument (``exact``: as an argument)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        args = proc.info["cmdline"] or ()
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if (text in args) if exact else any(text in part for part in args):
            found.append(proc)
    return found


def test_submit_no_wait_then_logs_status_stop_list_delete(launched: Launched) -> None:
    env_json = '{"working_dir": "project", "env_vars": {"FROM_JOB": "job"}}'
    out = launched.job(
        "submit", "--address=http://127.0.0.1:8265", "--no-wait",
        f"--runtime-env-json={env_json}", "--", "python", "train.py", "--lr", "0.1",
    )  # fmt: skip
    done = out.stdout.strip()
    assert done.startswith("raysubmit_") and f"rayless job logs {done}" in out.stderr
    follow = launched.job("logs", "-f", done)  # returns once the job ended
    assert follow.stdout.splitlines()[:2] == [
        "driver job ['--lr', '0.1']",
        "task shipped job",  # the job's working_dir and env_vars reach its driver's tasks
    ]
    assert "step 1" in follow.stdout
    assert launched.job("status", done).stdout.splitlines() == [
        f"Status for job '{done}': SUCCEEDED",
        "Status message: Job finished successfully.",
    ]
    # verl's trainer reads the job's config (RAY_JOB_CONFIG_JSON_ENV_VAR) and so does not set
    # a working_dir of its own beside the job's
    (launched.project / "main_ppo.py").write_text(VERL_MAIN)
    out = launched.job(
        "submit", "--no-wait", f"--runtime-env-json={env_json}", "--", "python", "main_ppo.py"
    )  # fmt: skip
    verl = launched.job("logs", "-f", out.stdout.strip()).stdout.splitlines()
    assert verl[-1] == "True shipped true", verl

    long_env = '{"working_dir": "project", "env_vars": {"STEPS": "1000"}}'
    out = launched.job(
        "submit", "--no-wait", "--submission-id", "long-one", f"--runtime-env-json={long_env}",
        "--", "python", "train.py", "mark-long-one",
    )  # fmt: skip
    assert out.stdout.strip() == "long-one"
    wait_until_sync(
        lambda: "step 2" in launched.job("logs", "long-one").stdout, 120, "the job's steps"
    )
    assert _running("mark-long-one")
    taken = launched.job("submit", "--no-wait", "--submission-id", "long-one", "--", "true",
                         check=False)  # fmt: skip
    assert taken.returncode == 1 and "already exists" in taken.stderr
    busy = launched.job("delete", "long-one", check=False)
    assert busy.returncode == 1 and "non-terminal state RUNNING" in busy.stderr
    stop = launched.job("stop", "long-one")
    assert "Job 'long-one' was stopped" in stop.stdout
    assert "STOPPED" in launched.job("status", "long-one").stdout
    # the entrypoint and its driver's task workers are gone (its session ended with it)
    assert eventually_sync(lambda: not _running("mark-long-one"), timeout=30)

    listed = launched.job("list").stdout.splitlines()
    assert f"{done}\tSUCCEEDED\tpython train.py --lr 0.1" in listed
    assert "long-one\tSTOPPED\tpython train.py mark-long-one" in listed
    assert (
        launched.job("delete", "long-one").stdout.strip() == "Job 'long-one' deleted successfully"
    )
    gone = launched.job("status", "long-one", check=False)
    assert gone.returncode == 1 and "Job long-one does not exist." in gone.stderr


def test_the_client_api_on_a_launched_cluster(launched: Launched) -> None:
    env = {**os.environ, "RAYLESS_TOKEN_FILE": launched.env["RAYLESS_TOKEN_FILE"]}
    code = f"""
import asyncio, sys
from rayless.ray.job_submission import JobSubmissionClient, JobStatus
client = JobSubmissionClient("127.0.0.1:{launched.port}")
sid = client.submit_job(entrypoint="echo out; echo err >&2; exit 3", metadata={{"k": "v"}})
async def tail():
    return "".join([text async for text in client.tail_job_logs(sid)])
print("TAIL", repr(asyncio.run(tail())))
info = client.get_job_info(sid)
print("INFO", info.status, info.driver_exit_code, info.error_type, info.metadata)
print("NODE", info.driver_node_id)
print("MESSAGE", repr(info.message))
print("STATUS", client.get_job_status(sid) is JobStatus.FAILED, client.stop_job(sid))
print("DELETE", client.delete_job(sid), sid in [j.submission_id for j in client.list_jobs()])
try:
    client.get_job_logs(sid)
except RuntimeError as exc:
    print("GONE", str(exc) == f"Job {{sid}} does not exist.")
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] in ("TAIL 'out\\nerr\\n'", "TAIL 'err\\nout\\n'")
    assert lines[1] == "INFO FAILED 3 JOB_ENTRYPOINT_COMMAND_ERROR {'k': 'v'}"
    assert lines[2] == "NODE n0"  # the head's node, as Ray's entrypoints run there
    assert lines[3].startswith("MESSAGE 'Job entrypoint command failed with exit code 3, last")
    assert lines[4:] == ["STATUS True False", "DELETE True False", "GONE True"]


def test_a_killed_supervisor_takes_its_entrypoint_along(launched: Launched) -> None:
    # the entrypoint and a child of its own: the kernel ends the first with the supervisor
    # (PR_SET_PDEATHSIG), the node agent (a subreaper) the orphaned second
    child = "import time; time.sleep(300)"
    entry = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}, 'mark-c'])"
    out = launched.job("submit", "--no-wait", "--submission-id", "doomed", "--",
                       "python", "-c", f'"{entry}"', "mark-doomed")  # fmt: skip
    assert out.stdout.strip() == "doomed"
    wait_until_sync(lambda: _running("mark-c", exact=True), 60, "the entrypoint's child")
    (entrypoint,) = _running("mark-doomed", exact=True)
    supervisor = entrypoint.parent()  # above the shell the entrypoint may run in
    while supervisor is not None and "mark-doomed" in " ".join(supervisor.cmdline()):
        supervisor = supervisor.parent()
    assert supervisor is not None and supervisor.pid != os.getpid()
    supervisor.kill()
    assert eventually_sync(
        lambda: not _running("mark-doomed", exact=True) and not _running("mark-c", exact=True),
        timeout=30,
    )
    # its log and token file: the node agent's sweep removes what a dead owner left
    mine = f"rayless-job-{supervisor.pid}-"
    assert eventually_sync(
        lambda: not [d for d in os.listdir(launched.tmpdir) if d.startswith(mine)], timeout=30
    ), os.listdir(launched.tmpdir)
    # its record went with it: the job is unknown (Ray keeps it as FAILED in its GCS)
    assert eventually_sync(
        lambda: (
            "Job doomed does not exist." in launched.job("status", "doomed", check=False).stderr
        ),
        timeout=30,
    )


def test_stopping_the_cluster_leaves_no_job_behind(launched: Launched) -> None:
    launched.job("submit", "--no-wait", "--", "sleep 300; echo mark-at-end")
    assert _running("mark-at-end")
    launched.node.proc.send_signal(signal.SIGTERM)
    assert launched.node.wait() == 128 + signal.SIGTERM
    assert launched.other.wait() == 0  # the head shut the cluster down
    assert_none_left(launched.node.mark, launched.other.mark)
    assert not _running("mark-at-end")
    assert eventually_sync(
        lambda: not [p for p in os.listdir(launched.tmpdir) if p.startswith("rayless-job-")],
        timeout=15,
    ), os.listdir(launched.tmpdir)
